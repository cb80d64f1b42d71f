"""A requeued Slurm run (`--requeue`) followed and told as one run: while `up` follows, the requeues and the wait
for the next allocation; at the end, the allocations, time queued and trained, the CPU/GPU-hours over all of them,
and the outcome when the last allowed requeue was used. The job's own record of its allocations
(launcher/places/slurm/requeue.py, requeue/chain in its folder) is pulled with the rest."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from launcher.places.batch_job import JobStatus
from launcher.places.slurm.requeue import CHAIN_FILE, EXIT_REQUEUES_SPENT, SIGNAL, Chain
from launcher.results.rundir import RunDir

PULLED = f"/{CHAIN_FILE}"


def max_requeues(run_dir: RunDir) -> int:
    return int((run_dir.record().get("slurm") or {}).get("max_requeues") or 0)


def note_submit_time(run_dir: RunDir, status: JobStatus) -> None:
    """Slurm's submit time of the first allocation, kept once (a requeue resets the job's SubmitTime)."""
    slurm = run_dir.record().get("slurm") or {}
    if status.restarts == 0 and status.submit_time is not None and "first_submit_time" not in slurm:
        run_dir.update_record(slurm={**slurm, "first_submit_time": status.submit_time})


def submit_time(run_dir: RunDir) -> float | None:
    """When the chain began to wait: Slurm's first submit time, else the time ddpctl submitted it (its events)."""
    slurm = run_dir.record().get("slurm") or {}
    if slurm.get("first_submit_time") is not None:
        return float(slurm["first_submit_time"])
    submitted = [e for e in run_dir.events() if e.get("event") == "submitted"]
    return float(submitted[0]["time"]) if submitted and "time" in submitted[0] else None


def requeues_text(run_dir: RunDir, status: JobStatus) -> str:
    """` (requeued 1/3)` for `status` once a requeued run's job was requeued; empty otherwise."""
    most = max_requeues(run_dir)
    return f" (requeued {status.restarts}/{most})" if most and status.restarts else ""


def chain_of(run_dir: RunDir) -> Chain:
    path = run_dir.path / CHAIN_FILE
    return Chain.parse(path.read_text(errors="replace")) if path.is_file() else Chain()


class RequeueWatch:
    """While `up` follows: notices each requeue (scontrol's Restarts) once, and says which allocation runs or waits."""

    def __init__(self, job_id: str, most: int) -> None:
        self.job_id, self.most, self.seen = job_id, most, 0

    def requeued_line(self, status: JobStatus) -> str | None:
        """`job 12 requeued (1/3) at the time limit` the first time a new requeue shows; else None."""
        if status.restarts <= self.seen:
            return None
        self.seen = status.restarts
        return f"job {self.job_id} requeued ({status.restarts}/{self.most}) at the time limit"

    def allocation(self, status: JobStatus) -> str:
        """` (allocation 2)` once the job was requeued; empty before."""
        return f" (allocation {status.restarts + 1})" if status.restarts else ""


def cost(run_dir: RunDir, status: JobStatus, submitted: float | None,
         slurm_spans: list[tuple[float, float]] | None = None) -> tuple[dict[str, Any], Chain]:
    """Time queued and trained over every allocation, and the CPU/GPU-hours they cost (the allocation's CPUs and
    GPUs from Slurm, times the time in allocations). The time in allocations is Slurm's: every allocation's from
    accounting (`slurm_spans`, sacct's duplicates) where it answers for all of them, else the job's own record
    with Slurm's StartTime/EndTime for an allocation cut at its limit, whose killed shell wrote no end."""
    chain = chain_of(run_dir)
    spans, source = allocation_spans(chain, status, slurm_spans)
    trained = round(sum(end - start for start, end in spans), 1) if spans else None
    queued = chain.queued_seconds(submitted)
    hours = (lambda n: round(n * trained / 3600, 4) if n and trained is not None else None)  # noqa: E731
    return {"allocations": max(len(chain.allocations), len(spans)), "requeues": chain.requeues,
            "trained_seconds": trained, "trained_from": source,
            "queued_seconds": round(queued, 1) if queued is not None else None, "run_seconds": trained,
            "cpu_hours": hours(status.cpus), "gpu_hours": hours(status.gpus)}, chain


def allocation_spans(chain: Chain, status: JobStatus, slurm_spans: list[tuple[float, float]] | None
                     ) -> tuple[list[tuple[float, float]], str]:
    """(start, end) of each allocation, and where the times came from."""
    if slurm_spans and len(slurm_spans) >= len(chain.allocations):
        return [(s, e) for s, e in slurm_spans if e >= s], "sacct"
    slurm_last = (status.start_time, status.end_time) if status.start_time and status.end_time else None
    if not chain.allocations:
        return ([slurm_last] if slurm_last else []), "scontrol"
    spans, cut = [], False
    for index, a in enumerate(chain.allocations):
        if a.end is not None:
            spans.append((a.start, a.end))
        elif index == len(chain.allocations) - 1 and slurm_last is not None:
            spans.append((min(a.start, slurm_last[0]), slurm_last[1]))  # Slurm ended it: its own end time
            cut = True
        else:  # an earlier allocation ended by Slurm with no accounting to ask: as far as the job recorded
            spans.append((a.start, a.signalled or a.start))
            cut = True
    return spans, "requeue/chain and scontrol" if cut else "requeue/chain"


