"""Multi-node runs on hosts that differ as real machines do (infra/testbed_variety.py): the nodes' interfaces are
named eth0 and ens5, each host also has a docker0 that leads nowhere, the homes are under /home and /srv, the SSH
ports 22 and 2222, python3 at a path of each host's own. `--launcher mpirun` is one MPI world across them and every
rank on every node is given the run's --env and the DDPCTL_* variables. The network between them, measured: doctor's
bus bandwidth follows a `tc` limit on one host's link, names the slowest pair, and a run's exposed communication
share rises under the limit."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed, TestHost, cleanup_stale
from tests.testbed_fixtures import REPO, TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, connect, run_ddpctl

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)

VARIED_PREFIX = "ddpvh"

# Every rank says what it was told, then the rank FAIL_RANK names (if any) fails as a write-up's fault test does.
ENV_REPORT = '''
import os
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
told = " ".join(f"{k}={os.environ.get(k)}" for k in ("FAIL_RANK", "DDPCTL_NODE_RANK", "DDPCTL_NNODES",
                                                     "DDPCTL_NPROC_PER_NODE"))
print(f"rank {rank}/{comm.Get_size()} {told}", flush=True)
comm.Barrier()
if str(rank) == os.environ.get("FAIL_RANK"):
    raise SystemExit(f"rank {rank}: failing as FAIL_RANK asks")
comm.Barrier()
print(f"rank {rank} done", flush=True)
'''


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    cleanup_stale(VARIED_PREFIX)
    with Testbed(VARIED_PREFIX, n_hosts=2, ports=[22, 2222], host_python=True, varied=True) as made:
        yield made


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("varied") / "project"
    path.mkdir()
    (path / "env_report.py").write_text(ENV_REPORT)
    return path


def up(bed: Testbed, project: Path, runs: Path, *args: str) -> tuple[int, str, Path | None]:
    hosts = [a for h in bed.hosts for a in ("--host", h.spec)]
    result = run_ddpctl(bed, "up", *hosts, "--runs-dir", str(runs), *args, cwd=project)
    made = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
    return result.returncode, result.stderr, made[0] if made else None


def mpirun_output(run: Path) -> str:
    return (run / "nodes" / "0" / "logs" / "mpirun" / "attempt_0" / "0" / "stdout.log").read_text()


def test_the_hosts_differ(bed: Testbed) -> None:
    assert [h.iface for h in bed.hosts] == ["eth0", "ens5"]
    assert [str(Path(h.home).parent) for h in bed.hosts] == ["/home", "/srv"]


def test_an_mpirun_world_across_differently_named_interfaces_gives_every_rank_the_env(bed: Testbed, project: Path,
                                                                                      tmp_path: Path) -> None:
    code, stderr, run = up(bed, project, tmp_path / "runs", "--launcher", "mpirun", "--gpus", "2",
                           "--env", "FAIL_RANK=none", "--", "python3", "env_report.py")
    assert code == 0, stderr
    assert run is not None
    log = mpirun_output(run)
    # Not line by line: mpirun forwards the ranks' output as it comes, and two ranks' lines can run together.
    lines = sorted(re.findall(r"rank (\d)/4 (FAIL_RANK=\S+ DDPCTL_NODE_RANK=\d DDPCTL_NNODES=\d "
                              r"DDPCTL_NPROC_PER_NODE=\d)", log))
    assert lines == [(str(r), f"FAIL_RANK=none DDPCTL_NODE_RANK={r // 2} DDPCTL_NNODES=2 DDPCTL_NPROC_PER_NODE=2")
                     for r in range(4)], log
    assert all(f"rank {r} done" in log for r in range(4)), log
    stderr_log = (run / "nodes" / "0" / "logs" / "mpirun" / "attempt_0" / "0" / "stderr.log").read_text()
    assert "invalid value" not in stderr_log and "could not find environment variable" not in stderr_log
    command = json.loads((run / "plan.json").read_text())["nodes"][0]["command"]
    subnet = f"{bed.hosts[0].address.rsplit('.', 1)[0]}.0/24"
    assert command[command.index("btl_tcp_if_include") + 1] == subnet
    assert command[command.index("oob_tcp_if_include") + 1] == subnet


def test_a_rank_on_the_second_node_told_to_fail_fails_the_run(bed: Testbed, project: Path, tmp_path: Path) -> None:
    """The issue's case: `--env FAIL_RANK=3` reached node 0's ranks only, and the run ended with exit 0."""
    code, stderr, run = up(bed, project, tmp_path / "runs", "--launcher", "mpirun", "--gpus", "2",
                           "--env", "FAIL_RANK=3", "--", "python3", "env_report.py")
    assert code == 1, stderr
    assert run is not None and "rank 3: failing as FAIL_RANK asks" in (
        mpirun_output(run) + (run / "nodes" / "0" / "logs" / "mpirun" / "attempt_0" / "0" / "stderr.log").read_text())


def path_without_ip(bed: Testbed, host: TestHost, path: str) -> str:
    """`path` with each folder that holds `ip` replaced by a folder of links to everything else in it: the host's
    sessions then have no `ip`, as Vast's images and the PyTorch base image have none (the file system is shared,
    so the program itself stays)."""
    folders = []
    for n, folder in enumerate(path.split(":")):
        if not os.path.exists(os.path.join(folder, "ip")):
            folders.append(folder)
            continue
        links = bed.dir / f"{host.name}-without-ip-{n}"
        links.mkdir(mode=0o755, exist_ok=True)
        for entry in os.scandir(folder):
            if entry.name != "ip" and not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry.path)
        folders.append(str(links))
    return ":".join(folders)


def test_hosts_without_ip_give_mpirun_the_network_between_them_not_an_address_each(bed: Testbed, project: Path,
                                                                                  tmp_path: Path) -> None:
    """The probe reads each address's prefix from the kernel where `ip` is missing; before, it listed no address
    there and mpirun's interfaces fell back to a /32 per node."""
    saved = [host.ssh_environment() for host in bed.hosts]
    try:
        for host, env in zip(bed.hosts, saved, strict=True):
            host.set_ssh_environment({**env, "PATH": path_without_ip(bed, host, env["PATH"])})
            with connect(bed, host) as conn:
                found = conn.run(["sh", "-c", "command -v ip || echo none; command -v python3 mpirun"])
            assert found.stdout.splitlines()[0] == "none", found.stdout
        code, stderr, run = up(bed, project, tmp_path / "runs", "--launcher", "mpirun", "--gpus", "2",
                               "--env", "FAIL_RANK=none", "--", "python3", "env_report.py")
    finally:
        for host, env in zip(bed.hosts, saved, strict=True):
            host.set_ssh_environment(env)
    assert code == 0, stderr
    assert run is not None
    plan = json.loads((run / "plan.json").read_text())
    for host, facts in zip(bed.hosts, plan["node_facts"], strict=True):
        assert {"iface": host.iface, "addr": host.address, "prefix": 24} in facts["addrs"], facts["addrs"]
    command = plan["nodes"][0]["command"]
    subnet = f"{bed.hosts[0].address.rsplit('.', 1)[0]}.0/24"
    assert command[command.index("btl_tcp_if_include") + 1] == subnet
    assert all(f"rank {r} done" in mpirun_output(run) for r in range(4)), mpirun_output(run)


