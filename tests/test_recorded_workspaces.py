"""A run.json whose node workspace was edited to climb (`../..`) or name a home or the root is refused in one line
before any host is asked: `pull`, `status`, `down` and `stacks` would otherwise work on a host's whole file system.
Records as ddpctl writes them (a run's ~/.ddpctl/runs/RUN, an absolute folder) still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.execute.hosts.node_stops import node_workspaces
from launcher.results.record import RecordError
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec


def recorded(tmp_path: Path, *workspaces: str) -> RunDir:
    nodes = [{"index": i, "label": f"u@h{i}", "workspace": w} for i, w in enumerate(workspaces)]
    return RunDir.create(tmp_path / "runs", RunSpec(run_id="r1"), {"provider": "ssh", "nodes": nodes})


@pytest.mark.parametrize("workspace", ["../..", "..", ".ddpctl/runs/../../..", "/", ".", "", "~", "~/x", "a\nb"])
def test_an_edited_workspace_is_one_line_naming_the_node(tmp_path: Path, workspace: str) -> None:
    run_dir = recorded(tmp_path, ".ddpctl/runs/r1", workspace)
    with pytest.raises(RecordError) as caught:
        node_workspaces(run_dir)
    text = str(caught.value)
    assert "\n" not in text.replace(repr(workspace), "")
    assert text.startswith(f"{run_dir.path / 'run.json'}: node 1's workspace {workspace!r} is not a run's workspace")


def test_workspaces_as_ddpctl_records_them_read(tmp_path: Path) -> None:
    run_dir = recorded(tmp_path, ".ddpctl/runs/r1", "/scratch/u/.ddpctl/runs/r1")
    assert node_workspaces(run_dir) == [".ddpctl/runs/r1", "/scratch/u/.ddpctl/runs/r1"]
