"""Slurm's job states in ddpctl's words (launcher/places/batch_job.py's phases): the one table of them, and the
JobStatus of a job as scontrol or sacct name its state. The states are those of Slurm's squeue(1) "JOB STATE CODES"."""

from __future__ import annotations

from typing import Any

from launcher.places import batch_job
from launcher.places.batch_job import JobStatus

# The states `up` tells apart while it follows a job, in Slurm's own words (what the user sees).
PENDING, RUNNING = "PENDING", "RUNNING"

PHASE_OF_STATE = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"),
                    batch_job.WAITING),
    # Allocated and not over: running, ending, resized, signalled, or suspended/stopped (it resumes where it was).
    **dict.fromkeys(("RUNNING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED"),
                    batch_job.RUNNING),
    "COMPLETED": batch_job.SUCCEEDED,
    **dict.fromkeys(("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
                     "SPECIAL_EXIT", "REVOKED"), batch_job.FAILED),
    "CANCELLED": batch_job.CANCELLED,
}


def job_status(job_id: str, state: str, **fields: Any) -> JobStatus:
    """The JobStatus of a job in Slurm's state `state` (a state ddpctl does not know, or UNKNOWN: ended, unknown)."""
    return JobStatus(job_id, state, PHASE_OF_STATE.get(state, batch_job.UNKNOWN), **fields)
