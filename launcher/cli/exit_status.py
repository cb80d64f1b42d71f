"""How a ddpctl command ends: its last line on stderr and its documented exit status, even when the terminal or
pipe it writes to is gone.

A closed terminal hangs up (SIGHUP) and then fails every write with EIO; a closed pipe (`ddpctl logs -f | head`)
fails them with EPIPE. Left alone, the OSError of printing the last line replaces the status with 1 (and a
traceback nobody can read), and Python's own flush of stdout at exit turns any status into 120. The record of
what happened is the run's events.jsonl, not the terminal, so here a write that cannot be made is dropped.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from typing import NoReturn, TextIO

# The status of a command whose output was cut off with no stop signal (a closed pipe; a terminal gone while
# SIGHUP is ignored): 1, as click itself exits, silently, on a closed pipe.
OUTPUT_GONE_STATUS = 1
# An interruption (Ctrl-C, SIGTERM, SIGHUP): errors.Interrupted's status, as docs/guides/when-things-go-wrong.md says.
INTERRUPTED_STATUS = 130


def say(line: str) -> None:
    """Print one line on stderr; a terminal or pipe that is gone is not an error (the run's events keep it)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def exit_with(status: int) -> NoReturn:
    """Exit with `status` whatever state stdout and stderr are in: a stream that cannot be flushed is pointed at
    /dev/null first, so that Python's flush at exit cannot fail and change the status to 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            _discard(stream)
    sys.exit(status)


def output_gone() -> bool:
    """Whether stdout or stderr can no longer be written: a hung-up terminal or a pipe nobody reads."""
    return any(_hung_up(stream) for stream in (sys.stdout, sys.stderr))


def _hung_up(stream: TextIO | None) -> bool:
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError):
        return True  # closed or detached
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poller.poll(0))


def _discard(stream: TextIO | None) -> None:
    """Point the stream's file descriptor at /dev/null: what it still buffers is then dropped without an error."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
        stream.flush()


def finish_output() -> None:
    """After a command that succeeded: flush what it printed; output that cannot be delivered (the reader is
    gone) ends it with OUTPUT_GONE_STATUS, not Python's 120 at exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            exit_with(OUTPUT_GONE_STATUS)
