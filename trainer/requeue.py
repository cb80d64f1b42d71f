"""Stopping for a requeue: a batch job about to hit its time limit is sent a signal (Slurm's `--signal`, passed on by
ddpctl's batch script, docs/guides/slurm.md); the trainer then finishes the step it is in, the ranks agree on the
step at which all of them stop, a snapshot of that exact point is saved, and the process ends with status 0. The job
is requeued and the next allocation resumes from that snapshot, as if it had never stopped.

Armed only where the job says so, through the environment the batch script sets:
- DDPCTL_REQUEUE_SIGNAL: the signal's name (USR1); unset, the trainer leaves every signal as it was.
- DDPCTL_REQUEUE_FLAG: a file the batch script creates when the signal came (before passing it on): a rank that
  started after the signal (torch's import takes seconds) still learns of it when it arms.
- DDPCTL_REQUEUE_MARK: a file every rank creates once its part of the snapshot is saved: the job is requeued only
  when it exists (a run that finished as the signal came leaves none, and is not run again).

The ranks agree every STOP_CHECK_STEPS steps (one all-reduce of one integer), and at every epoch's end."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

SIGNAL_ENV, FLAG_ENV, MARK_ENV = "DDPCTL_REQUEUE_SIGNAL", "DDPCTL_REQUEUE_FLAG", "DDPCTL_REQUEUE_MARK"
STOP_CHECK_STEPS = 10
STRATEGIES = ("ddp",)  # the strategies that stop and resume mid-epoch (the others' own loops do not)


class StopRequest:
    """Whether this process was asked to stop for a requeue (set by the signal's handler)."""

    def __init__(self, signal_name: str, flag_file: str | None) -> None:
        self.signal_name = signal_name
        self.flag_file = flag_file
        self.asked = False

    def arm(self) -> None:
        signum = getattr(signal, f"SIG{self.signal_name.removeprefix('SIG')}", None)
        if not isinstance(signum, signal.Signals):
            raise ValueError(f"{SIGNAL_ENV}={self.signal_name!r} is not a signal name (e.g. USR1)")
        signal.signal(signum, self._on_signal)
        if self.flag_file and Path(self.flag_file).exists():  # it came before this process could listen
            self.asked = True

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.asked and os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"trainer: {signal.Signals(signum).name} received: the job stops at its time limit; saving a "
                  "snapshot at the next step the ranks agree on, to resume from it when requeued",
                  file=sys.stderr, flush=True)
        self.asked = True


class StoppedForRequeue(Exception):
    """Raised once the snapshot of the stopping point is saved on every node: the process ends with status 0."""

    def __init__(self, epoch: int, step: int, steps_per_epoch: int) -> None:
        super().__init__(f"stopped for a requeue in epoch {epoch} after step {step}/{steps_per_epoch}; the snapshot "
                         "of this point is saved and the next allocation resumes from it")
        self.epoch, self.step = epoch, step


_current: StopRequest | None = None


def arm_from_environment() -> StopRequest | None:
    """Install the handler when the job asks for it (DDPCTL_REQUEUE_SIGNAL); the request, or None."""
    global _current
    name = os.environ.get(SIGNAL_ENV)
    if not name:
        return None
    _current = StopRequest(name, os.environ.get(FLAG_ENV))
    _current.arm()
    return _current


def disarm() -> None:
    """Ignore the signal again before the process ends: CPython's shutdown puts a handler it installed back to
    the default action (which ends the process, with a status torchrun reports as a failure), not to the ignored
    disposition the process started with."""
    if _current is not None:
        signum = getattr(signal, f"SIG{_current.signal_name.removeprefix('SIG')}", None)
        if isinstance(signum, signal.Signals):
            signal.signal(signum, signal.SIG_IGN)


def ask_for_requeue() -> None:
    """Say that this process stopped for the signal, its snapshot saved: the job is to run again (the mark file
    of the job's environment; nothing without one)."""
    mark = os.environ.get(MARK_ENV)
    if mark:
        Path(mark).touch()


def current() -> StopRequest | None:
    return _current
