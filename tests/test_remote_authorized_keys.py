"""The MPI run's key line in a node's authorized_keys (launcher/remote/authorized_keys.py), added and removed here
in a temporary home standing in for the node's; what MpiAccess sends is the module's text."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.execute.hosts import mpi_access
from launcher.planning.plan import NodeHost, NodePlan, RunPlan
from launcher.remote import authorized_keys, source_of
from launcher.spec.run_spec import RunSpec
from launcher.transport.ssh import CommandResult

LINE = "restrict ssh-ed25519 AAAAC3Nza...key ddpctl-mpi-run1"
OTHERS = "ssh-ed25519 AAAA...mine me@laptop\nssh-rsa AAAA...also ddpctl-mpi-run2\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HOME", str(tmp_path))
    old = os.umask(0o022)
    yield tmp_path
    os.umask(old)


class InProcessNode:
    """A node whose `python -c SOURCE ARGS` is the module run in this process (only the module's own text is
    accepted; $HOME is the test's), whose `rm -rf` and SFTP act on this machine's files."""

    def __init__(self, commands: list[list[str]]) -> None:
        self.commands, self.sftp = commands, self
        self.transport = SimpleNamespace(get_remote_server_key=lambda: SimpleNamespace(
            get_name=lambda: "ssh-ed25519", get_base64=lambda: "AAAAverified"))

    def run(self, argv: list[str], *, timeout: float = 0) -> CommandResult:
        self.commands.append(argv)
        if argv[:3] == ["rm", "-rf", "--"]:
            shutil.rmtree(argv[3])
            return CommandResult(0, "", "")
        assert argv[:3] == ["python3", "-c", source_of(authorized_keys)]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = authorized_keys.main(argv[3:])
        return CommandResult(code, "", err.getvalue())

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(path, mode)

    def open(self, path: str, how: str) -> Any:
        f = open(path, how)  # noqa: SIM115 - handed to the caller's with-block, as SFTP's file is
        f.chmod = lambda mode: os.chmod(path, mode)  # type: ignore[attr-defined]
        return f


def test_mpi_access_through_the_module_adds_the_runs_line_then_takes_exactly_it_away(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = home / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_text(OTHERS)
    commands: list[list[str]] = []
    node = InProcessNode(commands)
    session = SimpleNamespace(conn=lambda index: node, label_of=lambda index: f"node {index}",
                              targets=[SimpleNamespace(hostname=f"10.0.0.{i}", port=22, user="u") for i in range(2)])
    events: list[tuple[str, dict[str, Any]]] = []
    run_dir = SimpleNamespace(event=lambda name, **fields: events.append((name, fields)))
    monkeypatch.chdir(tmp_path)  # node 0's workspace, relative as on a host
    spec = RunSpec(run_id="mpi-1", nnodes=2, nproc_per_node=1, user_command=("python3", "x.py"), launcher="mpirun")
    nodes = tuple(NodePlan(i, NodeHost(f"h{i}", f"10.0.0.{i}", "eth0"), "native", f"ws{i}", (), (), "")
                  for i in range(2))
    (tmp_path / "ws0").mkdir()
    access = mpi_access.MpiAccess(session, RunPlan(spec, nodes), run_dir)  # type: ignore[arg-type]
    access.set_up()
    assert keys.read_text() == OTHERS + access.key_line + "\n"
    assert access.key_line.startswith("restrict ssh-ed25519 ") and access.key_line.endswith(" ddpctl-mpi-mpi-1")
    assert sorted(p.name for p in (tmp_path / "ws0" / "mpi").iterdir()) == [
        "hostfile", "id_ed25519", "known_hosts", "ssh_config"]
    access.remove()
    assert keys.read_text() == OTHERS and not (tmp_path / "ws0" / "mpi").exists()
    assert [c[3] for c in commands if c[0] == "python3"] == ["add", "remove"]
    assert events[-1] == ("mpi_access_removed", {"key": "ddpctl-mpi-mpi-1", "left": []})


def test_a_first_key_makes_the_folder_and_file_the_owners_only(home: Path) -> None:
    assert authorized_keys.main(["add", LINE]) == 0
    assert (home / ".ssh" / "authorized_keys").read_text() == LINE + "\n"
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".ssh" / "authorized_keys").stat().st_mode) == 0o600


def test_removing_takes_out_exactly_the_runs_line_and_keeps_the_files_mode(home: Path) -> None:
    keys = home / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_text(OTHERS)
    keys.chmod(0o640)
    assert authorized_keys.main(["add", LINE]) == 0
    assert keys.read_text() == OTHERS + LINE + "\n"
    assert authorized_keys.main(["remove", "ddpctl-mpi-run1", LINE]) == 0
    assert keys.read_text() == OTHERS and stat.S_IMODE(keys.stat().st_mode) == 0o640
    assert authorized_keys.main(["remove", "ddpctl-mpi-run1", LINE]) == 0  # twice: nothing left to do


def test_a_line_of_the_run_still_there_is_said_by_the_exit_status(home: Path) -> None:
    keys = home / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_text(LINE + " edited\n")  # the run's marker on a line that is not the one added
    assert authorized_keys.main(["remove", "ddpctl-mpi-run1", LINE]) == authorized_keys.STILL_THERE
    assert keys.read_text() == LINE + " edited\n"


def test_no_file_is_nothing_to_remove_and_an_unwritable_home_cannot_add(home: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert authorized_keys.main(["remove", "ddpctl-mpi-run1", LINE]) == 0
    (home / ".ssh").write_text("a file where the folder goes")
    assert authorized_keys.main(["add", LINE]) == authorized_keys.CANNOT_ADD
    assert capsys.readouterr().err.startswith(f"cannot add the key to {home}/.ssh/authorized_keys: ")


def test_anything_else_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert authorized_keys.main(["add"]) == 2 and authorized_keys.main(["drop", LINE]) == 2
    assert "usage: add LINE | remove MARKER LINE" in capsys.readouterr().err


@pytest.mark.integration
def test_the_sent_text_adds_and_removes_as_the_node_runs_it(tmp_path: Path) -> None:
    """`python -c SOURCE add LINE` then `remove MARKER LINE`, as MpiAccess runs them on a node."""
    env = {**os.environ, "HOME": str(tmp_path)}
    script = mpi_access.AUTHORIZED_KEYS_SCRIPT
    added = subprocess.run([sys.executable, "-c", script, "add", LINE], env=env, capture_output=True, timeout=60)
    assert added.returncode == 0 and (tmp_path / ".ssh" / "authorized_keys").read_text() == LINE + "\n"
    removed = subprocess.run([sys.executable, "-c", script, "remove", "ddpctl-mpi-run1", LINE], env=env,
                             capture_output=True, timeout=60)
    assert removed.returncode == 0 and (tmp_path / ".ssh" / "authorized_keys").read_text() == ""
