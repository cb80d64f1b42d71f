"""How a scheduled job ended, as the run records it: the end state named (a step that Slurm's memory limit killed
is OUT_OF_MEMORY, whatever the job's own state), and the failure: the first failing rank where a rank failed by
itself (FAILED, OUT_OF_MEMORY), else what Slurm did (time limit, cancel, preemption, a lost node) with each node's
outcome. Nodes are named by the allocation's host names (SLURM_NODEID k is the k-th of its hostlist)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.execute.failures.cause import attribute
from launcher.places.batch_job import JobStatus
from launcher.places.slurm.job_output import OomKill, expand_hostlist, oom_kills
from launcher.places.slurm.mpi_job import SRUN_PMIX_SAID
from launcher.remote import attribution
from launcher.results.rundir import RunDir

# States in which a rank may have failed by itself: the first failing rank is the cause.
RANK_STATES = ("FAILED", "OUT_OF_MEMORY")


def job_output_path(run_path: Path, job_id: str) -> Path:
    """The batch script's own output (Slurm's notes: srun's errors, slurmstepd's oom-kills), as pulled."""
    return run_path / f"slurm-{job_id}.out"


def step_oom(run_path: Path, status: JobStatus) -> OomKill | None:
    """The first oom-kill Slurm noted in the job's output, for a job that did not complete."""
    if status.state == "COMPLETED":
        return None
    try:
        text = job_output_path(run_path, status.job_id).read_text(errors="replace")
    except OSError:
        return None
    kills = oom_kills(text)
    return kills[0] if kills else None


def named_state(status: JobStatus, oom: OomKill | None) -> str:
    """The end state the run names: Slurm's, but OUT_OF_MEMORY where its memory limit killed a process."""
    return "OUT_OF_MEMORY" if oom is not None and status.state in RANK_STATES else status.state


def node_labels(status: JobStatus, nodes: int) -> list[str]:
    """Each node's name in the allocation (`node k` where Slurm gave none)."""
    hosts = expand_hostlist(status.nodes)
    return [hosts[k] if k < len(hosts) else f"node {k}" for k in range(nodes)]


def _ranks_by_srun(run_path: Path, job_id: str) -> bool:
    """Whether the job's output says srun --mpi=pmix, not mpirun, started an MPI job's ranks."""
    try:
        return SRUN_PMIX_SAID in job_output_path(run_path, job_id).read_text(errors="replace")
    except OSError:
        return False


def job_failure(run_dir: RunDir, status: JobStatus, line: str, oom: OomKill | None) -> dict[str, Any]:
    """The failure record of a job that did not complete (run.json's `failure`, what `status` shows)."""
    spec = run_dir.spec()
    labels = node_labels(status, spec.nnodes)
    copies = [run_dir.path / "nodes" / str(k) for k in range(spec.nnodes)]
    reports = [attribution.node_report(str(c.resolve())) if (c / "torchrun.out").is_file() else None for c in copies]
    if oom is not None:  # Slurm's note is the reason a worker got SIGKILL (the kernel's log is not ours to read)
        for label, report in zip(labels, reports, strict=True):
            for worker in (report or {}).get("failures") or []:
                if worker.get("signal") == "SIGKILL" and oom.node in (None, label):
                    worker["oom"] = oom.text
    ranks = attribute(reports, labels, python=spec.python, launcher=spec.launcher)
    if ranks is not None and spec.launcher == "mpirun" and _ranks_by_srun(run_dir.path, status.job_id):
        ranks["summary"] = str(ranks.get("summary", "")).replace("mpirun on ", "srun --mpi=pmix on ", 1)
    state = named_state(status, oom)
    if state in RANK_STATES and ranks is not None:  # the first failing rank (or agent), as on hosts
        return {**ranks, "slurm_state": state}
    return {"summary": line, "node": None, "rank": None, "slurm_state": state, "nodes": (ranks or {}).get("nodes", [])}
