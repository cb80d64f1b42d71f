"""paramiko reads a file ahead in a thread of its own (SFTPFile.prefetch). When the connection closes under it (a
Ctrl-C closes every connection while a pull copies; sshd killed), that thread's exception reaches
threading.excepthook, which prints a traceback before ddpctl's one outcome line. The copy that asked for the data
fails on the same closed connection and says so, so the thread's own failure is dropped; any other thread's is
shown as before."""

from __future__ import annotations

import threading
import traceback
from types import TracebackType

_installed = threading.Lock()
_done: list[bool] = []


def is_prefetch_failure(exc_type: type[BaseException], tb: TracebackType | None) -> bool:
    """Whether an exception escaped paramiko's prefetch thread because its connection went (EOFError, OSError,
    paramiko's SSHException: an Exception from sftp_file.py's _prefetch_thread)."""
    if not issubclass(exc_type, Exception):
        return False
    frames = traceback.extract_tb(tb) if tb is not None else []
    return any(f.name == "_prefetch_thread" and f.filename.endswith("sftp_file.py") for f in frames)


def quiet_prefetch_failures() -> None:
    """Drop the prefetch threads' failures from threading.excepthook (once per process; others are passed on)."""
    with _installed:
        if _done:
            return
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if not is_prefetch_failure(args.exc_type, args.exc_traceback):
                previous(args)

        threading.excepthook = hook
        _done.append(True)