TC = "/usr/sbin/tc"
LIMIT_MBIT = 50
# One short epoch: the trainer times the exposed share on its own steps after training (trainer/comm_share.py), so
# the training's length does not change it; 2,048 samples are 32 steps of all-reduce each through the held link.
SMALL_DATA = ["--dataset", "synthetic", "--epochs", "1", "--synthetic-train-size", "2048",
              "--synthetic-test-size", "256"]


@contextlib.contextmanager
def limited(host: TestHost, mbit: int) -> Iterator[None]:
    """The host's egress on its link to the others held to `mbit` Mbit/s (tbf in its namespace), then freed."""
    qdisc = ["qdisc", "add", "dev", host.iface, "root", "tbf", "rate", f"{mbit}mbit", "burst", "64kbit",
             "latency", "400ms"]
    subprocess.run([*host.nsenter(), TC, *qdisc], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*host.nsenter(), TC, "qdisc", "del", "dev", host.iface, "root"], check=True,
                       capture_output=True)


def doctor_bandwidth(bed: Testbed, hosts: list[TestHost]) -> dict[str, Any]:
    result = run_ddpctl(bed, "doctor", *(a for h in hosts for a in ("--host", h.spec)), "--bandwidth", "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_doctors_bus_bandwidth_follows_a_50_mbit_limit_on_one_hosts_link(bed: Testbed) -> None:
    free = doctor_bandwidth(bed, bed.hosts)
    with limited(bed.hosts[1], LIMIT_MBIT):
        held = doctor_bandwidth(bed, bed.hosts)
    limit_gbit = LIMIT_MBIT / 1000
    assert 0.5 * limit_gbit <= held["busbw_gbit_s"] <= 1.3 * limit_gbit, held
    assert free["busbw_gbit_s"] > 1.3 * limit_gbit, free  # the limit, not the machine, made the figure
    for found in (free, held):
        assert found["latency_ms"] > 0 and found["bandwidth"]["backend"] == "gloo"
        assert found["bandwidth"]["ifaces"] == ["eth0", "ens5"]  # the route between the nodes, not docker0
        assert found["bandwidth"]["sizes"][0]["bytes"] == 8 and found["bandwidth"]["max_bytes"] == 87_360
        sizes = found["bandwidth"]["sizes"]
        assert all(row["busbw_gbit_s"] == pytest.approx(row["bytes"] * 8 / 1e9 / (row["time_ms"] / 1e3))
                   for row in sizes)  # two nodes: busbw = algbw


def test_with_three_hosts_the_slowest_pair_is_the_one_through_the_slow_link(bed: Testbed) -> None:
    third = bed.add_host(2200)
    try:
        assert third.iface == "enp1s0"
        with limited(third, LIMIT_MBIT):
            found = doctor_bandwidth(bed, bed.hosts)
        pairs = found["bandwidth"]["pairs"]
        assert len(pairs) == 3
        assert third.spec in found["bandwidth"]["slowest_pair"]["hosts"], found["bandwidth"]
        fast = next(p for p in pairs if third.spec not in p["hosts"])
        assert fast["busbw_gbit_s"] > found["bandwidth"]["slowest_pair"]["busbw_gbit_s"]
    finally:
        bed.remove_host(third)


def test_up_records_the_bandwidth_and_the_exposed_share_rises_under_the_limit(bed: Testbed, project: Path,
                                                                            tmp_path: Path) -> None:
    found = {}
    for name, mbit in (("free", 0), ("held", LIMIT_MBIT)):
        with limited(bed.hosts[1], mbit) if mbit else contextlib.nullcontext():
            code, stderr, run = up(bed, project, tmp_path / name, "--gpus", "1", *SMALL_DATA, "--check-bandwidth")
        assert code == 0, stderr
        assert run is not None
        record = json.loads((run / "run.json").read_text())["bandwidth"]
        summary = json.loads((run / "summary.json").read_text())
        found[name] = (record["busbw_gbit_s"], summary["exposed_comm_fraction"])
        assert record["ifaces"] == ["eth0", "ens5"] and record["max_bytes"] == 87_360
        assert summary["step_ms_sync"] > 0 and summary["step_ms_no_sync"] > 0
    assert 0.5 * LIMIT_MBIT / 1000 <= found["held"][0] <= 1.3 * LIMIT_MBIT / 1000, found
    assert found["held"][1] >= found["free"][1] + 0.1, found
    # Beside one process on one host, the report says the limited link is what holds the 2-node layout back.
    one = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--runs-dir", str(tmp_path / "held"), "--gpus", "1",
                     *SMALL_DATA, cwd=project)
    assert one.returncode == 0, one.stderr
    report = subprocess.run([sys.executable, "-m", "launcher", "report",
                             *(str(p) for p in (tmp_path / "held").iterdir()), "--out", str(tmp_path / "report")],
                            capture_output=True, text=True, cwd=project, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert report.returncode == 0, report.stderr
    section = (tmp_path / "report" / "report.md").read_text().split("## Where a step's time goes", 1)[1]
    (line,) = [line for line in section.splitlines() if line.startswith("- ddp 2x1")]
    assert f"{100 * found['held'][1]:.0f}% of a step waited on communication" in line, line
    assert "measured before the run; the efficiency it allows" in line, line
    assert line.endswith(": the network limits this layout's scaling."), line
