"""`--launcher spawn` and `--launcher mpirun` on the 2-host test bed (sshd in network namespaces, this machine's
python and torch). spawn: one world across both nodes when the script takes its place from ddpctl's variables; a
refusal when it pins localhost where that can be seen, a failure naming the separate worlds where only the run
shows it. mpirun: one MPI world across both hosts, the run's key gone afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from tests.launcher_scripts import write_scripts
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent, run_ddpctl

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scripts(tmp_path_factory.mktemp("launchers") / "project")


def up(bed: Testbed, project: Path, runs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    hosts = [a for h in bed.hosts for a in ("--host", h.spec)]
    return run_ddpctl(bed, "up", *hosts, "--runs-dir", str(runs), *args, cwd=project)


def the_run(runs: Path) -> Path:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


def joins(run: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(run.glob("nodes/*/logs/joined/*.json"))]


def test_a_spawn_script_on_ddpctls_variables_is_one_world_across_both_nodes(bed: Testbed, project: Path,
                                                                           tmp_path: Path) -> None:
    result = up(bed, project, tmp_path / "runs", "--launcher", "spawn", "--gpus", "2", "--json",
                "--", "python3", "spawn_ddpctl.py")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["world_size"] == 4 and summary["processes"] == 4 and summary["worlds"] == 1
    run = the_run(tmp_path / "runs")
    records = joins(run)
    assert sorted((j["rank"], j["node"]) for j in records) == [(0, "0"), (1, "0"), (2, "1"), (3, "1")]
    assert {j["world_size"] for j in records} == {4} and len({j["where"] for j in records}) == 1
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):  # each node's own processes trained, in the world of 4
        log = (run / "nodes" / str(node) / "logs" / "spawn" / "attempt_0" / "0" / "stdout.log").read_text()
        assert all(f"rank {r}/4 step 19 loss" in log and f"rank {r} done" in log for r in ranks), log
    assert (run / "nodes" / "0" / "out" / "model.pt").stat().st_size > 0  # rank 0's file, pulled
    plan = json.loads((run / "plan.json").read_text())
    assert plan["launcher"] == "spawn"
    env0, env1 = (node["env"] for node in plan["nodes"])
    assert env0["DDPCTL_MASTER_ADDR"] == env1["DDPCTL_MASTER_ADDR"] == plan["nodes"][0]["address"]
    assert (env0["DDPCTL_NODE_RANK"], env1["DDPCTL_NODE_RANK"]) == ("0", "1") and env1["DDPCTL_NNODES"] == "2"
    assert "MASTER_ADDR" not in env0  # one node only: several nodes must not meet at a guess


def test_a_spawn_script_pinned_to_localhost_is_refused_on_two_nodes(bed: Testbed, project: Path,
                                                                  tmp_path: Path) -> None:
    result = up(bed, project, tmp_path / "runs", "--launcher", "spawn", "--", "python3", "spawn_localhost.py")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: spawn_localhost.py:") and "pins the process group to this machine" in line
    assert "$DDPCTL_MASTER_ADDR" in line and not (tmp_path / "runs").exists()


def test_localhost_hidden_in_an_import_fails_the_run_naming_its_separate_worlds(bed: Testbed, project: Path,
                                                                               tmp_path: Path) -> None:
    result = up(bed, project, tmp_path / "runs", "--launcher", "spawn", "--", "python3", "spawn_hidden.py")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the run did not train as one world: 4 process(es) in 2 separate worlds "
                           "(world size 2) on nodes 0, 1, each meeting at localhost:12355"), result.stderr
    summary = json.loads((the_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["world_size"] is None and summary["processes"] == 4 and summary["world_failed"] is True


def test_the_issues_two_host_torchrun_case_is_no_longer_a_silent_success(bed: Testbed, project: Path,
                                                                         tmp_path: Path) -> None:
    """`--gpus 1` on two hosts with a write-up's spawn script: two independent trainings used to end with exit 0
    and "world size 2"; torchrun chosen outright, it now warns first and fails after, with the measured worlds."""
    result = up(bed, project, tmp_path / "runs", "--launcher", "torchrun", "--gpus", "1",
                "--", "python3", "spawn_localhost.py")
    assert result.returncode == 1
    assert result.stderr.startswith("warning: spawn_localhost.py:")
    assert "4 process(es) in 2 separate worlds (world size 2) on nodes 0, 1" in result.stderr.strip().splitlines()[-1]


def authorized_keys(host: object) -> str:
    path = Path(host.home, ".ssh", "authorized_keys")
    return path.read_text() if path.exists() else ""


def test_an_mpi4py_script_is_one_mpi_world_across_both_hosts_and_the_runs_key_is_gone(bed: Testbed, project: Path,
                                                                                        tmp_path: Path) -> None:
    before = [authorized_keys(h) for h in bed.hosts]
    result = up(bed, project, tmp_path / "runs", "--launcher", "mpirun", "--gpus", "2", "--json",
                "--", "python3", "parallel_sgd.py")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["world_size"] == 4 and summary["processes"] == 4 and summary["worlds"] == 1
    run = the_run(tmp_path / "runs")
    records = joins(run)
    assert sorted((j["kind"], j["rank"], j["world_size"], j["node"]) for j in records) == [
        ("mpi", 0, 4, "0"), ("mpi", 1, 4, "0"), ("mpi", 2, 4, "1"), ("mpi", 3, 4, "1")]
    log = (run / "nodes" / "0" / "logs" / "mpirun" / "attempt_0" / "0" / "stdout.log").read_text()
    assert all(f"rank {r}/4 epoch 3/3 loss" in log for r in range(4)), log
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    access = [e for e in events if e["event"] == "mpi_access"]
    assert len(access) == 1 and access[0]["pinned"] == ["ddpctl-node-1"]
    assert any(e["event"] == "mpi_access_removed" and e["left"] == [] for e in events)
    # The run's key is gone from every host and node 0's access files with it; nothing else was touched.
    assert [authorized_keys(h) for h in bed.hosts] == before
    assert not Path(bed.hosts[0].home, ".ddpctl", "runs", run.name, "mpi").exists()
    plan = json.loads((run / "plan.json").read_text())
    command = plan["nodes"][0]["command"]
    assert "StrictHostKeyChecking=no" not in " ".join(command) and "plm_rsh_args" in command



def test_a_failed_mpi_job_also_removes_the_runs_key(bed: Testbed, project: Path, tmp_path: Path) -> None:
    (project / "mpi_fail.py").write_text("from mpi4py import MPI\n"
                                         "if MPI.COMM_WORLD.Get_rank() == 3:\n"
                                         "    raise ValueError('rank 3 gives up')\n"
                                         "MPI.COMM_WORLD.Barrier()\n")
    before = [authorized_keys(h) for h in bed.hosts]
    result = up(bed, project, tmp_path / "runs", "--launcher", "mpirun", "--gpus", "2",
                "--", "python3", "mpi_fail.py")
    assert result.returncode == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "mpirun on node 0 (" in error, result.stderr
    run = the_run(tmp_path / "runs")
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "mpi_access_removed" and e["left"] == [] for e in events)
    assert [authorized_keys(h) for h in bed.hosts] == before
    assert not Path(bed.hosts[0].home, ".ddpctl", "runs", run.name, "mpi").exists()


def test_a_host_python_without_mpi4py_is_named_in_one_line(bed: Testbed, project: Path, tmp_path: Path) -> None:
    venv = Path(tempfile.mkdtemp(prefix="ddpctl-nompi-"))
    try:
        # From the hosts' copy of this machine's python (this one lives under /root, closed to the hosts' users).
        shared = Path(bed.host_env["PATH"].split(":")[0], "python3")
        subprocess.run([str(shared), "-m", "venv", "--without-pip", str(venv)], check=True,
                       env={**os.environ, "LD_LIBRARY_PATH": bed.host_env["LD_LIBRARY_PATH"]})
        os.chmod(venv, 0o755)
        result = up(bed, project, tmp_path / "runs", "--launcher", "mpirun", "--python", str(venv / "bin" / "python"),
                    "--", "python3", "parallel_sgd.py")
    finally:
        shutil.rmtree(venv)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "mpi4py" in line]
    assert len(lines) == 2, result.stderr  # one line per host
    for host, line in zip(bed.hosts, lines, strict=True):
        assert line.strip().startswith(f"{host.spec}: --launcher mpirun needs mpi4py (") and "pip install" in line
