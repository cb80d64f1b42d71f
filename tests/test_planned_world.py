"""A run whose measured world is not its planned one never exits 0: the built-in trainer's summary against the
plan (the clock-skew case: node 1 left the rendezvous, node 0 trained alone with world size 1), a trainer that wrote
no summary (`--python /bin/true`), a `-- CMD` world smaller than planned; and `up --` with nothing after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.cli.app import refuse_empty_command
from launcher.errors import SpecError
from launcher.results.joined_worlds import JoinRecord, MeasuredWorlds, world_verdict
from launcher.results.planned_world import checked_exit_code, planned_trainer_world, trainer_world_problem
from launcher.results.rundir import RunDir, read_json
from launcher.spec.run_spec import RunSpec
from tests.testbed_fixtures import REPO

TWO_NODES = RunSpec(run_id="skew", nnodes=2, nproc_per_node=1)


def trainer_summary(world: int, nodes: int) -> dict[str, Any]:
    return {"world_size": world, "nnodes": nodes, "epochs": 3, "final_test_acc": 0.9}


def run_with(tmp_path: Path, spec: RunSpec, summary: dict[str, Any] | None) -> RunDir:
    run_dir = RunDir.create(tmp_path / "runs", spec, {"provider": "ssh"})
    if summary is not None:
        (run_dir.path / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_the_clock_skew_case_two_planned_nodes_one_trained_fails(tmp_path: Path) -> None:
    run_dir = run_with(tmp_path, TWO_NODES, trainer_summary(1, 1))
    assert checked_exit_code(run_dir, None, 0) == 1
    summary = read_json(run_dir.path / "summary.json")
    assert summary is not None and summary["world_failed"] is True
    assert summary["world_warning"].startswith("the trainer ran on 1 node(s) with world size 1, not the planned "
                                               "2 node(s) and 2 processes")
    assert [e["event"] for e in run_dir.events()][-1] == "world_differs"


def test_the_planned_world_passes_and_a_failed_run_keeps_its_own_status(tmp_path: Path) -> None:
    run_dir = run_with(tmp_path, TWO_NODES, trainer_summary(2, 2))
    assert checked_exit_code(run_dir, None, 0) == 0
    assert "world_failed" not in (read_json(run_dir.path / "summary.json") or {})
    assert checked_exit_code(run_with(tmp_path / "b", TWO_NODES, trainer_summary(1, 1)), None, 3) == 3


def test_a_trainer_that_wrote_no_summary_trained_nothing(tmp_path: Path) -> None:
    run_dir = run_with(tmp_path, RunSpec(run_id="true", python="/bin/true"), None)
    assert checked_exit_code(run_dir, None, 0) == 1
    failure = run_dir.record()["failure"]
    assert failure["summary"].startswith("the trainer wrote no summary.json, so the run trained nothing")
    assert "--python /bin/true" in failure["summary"]


@pytest.mark.parametrize(("strategy", "nproc", "nnodes", "world"), [
    ("ddp", 2, 2, 4), ("local-sgd", 2, 2, 4), ("ddp-mp", 4, 1, 2), ("spawn", 3, 1, 3), ("hogwild", 2, 1, 2),
    ("dp", 2, 1, 1), ("mp", 2, 1, 1),
])
def test_the_planned_trainer_world_of_each_strategy(strategy: str, nproc: int, nnodes: int, world: int) -> None:
    spec = RunSpec(run_id="s", strategy=strategy, nproc_per_node=nproc, nnodes=nnodes,
                   devices="cpu,cpu" if strategy in ("mp", "ddp-mp") else None)
    assert planned_trainer_world(spec) == world
    assert trainer_world_problem(spec, trainer_summary(world, nnodes)) is None
    assert trainer_world_problem(spec, trainer_summary(world + 1, nnodes)) is not None


def _joined(ranks: int, world: int, nodes: int) -> MeasuredWorlds:
    return MeasuredWorlds(tuple(JoinRecord("torch", r, world, r % nodes, "h", 0, None) for r in range(ranks)))


def test_a_script_world_smaller_or_larger_than_planned_fails() -> None:
    _, warning, failed = world_verdict(_joined(2, 2, 2), planned_nodes=2, planned_world=4)
    assert failed and warning is not None and "fewer than the planned 4" in warning
    _, warning, failed = world_verdict(_joined(4, 4, 2), planned_nodes=2, planned_world=2)
    assert failed and warning is not None  # a script that spawns its own: never a success in another world
    assert "has 4 processes, more than the planned 2" in warning and "`--launcher spawn`" in warning
    _, warning, failed = world_verdict(_joined(3, 3, 1), planned_nodes=1, planned_world=1)  # one node, odd size
    assert failed and warning is not None and "has 3 processes, more than the planned 1" in warning
    assert world_verdict(_joined(2, 2, 2), planned_nodes=2, planned_world=2)[1:] == (None, False)


def test_a_script_summary_that_failed_its_world_check_fails_the_run(tmp_path: Path) -> None:
    spec = RunSpec(run_id="cmd", user_command=("python3", "x.py"), nnodes=2, nproc_per_node=1)
    run_dir = run_with(tmp_path, spec, None)
    assert checked_exit_code(run_dir, {"world_failed": True}, 0) == 1
    assert checked_exit_code(run_dir, {"world_failed": False}, 0) == 0
    assert checked_exit_code(run_dir, None, 0) == 0  # a script that joined nothing: its world is unknown


@pytest.mark.parametrize("argv", [["up", "--"], ["up", "--gpus", "2", "--"]])
def test_up_with_nothing_after_the_double_dash_is_refused(argv: list[str]) -> None:
    with pytest.raises(SpecError, match=r"^`up --` with no command after it: give the command to run"):
        refuse_empty_command(argv)


@pytest.mark.parametrize("argv", [["up"], ["up", "--", "python3", "x.py"], ["up", "--", "python3", "--"],
                                  ["status", "--"]])
def test_a_command_after_the_double_dash_is_not_refused(argv: list[str]) -> None:
    refuse_empty_command(argv)


@pytest.mark.integration
def test_python_bin_true_here_is_not_a_success(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--python", "/bin/true", "--gpus", "1",
                             "--runs-dir", str(tmp_path / "runs"), "--quiet"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, (result.stdout, result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training failed: the trainer wrote no summary.json, so the run trained nothing"), (
        result.stderr)


@pytest.mark.integration
def test_up_double_dash_alone_starts_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--runs-dir", str(tmp_path / "runs"), "--"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: `up --` with no command after it: give the command to run (`-- python3 train.py`), or drop the "
        "`--` to run the built-in trainer"]
    assert not (tmp_path / "runs").exists()
