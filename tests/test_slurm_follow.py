"""Following a Slurm job on the real test cluster (a held job's reason and its release: test_slurm_end_states.py):
a detached job is followed with `status`, `logs -f` and `pull` from another directory. (`down` of a running job:
tests/place_contract.py through tests/test_place_registry.py, which also checks what Slurm and run.json keep.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from tests.faults.fault_support import rank_0_hangs_at
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import REPO, run_ddpctl

pytestmark = [pytest.mark.e2e, needs_slurm]
SMALL = ("--synthetic-train-size", "512", "--synthetic-test-size", "128")
# A run that is still running when Slurm finds a node lost (its SlurmdTimeout) without training all that time: rank 0
# stops at global step 20 (epoch 3 of 8 steps), after two snapshots, and rank 1 waits for it in the collective.
STILL_AFTER_EPOCH_2 = rank_0_hangs_at(20)


def up_argv(cluster: SlurmCluster, *args: str) -> list[str]:
    return ["up", "--provider", "slurm", "--host", cluster.login.spec, "--nodes", "2", "--gpus", "1", *SMALL, *args]


def only_run(runs: Path) -> Path:
    [run] = list(runs.iterdir())
    return run


def test_detached_job_is_followed_from_another_directory(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    up = run_ddpctl(slurm_cluster.bed, *up_argv(slurm_cluster, "--epochs", "2", "--detach"), cwd=here)
    assert up.returncode == 0, up.stderr
    run = only_run(here / "runs")
    job = json.loads((run / "run.json").read_text())["slurm"]["job_id"]
    assert "runs on without this terminal" in up.stderr and not (run / "summary.json").exists()
    status = run_ddpctl(slurm_cluster.bed, "status", str(run), "--json", cwd=elsewhere)
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)["nodes"]
    assert len(rows) == 2 and rows[0]["state"].split()[0] in ("PENDING", "RUNNING", "COMPLETED")
    logs = run_ddpctl(slurm_cluster.bed, "logs", str(run), "-f", cwd=elsewhere, timeout=240)  # returns at the end
    assert logs.returncode == 0, logs.stderr
    assert "SignalException" not in logs.stdout
    ended = run_ddpctl(slurm_cluster.bed, "status", str(run), "--json", cwd=elsewhere)
    rows = json.loads(ended.stdout)["nodes"]
    assert [r["state"] for r in rows] == ["COMPLETED (exit 0:0)"] * 2 and [r["exit_code"] for r in rows] == [0, 0]
    pulled = run_ddpctl(slurm_cluster.bed, "pull", str(run), cwd=elsewhere)
    assert pulled.returncode == 0 and "all files verified" in pulled.stderr, pulled.stderr
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2
    rank1 = run_ddpctl(slurm_cluster.bed, "logs", str(run), "--rank", "1", cwd=elsewhere)
    assert rank1.returncode == 0 and "showing the copy pulled" not in rank1.stderr, rank1.stderr  # the job's own
    for stream, shown in (("stdout", rank1.stdout), ("stderr", rank1.stderr)):  # the same as the copy pulled
        [log] = (run / "nodes" / "1" / "logs").glob(f"*/attempt_*/0/{stream}.log")
        assert all(line in shown.splitlines() for line in log.read_text().splitlines()[-3:])
    record = json.loads((run / "run.json").read_text())
    assert record["slurm"]["end"].startswith(f"job {job} COMPLETED") and "failure" not in record
    assert not (elsewhere / "runs").exists()


def test_a_slurmd_killed_mid_run_ends_the_job_as_node_fail_with_what_was_pulled(slurm_cluster: SlurmCluster,
                                                                                 tmp_path: Path) -> None:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(slurm_cluster.bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "launcher", "up", "-i", slurm_cluster.bed.client_key_path,
            *up_argv(slurm_cluster, "--epochs", "5000", *STILL_AFTER_EPOCH_2)[1:]]  # outlasts the node's loss
    err = tmp_path / "up.err"
    lost = slurm_cluster.node_names[1]
    with open(err, "w") as f:
        up = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        deadline = time.monotonic() + 120
        home = Path(slurm_cluster.login.home)  # until this run's training wrote a snapshot on the shared disk
        while not (tmp_path / "runs").is_dir() or not list(home.glob(
                f".ddpctl/slurm/runs/{only_run(tmp_path / 'runs').name}/nodes/*/out/snapshots/*.pt")):
            assert up.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(1)
        slurm_cluster.kill_slurmd(lost)
        assert up.wait(timeout=180) == 1, err.read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        slurm_cluster.start_slurmd(lost)
    shown = err.read_text()
    run = only_run(tmp_path / "runs")
    record = json.loads((run / "run.json").read_text())
    job = record["slurm"]["job_id"]
    assert f"job {job} NODE_FAIL: lost a node" in shown, shown
    assert shown.strip().splitlines()[-1].startswith(f"error: training failed: job {job} NODE_FAIL")
    assert record["failure"]["slurm_state"] == "NODE_FAIL"
    assert (run / "nodes" / "0" / "torchrun.out").is_file() and list(run.glob("nodes/*/out/snapshots/*.pt"))


def test_sigterm_while_following_cancels_the_job_and_pulls_what_it_wrote(slurm_cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(slurm_cluster.bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "launcher", "up", "-i", slurm_cluster.bed.client_key_path,
            *up_argv(slurm_cluster, "--epochs", "200")[1:]]
    err = tmp_path / "up.err"
    with open(err, "w") as f:
        up = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        deadline = time.monotonic() + 120
        while ": epoch " not in err.read_text():  # training is under way
            assert up.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.5)
        up.terminate()  # SIGTERM: what Ctrl-C does, for a process without a terminal
        assert up.wait(timeout=180) == 130, err.read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    run = only_run(tmp_path / "runs")
    job = json.loads((run / "run.json").read_text())["slurm"]["job_id"]
    last = err.read_text().strip().splitlines()[-1]
    pulled = (run / "pull.json").read_text() if (run / "pull.json").is_file() else "no pull.json"
    assert last == f"error: interrupted by SIGTERM: stopped every node and pulled what they wrote to {run}", \
        f"{last}\n{pulled}"
    assert "JobState=CANCELLED" in slurm_cluster.slurm("scontrol", "show", "job", job).stdout
    assert (run / "nodes" / "0" / "torchrun.out").is_file() and (run / "nodes" / "1" / "torchrun.out").is_file()
    # each node's shell outlived its torchrun and recorded how it ended: nothing was still writing when Slurm
    # called the job over and the pull began (a shell killed first orphaned torchrun, untracked by linuxproc)
    assert all((run / "nodes" / str(k) / "exit_code").is_file() for k in (0, 1)), sorted(run.glob("nodes/*/*"))
