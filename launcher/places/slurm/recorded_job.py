"""A scheduled run from its run directory alone (`status`, `logs`, `pull`, `down` after `up --detach` or from
another directory): the login node from run.json (its pinned key), the job id, and the run's folder on the
shared file system; launcher/places/slurm/__init__.py routes a `provider: slurm` run's day-2 commands here."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from launcher.errors import DdpctlError
from launcher.execute.hosts.run import reattach
from launcher.places.batch_job import JobStatus
from launcher.places.slurm import requeue_chain
from launcher.places.slurm.scheduler import SlurmScheduler
from launcher.places.slurm.up import cancel_and_wait, finish_job, pull_job
from launcher.planning.request import UpOptions
from launcher.remote import shell_text
from launcher.results.rundir import RunDir
from launcher.spec.slurm_request import SlurmRequest
from launcher.transport.ssh import Connection

FOLLOW_POLL_SECONDS = 1.0
# Each node's exit status, newest attempt (torchrun's attempt_<N>, numbered alike on every node) and progress
# record: `NODE k|exit code|attempt` then the record (empty when none).
NODES_SCRIPT = shell_text("slurm_nodes.sh")  # launcher/remote/slurm_nodes.sh: its arguments there
# The end of the newest attempt's output of one worker: $1 the node's folder, $2 its local rank, $3 how many bytes.
RANK_TAIL = ('n=-1; f=; for d in "$1"/logs/*/attempt_*; do a=${d##*attempt_}; '
             'if [ -d "$d" ] && [ "$a" -gt "$n" ] 2>/dev/null; then n=$a; f="$d/$2/stdout.log"; fi; done; '
             'if [ -n "$f" ]; then tail -c "$3" "$f" 2>/dev/null; fi; true')


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


def node_states(conn: Connection, remote_dir: str,
                nodes: int) -> list[tuple[int | None, dict[str, Any], int | None]]:
    """Each node's exit status (None while it runs), progress record and restarts (its newest attempt; None before
    its workers start), read from the shared file system."""
    result = conn.run(["sh", "-c", NODES_SCRIPT, "ddpctl-nodes", remote_dir, str(nodes)], timeout=60)
    states: list[tuple[int | None, dict[str, Any], int | None]] = [(None, {}, None) for _ in range(nodes)]
    for chunk in result.stdout.split("NODE ")[1:]:
        head, _, body = chunk.partition("\n")
        index, code, attempts = (head.split("|") + ["", ""])[:3]
        numbers = [int(a) for a in attempts.split() if a.isdigit()]
        try:
            progress = json.loads(body) if body.strip() else {}
        except ValueError:
            progress = {}
        if index.isdigit() and int(index) < nodes:
            states[int(index)] = (int(code) if code.strip().lstrip("-").isdigit() else None, progress,
                                  max(numbers) if numbers else None)
    return states


def script_progress(conn: Connection, run_dir: RunDir, remote_dir: str,
                    nodes: list[tuple[int | None, dict[str, Any], int | None]]) -> list[
                        tuple[int | None, dict[str, Any], int | None]]:
    """For a script (nothing writes its progress.json): rank 0's node's progress from the end of rank 0's output."""
    from launcher.results.progress import progress_record
    from launcher.results.rank_layout import rank_layout
    from launcher.results.script_progress import SCRIPT_TAIL_BYTES, script_record

    if not run_dir.spec().user_command:
        return nodes
    node, local_rank = rank_layout(run_dir).locate(0)
    if node >= len(nodes) or nodes[node][1]:
        return nodes
    tail = conn.run(["sh", "-c", RANK_TAIL, "ddpctl-rank-tail", f"{remote_dir}/nodes/{node}", str(local_rank),
                     str(SCRIPT_TAIL_BYTES)], timeout=30).stdout
    progress = progress_record(script_record(tail, len(tail.encode()) < SCRIPT_TAIL_BYTES)) or {}
    return [(code, progress, attempt) if k == node else (code, was, attempt)
            for k, (code, was, attempt) in enumerate(nodes)]


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
