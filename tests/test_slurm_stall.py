"""--stall-timeout on a followed Slurm job decides as on hosts (launcher/places/slurm/job_stall.py): a job waiting in
the queue is not hung, a running job with no step yet is starting up, a running job whose record stopped moving
for the timeout is stopped with the line every place ends a stalled run with. (The stop itself, on the test
cluster: tests/place_contract.py through tests/test_place_registry.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.errors import RunStopRequested
from launcher.places.slurm.job_stall import JobStallWatch
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec

pytestmark = pytest.mark.unit
TIMEOUT = 30.0


def record(step: int) -> dict[str, Any]:
    return {"epoch": 1, "epochs": 2, "step": step, "steps_per_epoch": 10, "state": "train"}


class Nodes:
    """What the shared file system holds: each node's progress record ({} where none yet), and how often it was read."""

    def __init__(self, nodes: int) -> None:
        self.records: list[dict[str, Any]] = [{} for _ in range(nodes)]
        self.reads = 0

    def __call__(self) -> list[dict[str, Any]]:
        self.reads += 1
        return [dict(r) for r in self.records]


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path / "runs", RunSpec(run_id="job", nnodes=2), {"provider": "slurm"})


def test_a_pending_job_is_never_stalled_however_long_it_waits(run_dir: RunDir) -> None:
    nodes = Nodes(2)
    watch = JobStallWatch(run_dir, TIMEOUT, 2, nodes)
    for now in (0.0, 100.0, 10_000.0):
        assert watch.check("PENDING", now) is None
    assert nodes.reads == 0  # nothing is read from the nodes while none runs


def test_a_running_job_before_its_first_step_is_starting_up_not_stalled(run_dir: RunDir) -> None:
    watch = JobStallWatch(run_dir, TIMEOUT, 2, Nodes(2))
    for now in (0.0, TIMEOUT * 2, 1_000.0):
        assert watch.check("RUNNING", now) is None


def test_a_running_job_whose_steps_stop_is_stopped_past_the_timeout_naming_it(run_dir: RunDir) -> None:
    nodes = Nodes(2)
    watch = JobStallWatch(run_dir, TIMEOUT, 2, nodes)
    nodes.records[1] = record(1)  # rank 0 on node 1: its record is the clock
    watch.check("RUNNING", 0.0)
    nodes.records[1] = record(2)
    watch.check("RUNNING", 20.0)  # moved: counted from here
    assert watch.check("RUNNING", 20.0 + TIMEOUT - 1) is None
    with pytest.raises(RunStopRequested) as stopped:
        watch.check("RUNNING", 20.0 + TIMEOUT + 1)
    assert stopped.value.reason == "stalled"
    assert str(stopped.value).startswith(f"--stall-timeout: no training step for {TIMEOUT:g} s (a hung collective")
    assert str(stopped.value).endswith("see `ddpctl logs job`")


def test_steps_that_keep_coming_never_stop_the_job(run_dir: RunDir) -> None:
    nodes = Nodes(1)
    watch = JobStallWatch(run_dir, TIMEOUT, 1, nodes)
    for step, now in enumerate(range(0, 600, 20)):
        nodes.records[0] = record(step)
        assert watch.check("RUNNING", float(now)) is None


def test_a_job_requeued_and_pending_again_starts_its_count_afresh(run_dir: RunDir) -> None:
    nodes = Nodes(1)
    watch = JobStallWatch(run_dir, TIMEOUT, 1, nodes)
    nodes.records[0] = record(5)
    watch.check("RUNNING", 0.0)
    assert watch.check("PENDING", 20.0) is None  # requeued: waiting for its next allocation
    assert watch.check("PENDING", 500.0) is None
    # running again, the last allocation's record still on the file system: counted from this start
    assert watch.check("RUNNING", 510.0) is None
    assert watch.check("RUNNING", 510.0 + TIMEOUT - 1) is None
    with pytest.raises(RunStopRequested):
        watch.check("RUNNING", 510.0 + TIMEOUT + 1)


def test_a_finished_training_record_is_not_a_stall(run_dir: RunDir) -> None:
    nodes = Nodes(1)
    watch = JobStallWatch(run_dir, TIMEOUT, 1, nodes)
    nodes.records[0] = {**record(10), "state": "done"}
    watch.check("RUNNING", 0.0)
    assert watch.check("RUNNING", 10 * TIMEOUT) is None  # the job is ending (the pull, the summary), not hung


def test_an_incomplete_pull_of_a_job_names_the_jobs_folder_on_the_cluster(tmp_path: Path) -> None:
    """What a pull could not bring back stays in the job's folder on the shared file system, which the line names
    (not the hosts' ~/.ddpctl/runs/, where a Slurm job writes nothing)."""
    from launcher.execute.pull_record import incomplete_pull_line, write_pull_record
    from launcher.places.registry import PLACES
    from launcher.transport.pull import CHANGED

    folder = "/home/u/.ddpctl/slurm/runs/job-1"
    record = {"provider": "slurm", "slurm": {"remote_dir": folder, "job_id": "7"}}
    write_pull_record(tmp_path, ["node 0"], [{"not_pulled": (("torchrun.out", CHANGED),), "verified": 3}], [None])
    words = PLACES["slurm"].not_pulled_after_down
    line = incomplete_pull_line(tmp_path, record, down_words=words)
    assert line is not None and line.startswith(f"pull incomplete, 1 file not pulled: node 0 'torchrun.out': {CHANGED}")
    assert line.endswith(f"pulls it again; until then it stays on the cluster, in {folder}/"), line
    after = incomplete_pull_line(tmp_path, record, after_down=True, down_words=words)
    assert after is not None and after.endswith(f"; what was not pulled stays on the cluster, in {folder}/"), after
    assert ".ddpctl/runs/" not in line + after
