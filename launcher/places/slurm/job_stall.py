"""`--stall-timeout S` on a Slurm job that `up` follows: the same rule as on hosts and this machine
(launcher/execute/following/stall_watch.py), fed from what Slurm's `status` reads.

While the job RUNS, each poll reads every node's progress record from the shared file system (and, for a script,
rank 0's progress from the end of its output), as `ddpctl status` does (node_progress.py);
the record that changed last is the clock. A job that is PENDING (waiting for resources, or requeued and waiting
again) is not hung: nothing counts while it waits, and the records seen before are forgotten, so the job's next
start is start-up again. As on hosts, a run with no progress record yet is never counted as stalled (start-up,
data loading); the display's hang hints cover that. Past S seconds without a step, RunStopRequested (reason
`stalled`) with the line every place ends a stalled run with; `stop_stalled_job` then cancels the job as `down`
does and pulls what it wrote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launcher.errors import RunStopRequested
from launcher.execute.following import interruption
from launcher.execute.following.stall_watch import StallWatch
from launcher.places.slurm.job_states import RUNNING
from launcher.places.slurm.node_progress import node_states, script_progress
from launcher.results.progress import FreshestProgress
from launcher.results.rundir import RunDir

# Each node's progress record as the job's `status` reads it: node index -> record ({} where none yet).
NodeRecords = Callable[[], list[dict[str, Any]]]


class JobStallWatch:
    """Fed each poll's job state; `read` (every node's record) is called only while the job runs."""

    def __init__(self, run_dir: RunDir, timeout: float, nodes: int, read: NodeRecords) -> None:
        self.run_dir, self.timeout, self.nodes, self.read = run_dir, timeout, nodes, read
        self._watch = self._fresh()

    def _fresh(self) -> StallWatch:
        return StallWatch(self.run_dir, FreshestProgress(self.nodes), self.timeout)

    def check(self, state: str, now: float) -> float | None:
        """Seconds training has not moved (past the hint's threshold; else None) while the job runs; raises
        RunStopRequested once past the timeout. Any other state (PENDING above all) starts the count afresh."""
        if state != RUNNING:
            self._watch = self._fresh()
            return None
        for node, record in enumerate(self.read()[:self.nodes]):
            self._watch.freshest.observe(node, record or None, now)
        return self._watch.check(now)


def node_records(conn: Any, run_dir: RunDir, remote_dir: str) -> list[dict[str, Any]]:
    """Every node's progress record, read as `ddpctl status` reads a Slurm job's (one or two login-node commands)."""
    nodes = node_states(conn, remote_dir, run_dir.spec().nnodes)
    return [progress for _, progress, _ in script_progress(conn, run_dir, remote_dir, nodes)]


def stop_stalled_job(run_dir: RunDir, stop: RunStopRequested, cancel: Callable[[], None],
                     pull: Callable[[], Any]) -> RunStopRequested:
    """Cancel the job (scancel, waiting until Slurm says it ended, as `down` does), pull what it wrote, record the
    stop as every place does (`stop_requested`, then the outcome); the error `up` ends with (exit 1)."""
    run_dir.event("stop_requested", reason=str(stop))
    outcome = interruption.stop_and_pull(run_dir, cancel, pull, cause=str(stop))
    done = outcome.stopped and outcome.pulled
    said = f"the job was cancelled and what it wrote pulled to {run_dir.path}" if done else outcome.text
    return RunStopRequested(f"{stop}; {said}", stop.reason)
