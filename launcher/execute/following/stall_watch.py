"""A followed run whose training stopped moving: the one place that decides it, for every place `up` follows a run
from (SSH hosts: launcher/execute/hosts/run.py; this machine: launcher/execute/this_machine/run.py).

Each poll feeds every node's progress record; the record shown is the one that changed last
(results.progress.FreshestProgress). Once nothing moved for STALL_HINT_SECONDS the run's events get one `stalled`
event per stall (and the display a note); with `--stall-timeout S`, once nothing moved for S seconds the run is
ended: RunStopRequested with stall_line's line, which names where every rank was (the `verdict` the caller
lends: every rank's stack, launcher/execute/stacks.py) and which the caller turns into "stop every node, keep what
it wrote". A run with no progress record yet is never counted as stalled here (start-up: see hang_watch.py)."""

from __future__ import annotations

from collections.abc import Callable

from launcher.errors import RunStopRequested
from launcher.results.progress import FreshestProgress
from launcher.results.rundir import RunDir

STALL_REASON = "stalled"


def stall_line(timeout: float, run_id: str, verdict: str = "") -> str:
    """What ends a run for --stall-timeout, on every place; `verdict`: where the ranks were, when taken."""
    where = f": {verdict}" if verdict else ""
    return (f"--stall-timeout: no training step for {timeout:g} s (a hung collective or data loader){where}; see "
            f"`ddpctl logs {run_id}`")


class StallWatch:
    """Fed each poll's progress records (through `freshest`); tells a stall once and ends the run past
    `timeout` seconds (0: never), after asking `verdict` where the ranks are."""

    def __init__(self, run_dir: RunDir, freshest: FreshestProgress, timeout: float = 0.0,
                 verdict: Callable[[], str] | None = None) -> None:
        self.run_dir = run_dir
        self.freshest = freshest
        self.timeout = timeout
        self.verdict = verdict
        self._reported = False

    def check(self, now: float) -> float | None:
        """Seconds training has not moved (past the hint's threshold; else None); raises RunStopRequested once
        past the timeout."""
        stalled = self.freshest.stalled_for(now)
        if stalled is not None and not self._reported:
            self.run_dir.event("stalled", seconds=round(stalled))
        self._reported = stalled is not None  # once per stall
        if self.timeout and self.freshest.stalled_for(now, self.timeout) is not None:
            said = self.verdict() if self.verdict is not None else ""  # every rank's stack, before the stop
            raise RunStopRequested(stall_line(self.timeout, self.run_dir.run_id, said), STALL_REASON)
        return stalled
