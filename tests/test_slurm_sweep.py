"""`sweep --provider slurm` on the real test cluster (infra/slurm_cluster.py): one Slurm job per layout, each
with its own allocation (--nodes 1, then 2), followed, pulled and verified like `up`'s, and the scaling report over
them written as for hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from launcher.results.sweep import load_manifest
from tests.slurm_fixtures import needs_slurm
from tests.test_sweep import TINY, check_report, sweep_dir_in
from tests.testbed_fixtures import run_ddpctl

pytestmark = [pytest.mark.e2e, needs_slurm]


def test_a_sweep_runs_one_job_per_layout_and_reports_over_them(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    sweep = run_ddpctl(slurm_cluster.bed, "sweep", "--provider", "slurm", "--host", slurm_cluster.login.spec,
                       "--gpus", "1", "--nodes", "1,2", "--time", "10", *TINY, "--no-progress", cwd=tmp_path,
                       timeout=600)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    sweep_dir = sweep_dir_in(tmp_path / "runs")
    entries = load_manifest(sweep_dir)["entries"]
    assert [(e["nnodes"], e["status"]) for e in entries] == [(1, "done"), (2, "done")]
    jobs = []
    for entry in entries:
        record = json.loads((sweep_dir / entry["run_dir"] / "run.json").read_text())
        assert record["provider"] == "slurm" and record["slurm"]["end"].startswith(f"job {record['slurm']['job_id']} "
                                                                                  "COMPLETED")
        jobs.append(record["slurm"]["job_id"])
        script = (sweep_dir / entry["run_dir"] / "job.sbatch").read_text()
        assert f"#SBATCH --nodes={entry['nnodes']}\n" in script and "#SBATCH --time=10\n" in script
        assert sorted(p.name for p in (sweep_dir / entry["run_dir"] / "nodes").iterdir()) == \
            [str(k) for k in range(entry["nnodes"])]  # every node's folder pulled
    assert len(set(jobs)) == 2  # one job per layout
    check_report(sweep_dir)
