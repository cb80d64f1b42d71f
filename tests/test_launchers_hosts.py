"""`--launcher spawn` on the 2-host test bed (sshd in network namespaces, this machine's python and torch): one
world across both nodes when the script takes its place from ddpctl's variables; a refusal when it pins
localhost where that can be seen, a failure naming the separate worlds where only the run shows it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from tests.launcher_scripts import write_scripts
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, run_ddpctl

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    cleanup_stale("ddpln")
    testbed = Testbed("ddpln", n_hosts=2, ports=[22, 2222], host_python=True)
    try:
        yield testbed
    finally:
        testbed.stop()


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
