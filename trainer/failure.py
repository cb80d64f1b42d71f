"""Leaving promptly when this rank fails, and saying why even on a full disk.

A rank that raises must not wait for its peers: the old teardown (a barrier, then destroy) met peers that were
inside another collective, and every rank then waited for gloo's 30-minute timeout. Measured here (two torchrun
agents, one worker each, gloo): a failing rank that enters a barrier in its teardown hangs both for good; one that
ends its process instead closes its gloo connections, and the peer's pending all-reduce fails with "Connection
closed by peer" within about 0.2 s, so both agents end within seconds. So a failing rank aborts its process group
and ends its process at once (`leave`).

Its reason goes to stderr (torchrun's capture), and also into a small file reserved when the rank starts
(`reserve`): OUT/failures/rank-NNNNN.txt, RESERVED_BYTES written ahead, so that overwriting it needs no new
space on a disk that has since filled up. The launcher reads these files back (launcher/remote/node_report.py);
on a clean end they are removed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from trainer.errors import TrainerError

FAILURE_DIR = "failures"
RESERVED_BYTES = 4096
_MAX_MESSAGE = RESERVED_BYTES - 64


class FailureNote:
    """A file of RESERVED_BYTES written ahead; `write` overwrites it in place (no new blocks needed)."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.rank = rank
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(self.fd, b"\0" * RESERVED_BYTES)
            os.fsync(self.fd)
        except OSError:
            os.close(self.fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")[:_MAX_MESSAGE] + b"\n"
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))  # shrinking frees blocks, never needs one
        os.fsync(self.fd)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):  # the last rank to end cleanly removes the folder
            self.path.parent.rmdir()


_note: FailureNote | None = None


def note_path(out_dir: Path, rank: int) -> Path:
    """Where global rank `rank` keeps its failure note."""
    return out_dir / FAILURE_DIR / f"rank-{rank:05d}.txt"


def reserve(out_dir: Path, rank: int) -> None:
    """Reserve this rank's failure note (a disk already too full for it only loses the note, not the run)."""
    global _note
    if _note is not None:
        _note.discard()
    try:
        _note = FailureNote(note_path(out_dir, rank), rank)
    except OSError:
        _note = None


def discard() -> None:
    """A clean end: remove this rank's (empty) note."""
    global _note
    if _note is not None:
        _note.discard()
        _note = None


def describe(exc: BaseException) -> str:
    """One line naming the error: a TrainerError's own message, else its type and text."""
    if isinstance(exc, TrainerError):
        return str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def exit_code(exc: BaseException) -> int:
    """2 for a TrainerError (contracts: bad options and data), SystemExit's own code, 130 for Ctrl-C, else 1."""
    if isinstance(exc, TrainerError):
        return 2
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def leave(exc: BaseException) -> int:
    """Report `exc` and, when a process group is up, abort it and end this process now (never returns then).

    Without a process group nothing waits on this rank: the exit code is returned for main() to use."""
    code = exit_code(exc)
    stopped = isinstance(exc, SystemExit)  # torchrun's SIGTERM: another rank's failure or a stop, not ours
    if not stopped:
        line = describe(exc)
        if not isinstance(exc, TrainerError):
            with contextlib.suppress(Exception):
                traceback.print_exception(exc, file=sys.stderr)
        with contextlib.suppress(Exception):
            print(f"error: {line}", file=sys.stderr, flush=True)
        if _note is not None:
            with contextlib.suppress(OSError):
                _note.write(f"{time.time():.3f} rank {_note.rank}: {line}")
    if not _group_initialized():
        return code
    _abort_group()
    exit_without_teardown(code)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process with `code` now, its streams flushed, without Python's teardown, which could wait on peers."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _group_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _abort_group() -> None:
    """Abort the default process group where torch offers it (its connections close with the process anyway)."""
    from torch.distributed import distributed_c10d

    abort = getattr(distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        with contextlib.suppress(Exception):
            abort()
