"""Runs on a host (standard library only; sent as source ahead of the script that uses it): leave the SSH session
and go on working in the background. The rendezvous reservation (launcher/planning/rdzv_reservation.py) and the
Vast.ai autostop watchdog (launcher/places/vast/autostop.py) both detach with it."""

import os
import sys


def detach(answer: str) -> None:
    """The parent prints `answer` (the line the launcher reads) and exits 0; the child goes on in a session of its
    own, its standard streams on /dev/null, so the SSH channel closes while it works."""
    sys.stdout.flush()
    if os.fork():
        print(answer)
        sys.exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
