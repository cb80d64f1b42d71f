"""A scheduled run from its run directory alone (`status`, `logs`, `pull`, `down` after `up --detach` or from
another directory): the login node from run.json (its pinned key), the job id, and the run's folder on the
shared file system; launcher/places/slurm/__init__.py routes a `provider: slurm` run's day-2 commands here."""

from __future__ import annotations

import sys
import time
from typing import Any

from launcher.errors import DdpctlError
from launcher.execute.hosts.run import reattach
from launcher.places.batch_job import JobStatus
from launcher.places.slurm import requeue_chain
from launcher.places.slurm.node_progress import node_states, script_progress
from launcher.places.slurm.scheduler import SlurmScheduler
from launcher.places.slurm.up import cancel_and_wait, finish_job, pull_job
from launcher.planning.request import UpOptions
from launcher.results.rundir import RunDir
from launcher.spec.slurm_request import SlurmRequest
from launcher.transport.ssh import Connection

FOLLOW_POLL_SECONDS = 1.0


def _job(run_dir: RunDir) -> tuple[str, str]:
    slurm = run_dir.record().get("slurm") or {}
    if not slurm.get("job_id"):
        raise DdpctlError(f"run {run_dir.run_id} was never submitted (no job id in its run.json): nothing runs")
    return str(slurm["job_id"]), str(slurm["remote_dir"])


class SlurmRun:
    """status / logs / pull / down of a Slurm run."""

    def __init__(self) -> None:
        self.scheduler = SlurmScheduler(SlurmRequest(), "")

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        job_id, remote_dir = _job(run_dir)
        with reattach(run_dir, options) as session:
            conn = session.conn(0)
            status = self.scheduler.describe(conn, job_id)
            nodes = node_states(conn, remote_dir, run_dir.spec().nnodes)
            nodes = script_progress(conn, run_dir, remote_dir, nodes)
        shown = job_state_text(status) + requeue_chain.requeues_text(run_dir, status)
        return [{"node": k, "host": f"job {job_id} ({status.nodes or '-'})", "state": shown,
                 "exit_code": code, "epoch": progress.get("epoch"), "epochs": progress.get("epochs"),
                 "loss": progress.get("loss"), "restarts": "-" if attempt is None else attempt}
                for k, (code, progress, attempt) in enumerate(nodes)]

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        job_id, remote_dir = _job(run_dir)
        if not 0 <= node < run_dir.spec().nnodes:
            raise DdpctlError(f"--node {node}: the run has nodes 0..{run_dir.spec().nnodes - 1}")
        path = f"{remote_dir}/nodes/{node}/torchrun.out"
        with reattach(run_dir, options) as session:
            conn = session.conn(0)
            tail = conn.run(["sh", "-c", 'tail -n "$1" "$2" 2>/dev/null; true', "ddpctl-tail", str(lines), path])
            sys.stdout.write(tail.stdout)
            sys.stdout.flush()
            if follow:
                follow_file(conn, self.scheduler, job_id, path)

    def print_rank_log(self, run_dir: RunDir, rank: int, lines: int, follow: bool, options: UpOptions,
                       attempt: int | None) -> None:
        """A rank's output read where its node writes it, the job's folder on the shared file system (as a host's
        workspace is read); -f follows it until the job has ended. The pulled copy where the login node cannot be
        reached."""
        from launcher.execute.day2.rank_logs import print_node_rank_log, print_pulled_rank_log
        from launcher.results.rank_layout import rank_layout

        job_id, remote_dir = _job(run_dir)
        node, local_rank = rank_layout(run_dir).locate(rank)
        try:
            session = reattach(run_dir, options)
        except (DdpctlError, OSError) as e:
            print_pulled_rank_log(run_dir, rank, lines, attempt, f"the login node cannot be reached: {e}")
            return
        with session:
            try:
                session.conn(0).run(["true"], timeout=30)  # connect now: a login node that is gone means the copy
            except (DdpctlError, OSError) as e:
                print_pulled_rank_log(run_dir, rank, lines, attempt, f"the login node cannot be reached: {e}")
                return
            conn = session.conn(0)
            print_node_rank_log(conn, f"{remote_dir}/nodes/{node}", run_dir.spec().python, node, local_rank, rank,
                                lines, follow, attempt, ended=lambda: self.scheduler.describe(conn, job_id).finished)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        job_id, _ = _job(run_dir)
        with reattach(run_dir, options) as session:
            conn = session.conn(0)
            stats = pull_job(conn, run_dir)
            status = self.scheduler.describe(conn, job_id)
            spans = self.scheduler.allocation_spans(conn, job_id) if status.finished else None
        if status.finished and "end" not in (run_dir.record().get("slurm") or {}):
            finish_job(run_dir, status, spans)  # the end state, cost and failure, once, as `up` records them
        return stats

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        job_id, _ = _job(run_dir)
        with reattach(run_dir, options) as session:
            conn = session.conn(0)
            was = self.scheduler.describe(conn, job_id)
            if not was.finished:
                run_dir.event("cancel_requested", job_id=job_id, state=was.state)
                cancel_and_wait(self.scheduler, conn, job_id)
            pull_job(conn, run_dir)
            status = self.scheduler.describe(conn, job_id)
            spans = self.scheduler.allocation_spans(conn, job_id)
        if "end" not in (run_dir.record().get("slurm") or {}):
            finish_job(run_dir, status, spans)
        did = f"cancelled job {job_id} (it was {was.state.lower()})" if not was.finished else \
            f"job {job_id} had already ended ({was.state})"
        return f"{did}; what it wrote was pulled to {run_dir.path}"


def job_state_text(status: JobStatus) -> str:
    """`PENDING (Resources)`, `RUNNING`, `COMPLETED (exit 0:0)`: the state column of `status`."""
    if status.state == "PENDING":
        return f"PENDING ({status.reason})" if status.reason not in ("", "None") else "PENDING"
    return f"{status.state} (exit {status.exit_code})" if status.finished and status.exit_code else status.state


def follow_file(conn: Connection, scheduler: SlurmScheduler, job_id: str, path: str) -> None:
    """Print what is added to `path` until the job has ended and nothing more comes."""
    size = _size(conn, path)
    while True:
        ended = scheduler.describe(conn, job_id).finished
        now = _size(conn, path)
        if now > size:
            chunk = conn.run(["sh", "-c", 'tail -c +"$1" "$2" | head -c "$3"', "ddpctl-follow", str(size + 1), path,
                              str(now - size)])
            sys.stdout.write(chunk.stdout)
            sys.stdout.flush()
            size = now
        elif ended:
            return
        time.sleep(FOLLOW_POLL_SECONDS)


def _size(conn: Connection, path: str) -> int:
    out = conn.run(["sh", "-c", 'wc -c < "$1" 2>/dev/null || echo 0', "ddpctl-size", path]).stdout.strip()
    return int(out) if out.isdigit() else 0
