"""Training past the time limit on the real test cluster (`--requeue`): a job whose one-minute limit is shorter than
its training is signalled, saves a snapshot, requeues itself, resumes and finishes with the final weights of an
uninterrupted run (CPU, same seed and world); a user's script that never ends by itself is signalled, saves its own
state, is requeued the same way and, its one requeue spent, ends in the stated TIMEOUT outcome.

Slurm checks time limits every 30 s, so a job is signalled up to 30 s after the notice it asked for: the trainer's
2-minute limit (a 60 s notice) leaves its first allocation 60 to 90 s, room for torch to start on a busy machine.
The three runs (the chain, the script's chain detached beside it, and the uninterrupted run here) overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import REPO, run_ddpctl

pytestmark = [pytest.mark.e2e, needs_slurm]
TRAINING = ("--epochs", "2", "--seed", "4", "--threads-per-process", "1", "--synthetic-train-size", "4096",
            "--synthetic-test-size", "256")
# The first allocation's training outlasts its limit whatever this machine's speed: rank 0 stops at global step 40
# (of 64 per epoch) until the time limit's signal comes (the trainer's test hook; the weights are not touched).
HANG = ("--trainer-arg=--fault-hang", "--trainer-arg=0:40")

SCRIPT = '''import json, os, signal, time
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
if os.path.exists(os.environ["DDPCTL_REQUEUE_FLAG"]):  # the signal came before this process could listen
    stop.append(1)
path = os.path.join(os.environ["DDPCTL_OUTPUT_DIR"], "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"allocations": []}
state["allocations"].append(int(os.environ["DDPCTL_REQUEUE_COUNT"]))
while not stop:  # never done by itself: only the time limit's signal ends it
    time.sleep(0.2)
state["flag"] = os.path.exists(os.environ["DDPCTL_REQUEUE_FLAG"])
with open(path + ".tmp", "w") as f:
    json.dump(state, f)
os.replace(path + ".tmp", path)
open(os.environ["DDPCTL_REQUEUE_MARK"], "a").close()  # stopped for the signal: requeue me
print("saved", state, flush=True)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
'''


def slurm(cluster: SlurmCluster, *args: str, cwd: Path, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return run_ddpctl(cluster.bed, *args[:1], "--provider", "slurm", "--host", cluster.login.spec, *args[1:], cwd=cwd,
                      timeout=timeout)


def final_weights(path: Path) -> dict[str, object]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)  # type: ignore[no-any-return]


def test_a_run_longer_than_its_time_limit_is_requeued_and_ends_with_an_uninterrupted_runs_weights(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    import torch

    reference = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "trainer", *TRAINING,
         "--out-dir", str(tmp_path / "reference")], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        script_dir = tmp_path / "script"
        script_dir.mkdir()
        (script_dir / "loop.py").write_text(SCRIPT)
        detached = slurm(slurm_cluster, "up", "--nodes", "1", "--gpus", "1", "--time", "1", "--max-requeues", "1",
                         "--detach", "--", "python", "loop.py", cwd=script_dir)
        assert detached.returncode == 0, detached.stderr

        up = slurm(slurm_cluster, "up", "--nodes", "2", "--gpus", "1", "--time", "2", "--requeue", *TRAINING, *HANG,
                   cwd=tmp_path)
        assert up.returncode == 0, up.stderr
        assert reference.wait(timeout=300) == 0, reference.stderr.read().decode() if reference.stderr else ""
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    run = next((tmp_path / "runs").iterdir())
    record = json.loads((run / "run.json").read_text())["slurm"]
    job = record["job_id"]
    assert f"job {job} requeued (1/10) at the time limit" in up.stderr
    assert record["end"].startswith(f"job {job} COMPLETED (exit 0:0) after {record['allocations']} allocation(s)")
    # One requeue at least (the first allocation's); on a busy machine the second may be signalled too.
    assert record["allocations"] >= 2 and record["requeues"] == record["allocations"] - 1
    assert record["trained_seconds"] > 0 and record["queued_seconds"] > 0 and record["cpu_hours"] > 0
    chain = (run / "requeue" / "chain").read_text()
    assert chain.count(" start ") == record["allocations"] and chain.count(" signal ") >= 1
    # The job's script asked for the signal and the requeue; every allocation's output was kept (appended).
    script = (run / "job.sbatch").read_text()
    assert "#SBATCH --requeue\n#SBATCH --signal=B:USR1@60\n" in script
    output = "".join(p.read_text() for p in run.glob("nodes/*/logs/**/stderr.log"))  # every allocation's
    assert "stopped for a requeue in epoch 1 after step 40/64" in output
    assert "resuming after epoch 0, step 40/64 of epoch 1" in output
    assert [json.loads(line)["epoch"] for line in (run / "timing.jsonl").read_text().splitlines()] == [1, 2]
    [model] = run.glob("nodes/*/out/final_model.pt")  # written by global rank 0, on its node
    weights = final_weights(model)
    expected = final_weights(tmp_path / "reference" / "final_model.pt")
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in weights)  # type: ignore[arg-type]

    # The user's script: signalled, saved, requeued once, signalled again with no requeue left: TIMEOUT, stated.
    script_run = next((script_dir / "runs").iterdir())
    script_job = json.loads((script_run / "run.json").read_text())["slurm"]["job_id"]
    deadline = time.monotonic() + 240
    while "JobState=FAILED" not in slurm_cluster.slurm("scontrol", "show", "job", script_job).stdout:
        assert time.monotonic() < deadline, "the script's job did not end after its one requeue"
        time.sleep(3)
    pulled = run_ddpctl(slurm_cluster.bed, "pull", str(script_run), cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    end = json.loads((script_run / "run.json").read_text())["slurm"]["end"]
    assert end.startswith(f"job {script_job} TIMEOUT after 1 requeue(s) (--max-requeues 1)"), end
    assert "(Slurm: FAILED, exit 75:0)" in end
    [state] = [json.loads(p.read_text()) for p in script_run.glob("nodes/*/out/state.json")]
    assert state == {"allocations": [0, 1], "flag": True}
    status = run_ddpctl(slurm_cluster.bed, "status", str(script_run), cwd=tmp_path)
    assert status.returncode == 0 and "(requeued 1/1)" in status.stdout + status.stderr, status.stderr
