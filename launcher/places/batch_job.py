"""A batch job's state in ddpctl's own words, whatever the scheduler: a scheduler place reads its jobs' states in its
own words and maps them to a phase here inside its folder (Slurm: launcher/places/slurm/job_states.py, torchx's
state table), so that whether a job waits, runs or ended, and how, never depends on a scheduler's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A job's life: waiting for an allocation (or held), running (or ending), or one of the end phases; unknown where
# the scheduler no longer remembers it (or names a state ddpctl does not know), which counts as ended.
WAITING, RUNNING, SUCCEEDED, FAILED, CANCELLED, UNKNOWN = "waiting", "running", "succeeded", "failed", "cancelled", \
    "unknown"
PHASES = (WAITING, RUNNING, SUCCEEDED, FAILED, CANCELLED, UNKNOWN)


@dataclass(frozen=True)
class JobStatus:
    """One reading of a job: its phase, its state in the scheduler's own words (what its users know and what the run
    records), why it waits, and its times (unix)."""

    job_id: str
    state: str  # the scheduler's word (Slurm: PENDING, RUNNING, COMPLETED, TIMEOUT, OUT_OF_MEMORY, PREEMPTED...)
    phase: str  # ddpctl's word for it: one of PHASES (the scheduler's place maps its states to them)
    reason: str = ""  # why it is pending (Priority, Resources, JobHeldUser...), or how it ended
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: str = ""  # "CODE:SIGNAL"
    nodes: str = ""  # the allocation, in the scheduler's notation
    cpus: int | None = None
    gpus: int | None = None
    restarts: int = 0

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"job phase {self.phase!r}: one of {', '.join(PHASES)}")

    @property
    def finished(self) -> bool:
        return self.phase not in (WAITING, RUNNING)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
