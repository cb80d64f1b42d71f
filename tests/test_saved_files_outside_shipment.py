"""`up --dry-run --save-plan FILE` (or `--save-config FILE`) into the folder a run on hosts ships would change the
files whose digest the plan records, and `up --plan FILE` would refuse them for ever: such a file is refused before
anything is written, with where to put it; outside the folder, or left out by .ddpctlignore, it is written and the
plan's files still check unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.execute.ship.contents import check_unchanged
from launcher.planning.plan import RunPlan
from tests.cli_in_process import ddpctl_in_process


def load_plan(path: Path) -> RunPlan:
    """The saved plan as written (a --no-probe plan has unknowns, so `up --plan` would not run it: read it only)."""
    return RunPlan.from_json(json.loads(path.read_text()))


HOSTS = ("--host", "u@10.0.0.1", "--host", "u@10.0.0.2", "--dry-run", "--no-probe")


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "sub").mkdir(parents=True)
    (folder / "train.py").write_text("print('train')\n")
    return folder


@pytest.mark.parametrize(("option", "name"), [("--save-plan", "plan.json"), ("--save-config", "run.toml"),
                                              ("--save-plan", "sub/plan.json"), ("--save-config", "sub/../c.toml")])
def test_a_saved_file_inside_the_shipped_folder_is_refused_writing_nothing(tmp_path: Path, option: str,
                                                                           name: str) -> None:
    folder = project(tmp_path)
    result = ddpctl_in_process("up", *HOSTS, option, name, "--", "python", "train.py", cwd=folder)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {option} {name}: it is inside {folder.resolve()}, the folder this run ships"), line
    assert f"{option} ../{Path(name).name}" in line and ".ddpctlignore" in line
    assert sorted(p.name for p in folder.rglob("*")) == ["sub", "train.py"]  # nothing written


def test_a_plan_saved_beside_the_folder_or_ignored_in_it_is_written_and_its_files_check_unchanged(
        tmp_path: Path) -> None:
    folder = project(tmp_path)
    beside = ddpctl_in_process("up", *HOSTS, "--save-plan", "../plan.json", "--", "python", "train.py", cwd=folder)
    assert beside.returncode == 0, beside.stderr
    check_unchanged(load_plan(tmp_path / "plan.json").ship)  # type: ignore[arg-type]
    (folder / ".ddpctlignore").write_text("plans/\n")
    (folder / "plans").mkdir()
    inside = ddpctl_in_process("up", *HOSTS, "--save-plan", "plans/p.json", "--save-config", "plans/c.toml",
                               "--", "python", "train.py", cwd=folder)
    assert inside.returncode == 0, inside.stderr
    plan = load_plan(folder / "plans" / "p.json")
    assert plan.ship is not None and plan.ship.source == str(folder.resolve())
    check_unchanged(plan.ship)  # the plan file and the config written after the digest are not among its files
    assert json.loads((folder / "plans" / "p.json").read_text())["ship"]["digest"] == plan.ship.digest


def test_a_run_on_this_machine_ships_nothing_and_may_save_its_plan_anywhere(tmp_path: Path) -> None:
    folder = project(tmp_path)
    result = ddpctl_in_process("up", "--dry-run", "--runs-dir", "runs", "--save-plan", "plan.json",
                               "--", "python", "train.py", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert (folder / "plan.json").is_file()
