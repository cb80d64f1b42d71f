"""What a batch scheduler is to `up` (torchx's shape): `submit_dryrun` turns the run into the exact request without
side effects (what `--dry-run` prints), `schedule` submits that request and nothing else, `describe` reads a
job's state, `cancel` ends it. A scheduler is reached through one login connection; the job's files live on the
cluster's shared file system, under the request's `remote_dir`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from launcher.spec.run_spec import RunSpec
from launcher.transport.ssh import Connection

# A job's life as `up` follows it: waiting for an allocation, running, or one of the end states.
PENDING, RUNNING = "PENDING", "RUNNING"


@dataclass(frozen=True)
class JobStatus:
    """One reading of a job: its state in the scheduler's own words, why it waits, and its times (unix)."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED...
    reason: str = ""  # why it is pending (Priority, Resources, JobHeldUser...), or how it ended
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: str = ""  # "CODE:SIGNAL"
    nodes: str = ""  # the allocation, in the scheduler's notation
    cpus: int | None = None
    gpus: int | None = None
    restarts: int = 0

    @property
    def finished(self) -> bool:
        return self.state not in (PENDING, RUNNING, "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
                                  "SUSPENDED", "STOPPED", "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class SubmitRequest(Protocol):
    """What submit_dryrun made: shown by --dry-run, submitted by schedule, byte for byte."""

    remote_dir: str

    def describe(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


class Scheduler(Protocol):
    """A batch scheduler reached through a login node."""

    name: str

    def submit_dryrun(self, spec: RunSpec, conn: Connection | None) -> SubmitRequest:
        """The exact request for `spec` (probing the cluster read-only when `conn` is given); no side effects."""
        ...

    def schedule(self, conn: Connection, request: SubmitRequest) -> str:
        """Submit the request (its files already shipped under remote_dir); the job id."""
        ...

    def describe(self, conn: Connection, job_id: str) -> JobStatus:
        """The job's state now."""
        ...

    def cancel(self, conn: Connection, job_id: str) -> None:
        """Ask the scheduler to end the job (SIGTERM to its steps first, then the kill after its grace)."""
        ...
