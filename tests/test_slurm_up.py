"""`ddpctl up --provider slurm` on the real test cluster (infra/slurm_cluster.py): a 2-node job of our trainer
runs to the end and comes back verified, the script submitted is the dry run's byte for byte (saved with
--save-plan and run with --plan), a user's script
runs the same way, and each preflight refusal is one line with nothing submitted and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.slurm_cluster import DOWN_PARTITION, SHORT_PARTITION, SlurmCluster
from tests.cli_in_process import ddpctl_in_process
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import REPO, run_ddpctl

pytestmark = [pytest.mark.e2e, needs_slurm]
SMALL = ("--synthetic-train-size", "512", "--synthetic-test-size", "128")


def slurm_up(cluster: SlurmCluster, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_ddpctl(cluster.bed, "up", "--provider", "slurm", "--host", cluster.login.spec, *args, cwd=cwd,
                      timeout=timeout)


def slurm_up_in_process(cluster: SlurmCluster, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`slurm_up` in this process (no process boundary is tested), trusting the test bed's host keys."""
    return ddpctl_in_process("up", "-i", cluster.bed.client_key_path, "--provider", "slurm", "--host",
                             cluster.login.spec, *args, cwd=cwd,
                             env={"DDPCTL_KNOWN_HOSTS": str(cluster.bed.known_hosts_path)})


def submitted_jobs(cluster: SlurmCluster) -> list[str]:
    return [line.split()[0] for line in cluster.slurm("scontrol", "show", "job", "-o").stdout.splitlines()
            if line.startswith("JobId=")]


def cluster_run_folders(cluster: SlurmCluster) -> set[str]:
    """The run folders in the default workdir on the cluster's shared file system."""
    runs = Path(cluster.login.home, ".ddpctl", "slurm", "runs")
    return set(os.listdir(runs)) if runs.is_dir() else set()


def test_two_node_job_runs_to_the_end_with_the_dry_runs_script_and_verified_results(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    args = ("--nodes", "2", "--gpus", "2", "--partition", "debug", "--time", "10", "--epochs", "2", *SMALL)
    plan = tmp_path / "slurm-plan.json"
    dry = slurm_up(slurm_cluster, *args, "--dry-run", "--save-plan", str(plan), cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing here
    dry_script = dry.stdout[dry.stdout.index("#!/bin/bash"):]
    dry_id = dry_script.split("# ddpctl run ")[1].split(":")[0]
    assert json.loads(plan.read_text())["submit"]["script"] == dry_script  # the plan holds what was printed

    up = run_ddpctl(slurm_cluster.bed, "up", "--plan", str(plan), cwd=tmp_path, timeout=300)  # run as saved
    assert up.returncode == 0, up.stderr
    run = next((tmp_path / "runs").iterdir())
    assert run.name == dry_id
    record = json.loads((run / "run.json").read_text())
    job = record["slurm"]["job_id"]
    assert f"job {job} COMPLETED (exit 0:0)" in up.stderr and record["slurm"]["end"].startswith(f"job {job} COMPLETED")
    # What Slurm holds as the job's script is the saved plan's (the dry run's), byte for byte.
    held = slurm_cluster.slurm("scontrol", "write", "batch_script", job, "-").stdout
    assert held == dry_script == (run / "job.sbatch").read_text()
    again = run_ddpctl(slurm_cluster.bed, "up", "--plan", str(plan), cwd=tmp_path)  # a plan runs once
    assert again.returncode == 1 and "a plan runs once" in again.stderr, again.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["epochs"], summary["world_size"], summary["nnodes"]) == (2, 4, 2)
    timing = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    assert [t["epoch"] for t in timing] == [1, 2]
    for node in (0, 1):  # each node's snapshots (local rank 0 of every node writes one copy) and exit status
        assert sorted(p.name for p in (run / "nodes" / str(node) / "out" / "snapshots").iterdir())[-1] == \
            "snapshot-epoch-000002.pt"
        assert (run / "nodes" / str(node) / "exit_code").read_text().strip() == "0"
    assert any((run / "nodes" / str(k) / "out" / "final_model.pt").is_file() for k in (0, 1))
    assert record["slurm"]["queued_seconds"] is not None and record["slurm"]["cpu_hours"] > 0
    report = subprocess.run([sys.executable, "-m", "launcher", "report", str(run), "--json"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert report.returncode == 0, report.stderr
    [row] = json.loads(report.stdout[:report.stdout.rindex("}") + 1])["rows"]  # a row like a host run's
    assert (row["run_id"], row["layout"], row["world_size"], row["epochs"]) == (run.name, "2x2", 4, 2)
    assert row["samples_per_s"] > 0 and row["val_acc"] is not None


TUTORIAL = '''import os, json, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["DDPCTL_OUTPUT_DIR"], "sum.json"), "w") as f:
        json.dump({"sum": t.item(), "world": dist.get_world_size()}, f)
print(f"rank {dist.get_rank()} sum {t.item()}")
dist.destroy_process_group()
'''


def test_a_users_script_runs_on_two_nodes_and_its_outputs_come_back(slurm_cluster: SlurmCluster,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TUTORIAL)
    up = slurm_up(slurm_cluster, "--nodes", "2", "--gpus", "1", "--", "python", "train.py", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    run = next((tmp_path / "runs").iterdir())
    outs = [json.loads(p.read_text()) for p in run.glob("nodes/*/out/sum.json")]
    assert outs == [{"sum": 3.0, "world": 2}]  # ranks 1 + 2, written once by global rank 0
    logs = "".join(p.read_text() for p in run.glob("nodes/*/logs/**/stdout.log"))
    assert "rank 0 sum 3.0" in logs and "rank 1 sum 3.0" in logs


@pytest.mark.parametrize(("args", "named"), [
    (("--partition", "nosuch"),
     "partition 'nosuch' does not exist on the cluster: choose one of debug, short, closed, low, high"),
    (("--partition", DOWN_PARTITION), f"partition {DOWN_PARTITION} is DOWN"),
    (("--partition", SHORT_PARTITION, "--time", "5"), f"--time 5 is over partition {SHORT_PARTITION}'s MaxTime"),
    (("--nodes", "3"), "partition debug has 2 node(s), not the 3 asked with --nodes"),
    (("--gpus", "64"), "partition debug has no GPUs and at most"),
    (("--workdir", "/root/ddpctl"), "the workdir /root/ddpctl is not writable"),
    (("--python", "/usr/bin/python3"), "/usr/bin/python3 on the login node cannot import torch"),
    (("--sbatch-option", "--mem=999999999G"), "Slurm refuses the job (sbatch --test-only): "),
    (("--sbatch-option", "--mem=999999999G", "--dry-run"), "Slurm refuses the job (sbatch --test-only): "),
])
def test_each_preflight_refusal_is_one_line_with_nothing_submitted_or_written(
        slurm_cluster: SlurmCluster, tmp_path: Path, args: tuple[str, ...], named: str) -> None:
    before, folders = submitted_jobs(slurm_cluster), cluster_run_folders(slurm_cluster)
    up = slurm_up_in_process(slurm_cluster, "--nodes", "2", *args, cwd=tmp_path)
    assert up.returncode == 1
    lines = up.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], up.stderr
    assert submitted_jobs(slurm_cluster) == before
    assert not (tmp_path / "runs").exists()
    assert cluster_run_folders(slurm_cluster) == folders
