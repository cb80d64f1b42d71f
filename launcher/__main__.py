"""`python -m launcher`: the ddpctl command, as the installed `ddpctl` script runs it."""

from launcher.cli.app import main

main()
