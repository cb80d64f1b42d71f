from launcher.cli.app import main

main()
