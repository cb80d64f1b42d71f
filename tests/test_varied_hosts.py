"""Multi-node runs on hosts that differ as real machines do (infra/testbed_variety.py): the nodes' interfaces are
named eth0 and ens5, each host also has a docker0 that leads nowhere, the homes are under /home and /srv, the SSH
ports 22 and 2222, python3 at a path of each host's own. `--launcher mpirun` is one MPI world across them and every
rank on every node is given the run's --env and the DDPCTL_* variables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, run_ddpctl

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
    lines = sorted(re.findall(r"^rank (\d)/4 (.*)$", log, re.MULTILINE))
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
