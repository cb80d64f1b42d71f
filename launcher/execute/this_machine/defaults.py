"""What `up` assumes for this machine's run when an option is not given, apart from the run itself (run.py): the
command line reads it for every place, and importing the local executor to learn it cost every remote `up` its
start-up time."""

from __future__ import annotations

import sys


def default_python(here: bool) -> str:
    """--python when none is given: here (a place whose run is this machine's), the interpreter running ddpctl (its
    torch, whether or not its venv is activated); on hosts, their python3."""
    return sys.executable if here else "python3"
