"""A script that knows nothing of ddpctl on the real test cluster, with `--requeue`: `--env` reaches every rank from a
file of mode 0600 (never in the script's text nor the dry run), the world size is measured by the join hook, a
script that ignores the time limit's signal ends in a TIMEOUT that names the signal and the handler to add, and the
time trained counts the allocation Slurm cut at its limit. The repository's example handler
(examples/slurm_requeue.py) runs through a requeue chain to the end, beside it (the cluster's nodes have a CPU
each to spare for a second 2-node job), and a script whose time limit's signal lands just as it finishes is not
requeued (it ends 0 without the requeue mark: finished)."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import REPO, run_ddpctl

pytestmark = [pytest.mark.e2e, needs_slurm]
SECRET = "hunter2-do-not-print"
STEPS = 600  # 0.1 s each (the example's --step-seconds): over a minute, more than the first allocation trains

# Plain torchrun DDP: what torchrun gives, a world, and a wait that only the time limit ends (SIGUSR1 is ignored).
PLAIN = '''import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: X={os.environ.get('X')}", flush=True)
while True:
    time.sleep(1)
'''

# Done, then the time limit's signal as Slurm sends it (to the batch shell alone, which passes it on) right as it
# ends: a handler that sets a flag, as many scripts have, and an exit 0 with no requeue mark once it came.
RACER = '''import os, signal, subprocess, time
came = []
signal.signal(signal.SIGUSR1, lambda *_: came.append(time.time()))
print("work done", flush=True)
subprocess.run(["scancel", "--batch", "--signal=USR1", os.environ["SLURM_JOB_ID"]], check=True)
deadline = time.monotonic() + 60
while not came and time.monotonic() < deadline:
    time.sleep(0.1)
print(f"signalled: {bool(came)}", flush=True)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
'''


def slurm(cluster: SlurmCluster, *args: str, cwd: Path, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return run_ddpctl(cluster.bed, *args[:1], "--provider", "slurm", "--host", cluster.login.spec, *args[1:], cwd=cwd,
                      timeout=timeout)


def stdout_of(run: Path) -> str:
    return "".join(p.read_text() for p in sorted(run.glob("nodes/*/logs/**/stdout.log")))


@pytest.mark.timeout(1200)  # the plain job (about 2 minutes), then the rest of the example's chain (up to 10)
def test_a_plain_script_gets_env_a_measured_world_and_a_timeout_that_names_the_signal_and_the_fix(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    chain_dir, plain_dir, racer_dir = tmp_path / "example", tmp_path / "plain", tmp_path / "racer"
    for folder in (chain_dir, plain_dir, racer_dir):
        folder.mkdir()
    (racer_dir / "racer.py").write_text(RACER)
    shutil.copy(REPO / "examples" / "slurm_requeue.py", chain_dir)
    (plain_dir / "plain.py").write_text(PLAIN)
    # The example handler: 60 s of steps at least, more than the first allocation of a two-minute limit trains
    # (Slurm checks limits every 30 s: the signal asked 60 s before the limit comes 30 to 60 s in, as seen on the
    # test cluster, and the script takes seconds to start); each next allocation resumes where the last stopped.
    detached = slurm(slurm_cluster, "up", "--nodes", "2", "--gpus", "1", "--time", "2", "--max-requeues", "5",
                     "--detach", "--", "python", "slurm_requeue.py", "--steps", str(STEPS), cwd=chain_dir)
    assert detached.returncode == 0, detached.stderr
    racing = slurm(slurm_cluster, "up", "--nodes", "1", "--gpus", "1", "--time", "5", "--max-requeues", "1",
                   "--detach", "--", "python", "racer.py", cwd=racer_dir)
    assert racing.returncode == 0, racing.stderr

    args = ("--nodes", "2", "--gpus", "1", "--requeue", "--max-requeues", "1", "--time", "0:01:00", "--env", "X=1",
            "--env", f"TOKEN={SECRET}", "--", "python", "plain.py")
    dry = slurm(slurm_cluster, "up", *args[:-3], "--dry-run", *args[-3:], cwd=plain_dir)
    assert dry.returncode == 0, dry.stderr
    # The sbatch line and the script first (stdout); the notes beside them (stderr), the handler's warning among them.
    assert dry.stdout.startswith("# sbatch line: sbatch --parsable ") and "\n#!/bin/bash\n" in dry.stdout
    assert "warning: --requeue: plain.py has no SIGUSR1 handler in sight" in dry.stderr
    assert ". ./ddpctl.env" in dry.stdout and SECRET not in dry.stdout + dry.stderr

    up = slurm(slurm_cluster, "up", *args, cwd=plain_dir)
    assert up.returncode == 1, up.stderr
    assert SECRET not in up.stdout + up.stderr
    run = next((plain_dir / "runs").iterdir())
    record = json.loads((run / "run.json").read_text())["slurm"]
    job = record["job_id"]
    # --env: on every rank, from a file only its owner reads; never in the script Slurm holds.
    assert sorted(stdout_of(run).splitlines()) == ["rank 0 of 2: X=1", "rank 1 of 2: X=1"]
    env_file = Path(record["remote_dir"]) / "ddpctl.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and SECRET in env_file.read_text()
    held = slurm_cluster.slurm("scontrol", "write", "batch_script", job, "-").stdout
    assert held == (run / "job.sbatch").read_text() and SECRET not in held
    assert not [p for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    # The world size is measured (the join hook), not planned.
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["world_size"], summary["world_measured"], summary["processes"]) == (2, True, 2)
    # The outcome: the signal came, nothing followed, what to add.
    end = record["end"]
    assert end.startswith(f"job {job} TIMEOUT (exit "), end
    assert "SIGUSR1 came at " in end and "no snapshot followed" in end and "examples/slurm_requeue.py" in end
    assert end in up.stderr
    # The allocation Slurm cut at its limit counts: its time from Slurm (StartTime to EndTime), at least the limit.
    assert record["allocations"] == 1 and record["trained_from"] == "requeue/chain and scontrol"
    assert record["trained_seconds"] >= 55
    cpus = record["status"]["cpus"]
    assert cpus and record["cpu_hours"] == round(cpus * record["trained_seconds"] / 3600, 4)

    # The example handler's chain: requeued at each limit, resumed each time, completed.
    chain_run = next((chain_dir / "runs").iterdir())
    chain_job = json.loads((chain_run / "run.json").read_text())["slurm"]["job_id"]
    deadline = time.monotonic() + 600
    while "JobState=COMPLETED" not in slurm_cluster.slurm("scontrol", "show", "job", chain_job).stdout:
        assert "JobState=FAILED" not in slurm_cluster.slurm("scontrol", "show", "job", chain_job).stdout
        assert time.monotonic() < deadline, "the example's chain did not complete"
        time.sleep(3)
    pulled = run_ddpctl(slurm_cluster.bed, "pull", str(chain_run), cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    chained = json.loads((chain_run / "run.json").read_text())["slurm"]
    assert chained["end"].startswith(f"job {chain_job} COMPLETED (exit 0:0) after {chained['allocations']} "), chained
    assert chained["allocations"] >= 2 and chained["requeues"] == chained["allocations"] - 1
    assert chained["trained_seconds"] > 0 and chained["cpu_hours"] > 0
    finished = [json.loads(line.split("allocations' steps ")[1]) for line in stdout_of(chain_run).splitlines()
                if f"finished at step {STEPS}" in line]
    # Both ranks of the last allocation, once: a finished script is not run again.
    assert len(finished) == 2 and finished[0] == finished[1], stdout_of(chain_run)
    steps = finished[0]
    # Every allocation went on from where the one before stopped and trained: no step lost or done twice.
    assert len(steps) == chained["allocations"] and steps[0][0] == 0 and steps[-1][1] == STEPS
    assert all(before[1] == after[0] for before, after in zip(steps, steps[1:], strict=False))
    assert all(first < last for first, last in steps), steps

    # The signal that landed as the racer finished: one allocation, completed, not requeued, and told.
    racer_run = next((racer_dir / "runs").iterdir())
    racer_job = json.loads((racer_run / "run.json").read_text())["slurm"]["job_id"]
    deadline = time.monotonic() + 300
    while "JobState=COMPLETED" not in (shown := slurm_cluster.slurm("scontrol", "show", "job", racer_job).stdout):
        assert "JobState=FAILED" not in shown and time.monotonic() < deadline, shown
        time.sleep(2)
    assert "Restarts=0" in shown, shown  # never requeued
    assert run_ddpctl(slurm_cluster.bed, "pull", str(racer_run), cwd=tmp_path).returncode == 0
    raced = json.loads((racer_run / "run.json").read_text())["slurm"]
    assert raced["end"].startswith(f"job {racer_job} COMPLETED (exit 0:0) after 1 allocation(s) (0 requeue(s))")
    assert "SIGUSR1 came at " in raced["end"] and "taken as finished" in raced["end"], raced["end"]
    assert stdout_of(racer_run).splitlines() == ["work done", "signalled: True"]
    events = [line.split()[1] for line in (racer_run / "requeue" / "chain").read_text().splitlines()]
    assert events == ["start", "signal", "end", "finished"], events

SPAWNS = '''import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(local, nproc):
    nnodes, node = int(os.environ["DDPCTL_NNODES"]), int(os.environ["DDPCTL_NODE_RANK"])
    where = f"tcp://{os.environ['DDPCTL_MASTER_ADDR']}:{os.environ['DDPCTL_MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=where, rank=node * nproc + local, world_size=nnodes * nproc)
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()}: sum {total.item():.0f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(int(os.environ["DDPCTL_NPROC_PER_NODE"]),), nprocs=int(os.environ["DDPCTL_NPROC_PER_NODE"]))
'''


def test_a_spawn_script_runs_once_per_node_and_its_processes_form_one_world(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "spawns.py").write_text(SPAWNS)
    up = slurm(slurm_cluster, "up", "--nodes", "2", "--gpus", "2", "--launcher", "spawn", "--time", "5", "--",
               "python", "spawns.py", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    run = next((tmp_path / "runs").iterdir())
    record = json.loads((run / "run.json").read_text())["slurm"]
    assert record["end"].startswith(f"job {record['job_id']} COMPLETED (exit 0:0)")
    # One task per node ran the script once; its own processes (2 a node) made one world of 4, measured.
    assert sorted(stdout_of(run).splitlines()) == [f"rank {r}: sum 4" for r in range(4)]
    assert len(list(run.glob("nodes/*/logs/spawn/attempt_0/0/stdout.log"))) == 2
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["world_size"], summary["processes"], summary["worlds"]) == (4, 4, 1)


MPI_SCRIPT = '''import os
from mpi4py import MPI

world = MPI.COMM_WORLD
total = world.allreduce(1)
print(f"rank {world.Get_rank()} of {world.Get_size()} on node {os.environ['DDPCTL_NODE_RANK']}: sum {total}, "
      f"X={os.environ.get('X')}", flush=True)
'''


def test_an_mpi_script_runs_under_srun_pmix_inside_the_allocation_as_one_world(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "mpi_sum.py").write_text(MPI_SCRIPT)
    up = slurm(slurm_cluster, "up", "--nodes", "2", "--gpus", "2", "--launcher", "mpirun", "--time", "5",
               "--env", "X=1", "--", "python", "mpi_sum.py", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    run = next((tmp_path / "runs").iterdir())
    record = json.loads((run / "run.json").read_text())["slurm"]
    assert record["end"].startswith(f"job {record['job_id']} COMPLETED (exit 0:0)")
    # The cluster's Slurm has its pmix plugin and Open MPI is a PMIx client (Debian's, built against the same libpmix):
    # srun --mpi=pmix started 2 ranks on each node, one world of 4.
    said = (run / f"slurm-{record['job_id']}.out").read_text()
    assert "ddpctl: the MPI ranks are started by srun --mpi=pmix (DDPCTL_SLURM_MPI=pmix)\n" in said, said
    output = (run / "nodes" / "0" / "logs" / "mpirun" / "attempt_0" / "0" / "stdout.log").read_text()
    # srun forwards the ranks' output in chunks, which may interleave mid-line: each rank's line is found whole.
    said = sorted(re.findall(r"rank \d of 4 on node \d: sum 4, X=1", output))
    assert said == [f"rank {r} of 4 on node {r // 2}: sum 4, X=1" for r in range(4)], output
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["world_size"], summary["processes"], summary["worlds"]) == (4, 4, 1)


def test_a_failing_mpi_rank_fails_the_job_with_mpiruns_own_account(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text('''from mpi4py import MPI
world = MPI.COMM_WORLD
if world.Get_rank() == 3:
    raise RuntimeError("rank 3 gives up")
world.barrier()
''')
    # Open MPI's own mpirun in the batch shell, as asked (its daemons started through srun).
    up = slurm(slurm_cluster, "up", "--nodes", "2", "--gpus", "2", "--launcher", "mpirun", "--time", "5",
               "--env", "DDPCTL_SLURM_MPI=mpirun", "--", "python", "fails.py", cwd=tmp_path)
    assert up.returncode == 1 and "error: training failed: mpirun on node 0 (" in up.stderr, up.stderr
    run = next((tmp_path / "runs").iterdir())
    said = (run / f"slurm-{json.loads((run / 'run.json').read_text())['slurm']['job_id']}.out").read_text()
    assert "ddpctl: the MPI ranks are started by Open MPI's mpirun (DDPCTL_SLURM_MPI=mpirun)\n" in said, said
    failure = json.loads((run / "run.json").read_text())["failure"]
    assert failure["slurm_state"] == "FAILED" and failure["summary"].startswith("mpirun on node 0 (")
    assert failure["summary"].endswith("exited with 1: RuntimeError: rank 3 gives up"), failure["summary"]
    assert "RuntimeError: rank 3 gives up" in failure["explain"]  # the rank's traceback, as mpirun passed it on
