"""An interruption before torchrun starts on any host (Ctrl-C, SIGTERM or SIGHUP while connecting, probing, or
shipping the image or the code), or a ship that fails: nothing runs anywhere, and the user is told so in one line.

What stays is decided by the rule "nothing half-written": a run directory this `up` made holds only its plan at
that point, so it is removed (the run id stays free for the same command again); one a provider made before
(Vast.ai records the machines it rented there) is kept and named, with the interruption in its events. What was
already copied to a host's workspace is left there (no process runs in it; it is only code).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from launcher.errors import DdpctlError, Interrupted
from launcher.execute.following import interruption
from launcher.results.rundir import RunDir

NOTHING_STARTED = "nothing was started on any host"


@contextmanager
def nothing_started_if_interrupted(phase: str, run_dir: RunDir | None = None, keep_run_dir: bool = False,
                                   kept_because: str = "", failures_too: bool = False) -> Iterator[None]:
    """Inside, an interruption becomes Interrupted with one line: what was being done (`phase`, e.g. "shipping
    the code to the hosts"), that nothing was started, and what became of the run directory (removed, or with
    `keep_run_dir` kept and recorded, `kept_because` saying why). With `failures_too`, a DdpctlError (a ship that
    failed) is dealt with the same way: its message gains a last line saying so."""
    try:
        yield
    except BaseException as exc:
        if failures_too and isinstance(exc, DdpctlError) and not isinstance(exc, Interrupted):
            fate = interrupted_line(phase, run_dir, keep_run_dir, kept_because, cause=None)
            exc.args = (f"{exc}\n{fate}",)  # the same error (its type and fields kept), told what became of the run
            raise
        if not interruption.interrupted_by(exc):
            raise
        raise Interrupted(interrupted_line(phase, run_dir, keep_run_dir, kept_because)) from None


def interrupted_line(phase: str, run_dir: RunDir | None, keep_run_dir: bool, kept_because: str = "",
                     cause: str | None = "") -> str:
    """Deal with the run directory as the module docstring says and return the line that tells the user (`cause`
    None: a failure, not an interruption)."""
    if cause == "":
        cause = interruption.last_cause()
    said = (f"interrupted by {cause} while {phase}: {NOTHING_STARTED}" if cause is not None
            else f"{phase} failed: {NOTHING_STARTED}")
    if run_dir is None:
        return f"{said}; no run directory was made"
    if not keep_run_dir:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        if not run_dir.path.exists():
            return f"{said}; no run directory kept (it held only the plan)"
        return f"{said}; the run directory {run_dir.path} could not be removed: delete it"
    text = f"{said}; the run directory {run_dir.path} is kept" + (f" ({kept_because})" if kept_because else "")
    run_dir.event("interrupted" if cause is not None else "not_started", reason=cause, phase=phase, started=False)
    # Nothing ran, so nothing is left to pull: the outcome is whole (a provider reads `pulled` to decide whether
    # its machines still hold results).
    run_dir.event(interruption.OUTCOME_EVENT, text=text, stopped=True, pulled=True, left_running=[], started=False)
    return text