def spent(status: JobStatus, chain: Chain) -> bool:
    """The job stopped itself at its time limit with no requeue left (or scontrol requeue failed)."""
    return status.exit_code.split(":")[0] == str(EXIT_REQUEUES_SPENT) and chain.spent


def end_line(status: JobStatus, fields: dict[str, Any], chain: Chain, most: int, saved: str,
             user_command: bool = True) -> str:
    """One line: `job 12 COMPLETED (exit 0:0) after 3 allocations (2 requeues): 95 s trained, 24 s queued`, or the
    TIMEOUT after the last requeue with what was saved."""
    times = ", ".join(t for t in (
        f"{fields['trained_seconds']:.0f} s trained" if fields["trained_seconds"] is not None else "",
        f"{fields['queued_seconds']:.0f} s queued" if fields["queued_seconds"] is not None else "") if t)
    span = f"{fields['allocations']} allocation(s) ({fields['requeues']} requeue(s))"
    if spent(status, chain):
        return (f"job {status.job_id} TIMEOUT after {fields['requeues']} requeue(s) (--max-requeues {most}): the time "
                f"limit came again and no requeue was left; saved: {saved}; {times} over {span} (Slurm: "
                f"{status.state}, exit {status.exit_code})")
    told = unheeded_signal(status, chain, user_command)
    if told:
        return f"job {status.job_id} TIMEOUT (exit {status.exit_code or '?'}) after {span}: {times}; {told}"
    finished = finished_at_signal(status, chain)
    if finished:
        return f"job {status.job_id} {status.state} (exit {status.exit_code or '?'}) after {span}: {times}; {finished}"
    how = {"TIMEOUT": ": hit its time limit", "NODE_FAIL": ": lost a node", "CANCELLED": ": was cancelled",
           "OUT_OF_MEMORY": ": ran out of memory", "PREEMPTED": ": was preempted"}.get(status.state, "")
    return f"job {status.job_id} {status.state}{how} (exit {status.exit_code or '?'}) after {span}: {times}"


HANDLER_EXAMPLE = "examples/slurm_requeue.py"
MARK_ADVICE = "create the file $DDPCTL_REQUEUE_MARK names"


def finished_at_signal(status: JobStatus, chain: Chain) -> str:
    """What to tell when the signal came and every node then ended 0 with no requeue mark: taken as finished (a
    script that saved to resume, but did not say so, learns here how to)."""
    last = chain.allocations[-1] if chain.allocations else None
    if status.state != "COMPLETED" or last is None or not last.finished or last.signalled is None:
        return ""
    at = time.strftime("%H:%M:%S", time.localtime(last.signalled))
    return (f"SIG{SIGNAL} came at {at} and the command then ended 0 without asking for a requeue, so it was taken "
            f"as finished (a command that stopped for the signal to resume later must {MARK_ADVICE} before it "
            f"exits 0, as {HANDLER_EXAMPLE} does)")


def unheeded_signal(status: JobStatus, chain: Chain, user_command: bool = True) -> str:
    """What to tell when the time limit's signal came and the run did not stop after it (Slurm ended the job at its
    limit, so the batch shell never wrote the allocation's end): when, and what the script must add."""
    last = chain.allocations[-1] if chain.allocations else None
    if status.state != "TIMEOUT" or last is None or last.signalled is None or last.end is not None:
        return ""
    before = (f" ({status.end_time - last.signalled:.0f} s before the end)" if status.end_time is not None
              and status.end_time >= last.signalled else "")
    at = time.strftime("%H:%M:%S", time.localtime(last.signalled))
    told = (f"SIG{SIGNAL} came at {at}{before} and no snapshot followed: the run did not save and exit 0 after it, "
            "so Slurm ended it at the limit and it was not requeued")
    if not user_command:  # our trainer acts on it: it did not get to its snapshot in time (its logs say where)
        return told + " (the trainer did not reach its snapshot in time: see the nodes' logs)"
    return (told + f". Add a SIG{SIGNAL} handler that sets a flag, then "
            f"save, {MARK_ADVICE} and exit 0 when it is set (as {HANDLER_EXAMPLE} does; docs/guides/slurm.md, 'A "
            "script of your own')")


def saved_text(run_dir: RunDir, user_command: bool) -> str:
    """What the stopped run left to resume from: the newest snapshot pulled, or the script's own files."""
    if user_command:
        return "what the command saved itself (in nodes/*/out or beside its code)"
    names = sorted({p.name for p in run_dir.path.glob("nodes/*/out/snapshots/snapshot-epoch-*.pt")})
    if not names:
        return "no snapshot"
    return f"{_position(names[-1])} (nodes/*/out/snapshots/{names[-1]})"


def _position(name: str) -> str:
    """`after epoch 2` or `epoch 3, 40 steps in` from a snapshot's file name."""
    parts = Path(name).stem.split("-")  # snapshot-epoch-000002[-step-00000040]
    epoch = int(parts[2])
    return f"epoch {epoch + 1}, {int(parts[4])} steps in" if len(parts) > 4 else f"after epoch {epoch}"
