"""How real Slurm jobs end, on the real test cluster (infra/slurm_cluster.py), each named in one line by `up` and
by `status`, with exit != 0 and what the job wrote pulled: a rank that fails (FAILED, the first failing rank and
its node named), a process over the job's --mem (killed by the kernel in the job's memory cgroup), a job preempted
by a higher-priority partition (PREEMPTED), and a job held in the queue (JobHeldUser, the time waited), released,
running past its --time (TIMEOUT)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from infra.slurm_cluster import HIGH_PARTITION, LOW_PARTITION, SlurmCluster
from tests.cli_runner import ddpctl_argv, ddpctl_env
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import run_ddpctl

pytestmark = [pytest.mark.e2e, needs_slurm]

# One script for every case: `python job.py MODE`. Rank 0 says each second that it is alive and keeps a count in
# its output folder (what was written, pulled); MODE decides how the job ends.
JOB = '''import os, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
rank, mode = dist.get_rank(), sys.argv[1]
dist.barrier()
if rank == 1 and mode == "fail":
    print("rank 1 gives up", flush=True)
    sys.exit(1)
if rank == 1 and mode == "oom":
    hog = []
    while True:  # touch every page: resident memory grows past the job's --mem
        hog.append(bytearray(64 * 2**20))
        hog[-1][::4096] = b"x" * (len(hog[-1]) // 4096)
for tick in range(1, 600):
    if rank == 0:
        print(f"tick {tick}", flush=True)
        with open(os.path.join(os.environ["DDPCTL_OUTPUT_DIR"], "ticks.txt"), "w") as f:
            f.write(str(tick))
    time.sleep(1)
'''


def up_argv(cluster: SlurmCluster, *args: str) -> list[str]:
    return ["up", "--provider", "slurm", "--host", cluster.login.spec, "--nodes", "2", "--gpus", "1", *args]


def only_run(runs: Path) -> Path:
    [run] = list(runs.iterdir())
    return run


def ddpctl_popen(cluster: SlurmCluster, argv: list[str], cwd: Path, err: Path) -> subprocess.Popen[bytes]:
    env = ddpctl_env(known_hosts=cluster.bed.known_hosts_path)
    with open(err, "w") as f:
        return subprocess.Popen(ddpctl_argv(argv[0], "-i", cluster.bed.client_key_path, *argv[1:]), cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=f)


def wait_for_text(proc: subprocess.Popen[bytes], err: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in err.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.5)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:  # a failed check leaves no ddpctl behind
        proc.kill()
        proc.wait()


def outcome(cluster: SlurmCluster, run: Path, cwd: Path) -> tuple[dict, str]:
    """run.json, and the outcome as `status` tells it (its failure line; every node's row in the end state)."""
    shown = run_ddpctl(cluster.bed, "status", str(run), "--json", cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    answer = json.loads(shown.stdout)
    record = json.loads((run / "run.json").read_text())
    state = record["failure"]["slurm_state"]
    slurm_state = "FAILED" if state == "OUT_OF_MEMORY" else state  # Slurm's own word for the job
    assert [row["state"].split()[0] for row in answer["nodes"]] == [slurm_state] * 2, answer
    return record, answer["failure"]["summary"]


def test_a_failing_rank_restarts_then_ends_the_job_failed_naming_that_rank_and_its_node(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    args = ("--max-restarts", "1", "--", "python", "job.py", "fail")
    up = run_ddpctl(slurm_cluster.bed, *up_argv(slurm_cluster, *args), cwd=tmp_path)
    assert up.returncode == 1, up.stderr
    run = only_run(tmp_path / "runs")
    record, told = outcome(slurm_cluster, run, tmp_path)
    job = record["slurm"]["job_id"]
    assert f"job {job} FAILED (exit " in up.stderr  # srun's status: the highest of its tasks' (143: SIGTERM)
    failure = record["failure"]
    assert failure["rank"] == 1 and "rank 1" in failure["summary"], failure
    node = failure["node"]  # the node that held rank 1, by its exit status and its own ChildFailedError report
    assert (run / "nodes" / str(node) / "exit_code").read_text().strip() == "1"
    host = slurm_cluster.node_names[node]  # SLURM_NODEID k is the allocation's k-th node
    assert f"rank 1 on node {node} ({host}) exited with 1" in failure["summary"] and told == failure["summary"]
    assert up.stderr.strip().splitlines()[-1].startswith(f"error: training failed: {failure['summary']}")
    # Restarts numbered as on hosts: every node's workers started twice, attempt_0 and attempt_1, both kept.
    for k in (0, 1):
        assert sorted(p.name for p in run.glob(f"nodes/{k}/logs/*/attempt_*")) == ["attempt_0", "attempt_1"]
    status = json.loads(run_ddpctl(slurm_cluster.bed, "status", str(run), "--json", cwd=tmp_path).stdout)
    assert [row["restarts"] for row in status["nodes"]] == [1, 1]
    assert json.loads((run / "summary.json").read_text())["restarts"] == 1
    for attempt in ("0", "1"):  # rank 1's own output in each attempt
        logs = run_ddpctl(slurm_cluster.bed, "logs", str(run), "--rank", "1", "--attempt", attempt, cwd=tmp_path)
        assert logs.returncode == 0 and "rank 1 gives up" in logs.stdout, logs.stderr


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory/cgroup.procs", os.W_OK),
                    reason="no writable cgroup v1 memory hierarchy: the test cluster cannot enforce --mem here")
def test_a_rank_over_the_jobs_memory_is_killed_and_named_out_of_memory(slurm_cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    args = ("--sbatch-option", "--mem=1G", "--", "python", "job.py", "oom")
    up = run_ddpctl(slurm_cluster.bed, *up_argv(slurm_cluster, *args), cwd=tmp_path)
    assert up.returncode == 1, up.stderr
    run = only_run(tmp_path / "runs")
    record, told = outcome(slurm_cluster, run, tmp_path)
    job = record["slurm"]["job_id"]
    failure = record["failure"]
    job_output = (run / f"slurm-{job}.out").read_text()
    assert failure["slurm_state"] == "OUT_OF_MEMORY" and failure["rank"] == 1, f"{failure}\n{job_output}"
    assert f"job {job} OUT_OF_MEMORY: step {job}.0 ran out of memory" in up.stderr, up.stderr
    assert told == failure["summary"] and "rank 1" in told and "SIGKILL" in told, told
    assert up.stderr.strip().splitlines()[-1].startswith(f"error: training failed: {failure['summary']}")
    # Slurm's own word, pulled with the rest: srun's "Out Of Memory" for the task, and slurmstepd's oom-kill note
    # where it reached srun before the step's output closed (it does not always)
    assert "task 1: Out Of Memory" in job_output or "oom-kill" in job_output, job_output


def test_a_job_in_a_low_partition_is_preempted_by_a_high_one(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    err = tmp_path / "up.err"
    up = ddpctl_popen(slurm_cluster, up_argv(slurm_cluster, "--partition", LOW_PARTITION, "--", "python", "job.py",
                                             "run"), tmp_path, err)
    high = None
    try:
        wait_for_text(up, err, "tick 2", 120)  # rank 0's own output, live
        high = slurm_cluster.slurm("sbatch", "--parsable", f"--partition={HIGH_PARTITION}", "--nodes=2",
                                   "--exclusive", "--chdir=/tmp", "--output=/dev/null", "--wrap", "sleep 600")
        assert up.wait(timeout=120) == 1, err.read_text()
    finally:
        stop(up)
        if high is not None:
            slurm_cluster.slurm("scancel", high.stdout.strip())
    run = only_run(tmp_path / "runs")
    record, told = outcome(slurm_cluster, run, tmp_path)
    job = record["slurm"]["job_id"]
    assert f"job {job} PREEMPTED: was preempted" in err.read_text()
    assert record["failure"]["slurm_state"] == "PREEMPTED" and told.startswith(f"job {job} PREEMPTED")
    assert err.read_text().strip().splitlines()[-1].startswith(f"error: training failed: {told}")
    assert int((run / "nodes" / "0" / "out" / "ticks.txt").read_text()
               if (run / "nodes" / "0" / "out" / "ticks.txt").is_file()
               else (run / "nodes" / "1" / "out" / "ticks.txt").read_text()) >= 2


def test_a_held_job_waits_with_its_reason_then_runs_into_its_time_limit(slurm_cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    err = tmp_path / "up.err"
    up = ddpctl_popen(slurm_cluster, up_argv(slurm_cluster, "--time", "1", "--sbatch-option", "--hold", "--",
                                             "python", "job.py", "run"), tmp_path, err)
    try:
        wait_for_text(up, err, "pending: JobHeldUser (waited ", 120)
        time.sleep(3)  # held a while: the time waited grows
        job = json.loads((only_run(tmp_path / "runs") / "run.json").read_text())["slurm"]["job_id"]
        slurm_cluster.slurm("scontrol", "release", job)
        wait_for_text(up, err, "tick 3", 120)  # released, it runs: rank 0's output, live
        assert up.wait(timeout=180) == 1, err.read_text()  # Slurm's time limit: 1 minute, checked every 30 s
    finally:
        stop(up)
    shown = err.read_text()
    run = only_run(tmp_path / "runs")
    record, told = outcome(slurm_cluster, run, tmp_path)
    held = [line for line in shown.splitlines() if "pending: JobHeldUser (waited " in line]
    assert held, shown
    assert f"job {job} TIMEOUT: hit its time limit" in shown and told.startswith(f"job {job} TIMEOUT")
    assert record["slurm"]["queued_seconds"] >= 3  # the time held is the time queued
    assert shown.strip().splitlines()[-1].startswith(f"error: training failed: {told}")
    states = [e["state"] for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
              if e["event"] == "job_state"]
    # COMPLETING: Slurm signalled the script and waits for it to end (the node's shell outlives it to record how)
    assert states in (["PENDING", "RUNNING"], ["PENDING", "RUNNING", "COMPLETING"]), states
    ticks = [int(p.read_text()) for p in run.glob("nodes/*/out/ticks.txt")]
    assert ticks and ticks[0] >= 3  # what rank 0 wrote came back
    assert record["slurm"]["run_seconds"] >= 60  # it ran until Slurm ended it, past its one minute
