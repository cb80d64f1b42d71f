"""The test cluster itself (infra/slurm_cluster.py): real slurmctld and slurmd run jobs across the test bed's
hosts, submitted over SSH on the login node, and stopping the cluster leaves nothing behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from infra.testbed import Testbed, netns_pids, read_pid
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import connect

pytestmark = pytest.mark.e2e

JOB = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --output=hello-%j.out
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c 'echo "node $SLURM_NODEID on $(hostname) reaches $0 at $(getent hosts "$0" | cut -d" " -f1)"' "$first"
"""


@needs_slurm
def test_two_node_job_runs_on_both_compute_hosts(slurm_cluster: SlurmCluster) -> None:
    login = slurm_cluster.login
    with connect(slurm_cluster.bed, login) as conn:
        info = conn.run(["sinfo", "-h", "-N", "-p", slurm_cluster.partition, "-o", "%N %T"])
        assert info.ok, info.stderr
        assert sorted(info.stdout.split()) == sorted([*slurm_cluster.node_names, "idle", "idle"])
        submitted = conn.run(["sbatch", "--parsable"], stdin=JOB.encode())
        assert submitted.ok, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    out = Path(login.home, f"hello-{job}.out")
    deadline = time.monotonic() + 60
    while "COMPLETED" not in slurm_cluster.slurm("scontrol", "show", "job", job, "-o").stdout:
        assert time.monotonic() < deadline, slurm_cluster.slurm("scontrol", "show", "job", job, "-o").stdout
        time.sleep(0.5)
    first = slurm_cluster.nodes[0]
    lines = sorted(out.read_text().splitlines())
    assert lines == [f"node {k} on {node.name} reaches {first.name} at {first.address}"
                     for k, node in enumerate(slurm_cluster.nodes)]


@needs_slurm
def test_stop_leaves_no_daemon_and_no_namespace() -> None:
    with Testbed("ddpslx", n_hosts=2) as bed:
        cluster = SlurmCluster(bed)
        pids = [pid for pid, _ in cluster.state.pids.values()]
        assert cluster.node_state(bed.hosts[1].name) == "idle"
        cluster.stop()
        assert all(not Path(f"/proc/{pid}/exe").exists() for pid in pids)
        sshds = {read_pid(Path(host.dir, "sshd.pid")) for host in bed.hosts}
        left = [pid for host in bed.hosts for pid in netns_pids(host.netns) if pid not in sshds]
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
        assert not cluster.dir.exists()
        assert cluster.state.cgroups == [] or not any(Path(c).exists() for c in cluster.state.cgroups)
        assert "SLURM_CONF" not in bed.hosts[0].ssh_environment()
