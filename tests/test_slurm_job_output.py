"""What Slurm says about a job, read as text: its allocation's hostlist expanded in SLURM_NODEID order,
slurmstepd's oom-kill notes, and the end line and state a run names from them (pure)."""

from __future__ import annotations

import pytest

from launcher.places.slurm.job_end import named_state
from launcher.places.slurm.job_output import OomKill, expand_hostlist, oom_kills
from launcher.places.slurm.job_states import job_status
from launcher.places.slurm.rank0_output import _first_by_name
from launcher.places.slurm.up import end_line

pytestmark = pytest.mark.unit

# As Slurm 22.05 wrote it to slurm-4.out on the test cluster (task/cgroup, --mem=1G, a rank allocating past it).
OOM_OUTPUT = """srun: error: ddpslt5h2: task 1: Out Of Memory
slurmstepd-ddpslt5h2: error: Detected 1 oom-kill event(s) in StepId=4.0. Some of your processes may have been \
killed by the cgroup out-of-memory handler.
srun: launch/slurm: _step_signal: Terminating StepId=4.0
"""


@pytest.mark.parametrize(("hostlist", "names"), [
    ("ddpslt7h[1-2]", ["ddpslt7h1", "ddpslt7h2"]),
    ("n[01-03,7],gpu5", ["n01", "n02", "n03", "n7", "gpu5"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("single", ["single"]),
    ("", []),
    ("(null)", []),
])
def test_a_hostlist_expands_in_slurms_order(hostlist: str, names: list[str]) -> None:
    assert expand_hostlist(hostlist) == names


def test_oom_kill_notes_name_the_step_and_node() -> None:
    assert oom_kills(OOM_OUTPUT) == [OomKill("4.0", "ddpslt5h2", 1)]
    assert oom_kills("srun: error: ddpslt5h2: task 1: Exited with exit code 1\n") == []
    assert oom_kills("slurmstepd: error: Detected 2 oom-kill event(s) in StepId=9.batch. Some ...") == \
        [OomKill("9.batch", None, 2)]
    # jobacct_gather/linux with OverMemoryKill, as Slurm 22.05 wrote it on the test cluster (--mem=100M)
    over = oom_kills("slurmstepd-n1: error: StepId=1.0 exceeded memory limit (118730752 > 104857600), being killed\n"
                     "slurmstepd-n1: error: Exceeded job memory limit\n")
    assert over == [OomKill("1.0", "n1", 1, "118730752 > 104857600")]
    assert over[0].text == "Slurm step 1.0 on n1 exceeded its memory limit (118730752 > 104857600 bytes) and was killed"


# As Slurm 22.05 wrote it on the test cluster when node 2's slurmstepd note did not reach srun before it ended.
SRUN_ONLY_OUTPUT = """ddpctl: job 2 on ddpslt1h[1-2], rendezvous at ddpslt1h1:20002
srun: error: ddpslt1h2: task 1: Out Of Memory
srun: launch/slurm: _step_signal: Terminating StepId=2.0
slurmstepd-ddpslt1h1: error: *** STEP 2.0 ON ddpslt1h1 CANCELLED AT 2026-11-25T22:18:35 ***
srun: error: ddpslt1h1: task 0: Terminated
srun: Force Terminated StepId=2.0
"""


def test_sruns_own_out_of_memory_line_counts_where_slurmstepds_note_is_missing() -> None:
    assert oom_kills(SRUN_ONLY_OUTPUT) == [OomKill("2.0", "ddpslt1h2", 1)]
    assert oom_kills(OOM_OUTPUT) == [OomKill("4.0", "ddpslt5h2", 1)]  # one kill, not srun's line and the note
    assert oom_kills("srun: error: n1: tasks 0-2,5: Out Of Memory\n") == [OomKill("", "n1", 4)]
    assert OomKill("", "n1", 4).text == "4 oom-kill event(s) in a Slurm step on n1"
    failed = job_status("2", "FAILED", exit_code="1:0")
    assert end_line(failed, None, 9.0, OomKill("", "n1", 1)).startswith("job 2 OUT_OF_MEMORY: a step ran out of "
                                                                         "memory on n1")


def test_a_step_killed_for_memory_is_named_out_of_memory_with_slurms_own_state_beside_it() -> None:
    failed = job_status("4", "FAILED", exit_code="1:0", nodes="ddpslt5h[1-2]")
    oom = OomKill("4.0", "ddpslt5h2", 1)
    assert named_state(failed, oom) == "OUT_OF_MEMORY" and named_state(failed, None) == "FAILED"
    assert end_line(failed, 1.0, 30.0, oom) == ("job 4 OUT_OF_MEMORY: step 4.0 ran out of memory on ddpslt5h2 "
                                                "(Slurm's job state: FAILED) (exit 1:0) after 30 s running, 1 s queued")
    assert end_line(job_status("5", "TIMEOUT", exit_code="0:15"), None, 75.0) == \
        "job 5 TIMEOUT: hit its time limit (exit 0:15) after 75 s running"
    # A job that completed, or one Slurm ended otherwise, keeps Slurm's state whatever its output says.
    assert named_state(job_status("6", "PREEMPTED"), oom) == "PREEMPTED"


def test_rank_zeros_node_by_c10ds_rule_is_the_first_host_name_as_text() -> None:
    assert _first_by_name(["node9", "node10"], 2) == 1  # "node10" < "node9" as text
    assert _first_by_name(["a1", "a2"], 2) == 0
    assert _first_by_name([], 2) == 0


def test_each_slurm_state_has_ddpctls_phase_and_the_job_ends_as_slurm_says() -> None:
    """Slurm's state names stay in its folder (the user still reads them); what follows a job reads ddpctl's phases."""
    from launcher.places.batch_job import CANCELLED, FAILED, PHASES, RUNNING, SUCCEEDED, UNKNOWN, WAITING, JobStatus
    from launcher.places.slurm.job_states import PHASE_OF_STATE

    expected = {"PENDING": WAITING, "REQUEUED": WAITING, "CONFIGURING": WAITING, "RUNNING": RUNNING,
                "COMPLETING": RUNNING, "SUSPENDED": RUNNING, "COMPLETED": SUCCEEDED, "TIMEOUT": FAILED,
                "OUT_OF_MEMORY": FAILED, "NODE_FAIL": FAILED, "PREEMPTED": FAILED, "CANCELLED": CANCELLED,
                "UNKNOWN": UNKNOWN, "SOMETHING_NEWER": UNKNOWN}
    for state, phase in expected.items():
        status = job_status("7", state)
        assert (status.state, status.phase) == (state, phase)
        assert status.finished == (phase not in (WAITING, RUNNING)), state
    assert set(PHASE_OF_STATE.values()) <= set(PHASES)
    assert job_status("7", "RUNNING").to_json()["phase"] == "running"
    with pytest.raises(ValueError, match="job phase 'PENDING'"):
        JobStatus("7", "PENDING", "PENDING")  # a scheduler's word is no phase
