"""The host's side of shipping a directory (launcher/remote/tree_sync.py), run here on temporary folders standing in
for a host's workspace: its manifest agrees with the launcher's own, and mkdirs/prune stay inside the root. What
sync sends is the module's text."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.remote import tree_sync
from launcher.remote.program import program
from launcher.transport import sync
from launcher.transport.ssh import CommandResult


class InProcessHost:
    """A connection whose commands are the remote module run in this process (as `python -c SOURCE ARGS` would run
    it on a host: only the module's own text is accepted), and whose SFTP is this machine's files."""

    label = "in-process host"

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.sftp = self

    def check(self, argv: list[str], what: str, *, stdin: bytes = b"", timeout: float = 0) -> CommandResult:
        self.commands.append(argv)
        # the module's own text (with the watch that ends it with its client), nothing else
        assert argv[:3] == ["py", "-c", program(tree_sync, end_with_client=True)]
        out, sys_stdin = io.StringIO(), sys.stdin
        sys.stdin = io.StringIO(stdin.decode())
        try:
            with contextlib.redirect_stdout(out):
                tree_sync.main(argv[3:])
        finally:
            sys.stdin = sys_stdin
        return CommandResult(0, out.getvalue(), "")

    def run(self, argv: list[str], *, stdin: bytes = b"", timeout: float = 0) -> CommandResult:
        return self.check(argv, "", stdin=stdin, timeout=timeout)

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, remote)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def posix_rename(self, old: str, new: str) -> None:
        os.replace(old, new)


def test_ship_tree_through_the_module_sends_what_changed_and_prunes_what_went(tmp_path: Path) -> None:
    """The launcher's ship_tree against the host module run in process: a first ship sends all, a second after an
    edit and a removal sends the edit and prunes the removed file and its emptied folder."""
    local, remote = tree(tmp_path / "local"), tmp_path / "host" / "ws"
    host = InProcessHost()
    first = sync.ship_tree(host, local, str(remote), python="py")  # type: ignore[arg-type]
    assert (first.files_sent, first.files_unchanged, first.files_deleted) == (3, 0, 0)
    assert [c[3] for c in host.commands] == ["manifest", "mkdirs"]
    (local / "top.py").write_text("print('changed')\n")
    shutil.rmtree(local / "a")
    second = sync.ship_tree(host, local, str(remote), python="py")  # type: ignore[arg-type]
    assert (second.files_sent, second.files_unchanged, second.files_deleted) == (1, 1, 1)
    assert sorted(p.name for p in remote.iterdir()) == ["run.sh", "top.py"]
    assert (remote / "top.py").read_text() == "print('changed')\n"
    assert (remote / "run.sh").stat().st_mode & 0o777 == 0o750
    assert [c[3] for c in host.commands][2:] == ["manifest", "prune"]  # its folders are there: no mkdirs


def tree(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "top.py").write_text("print('hi')\n")
    (root / "a" / "b" / "deep.bin").write_bytes(bytes(range(256)) * 4096)  # over one read block
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    return root


def test_the_manifest_of_files_is_the_launchers_own(tmp_path: Path) -> None:
    root = tree(tmp_path / "ws")
    found = tree_sync.manifest(str(root))
    assert found["exists"] is True
    files = {e["path"]: (e["size"], e["sha256"], e["mode"]) for e in found["entries"]}
    assert files == sync.local_manifest(root, sync.ignore_spec(root))
    assert all(e["type"] == "file" for e in found["entries"])


def test_links_special_files_and_odd_names_are_entries_of_their_own(tmp_path: Path) -> None:
    root = tree(tmp_path / "ws")
    (root / "link").symlink_to("/etc/passwd")
    (root / "dirlink").symlink_to(root / "a")
    os.mkfifo(root / "fifo")
    odd = os.fsencode(str(root)) + b"/caf\xe9.txt"
    with open(odd, "wb") as f:
        f.write(b"x")
    by_path = {e["path"]: e for e in tree_sync.manifest(str(root))["entries"]}
    assert by_path["link"] == {"path": "link", "type": "link"}
    assert by_path["dirlink"] == {"path": "dirlink", "type": "link"}  # never followed
    assert by_path["fifo"] == {"path": "fifo", "type": "special"}
    assert by_path["caf\\xe9.txt"]["raw"] == b"caf\xe9.txt".hex() and by_path["caf\\xe9.txt"]["size"] == 1
    assert "a/b/deep.bin" in by_path and not any(p.startswith("dirlink/") for p in by_path)


def test_what_cannot_be_read_is_listed_with_why_never_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "ws")
    real_open, real_scandir = os.open, os.scandir

    def refusing_open(path: str, *args: int) -> int:
        if str(path).endswith("top.py"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args)

    def refusing_scandir(path: str) -> object:
        if str(path).endswith("/b"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(os, "scandir", refusing_scandir)
    by_path = {e["path"]: e for e in tree_sync.manifest(str(root))["entries"]}
    assert by_path["top.py"] == {"path": "top.py", "type": "unreadable", "reason": "cannot read it: Permission denied"}
    assert by_path["a/b"] == {"path": "a/b", "type": "unreadable",
                              "reason": "cannot list the folder: Permission denied"}
    assert by_path["run.sh"]["type"] == "file"


def test_a_missing_root_is_empty_and_a_file_as_root_is_refused(tmp_path: Path) -> None:
    assert tree_sync.manifest(str(tmp_path / "none")) == {"exists": False, "entries": []}
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit, match="is not a directory"):
        tree_sync.manifest(str(tmp_path / "f"))


def test_mkdirs_and_prune_read_their_paths_on_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ws"
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(["a/b", "c"])))
    tree_sync.main(["mkdirs", str(root)])
    assert (root / "a" / "b").is_dir() and (root / "c").is_dir()
    (root / "a" / "b" / "f").write_text("x")
    (root / "keep").write_text("x")
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(["a/b/f", "gone"])))
    tree_sync.main(["prune", str(root)])
    assert sorted(p.name for p in root.iterdir()) == ["c", "keep"]  # a/b emptied, so removed; c never held a file
    tree_sync.main(["manifest", str(root)])
    assert [e["path"] for e in json.loads(capsys.readouterr().out)["entries"]] == ["keep"]


@pytest.mark.parametrize("rel", ["/etc/passwd", "../outside", "a/../../outside", "a//b", "a/"])
def test_a_path_out_of_the_root_is_refused(tmp_path: Path, rel: str) -> None:
    (tmp_path / "outside").write_text("mine")
    with pytest.raises(SystemExit, match="unsafe path"):
        tree_sync.prune(str(tmp_path / "ws"), [rel])
    with pytest.raises(SystemExit, match="unsafe path"):
        tree_sync.make_dirs(str(tmp_path / "ws"), [rel])
    assert (tmp_path / "outside").read_text() == "mine"


@pytest.mark.integration
def test_the_sent_text_run_as_the_host_runs_it_lists_the_tree(tmp_path: Path) -> None:
    """`python -c SOURCE manifest ROOT`, as sync.remote_manifest runs it on a host."""
    root = tree(tmp_path / "ws")
    done = subprocess.run([sys.executable, "-c", sync.REMOTE_SCRIPT, "manifest", str(root)], capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == tree_sync.manifest(str(root))
    refused = subprocess.run([sys.executable, "-c", sync.REMOTE_SCRIPT, "prune", str(root)], input='["../x"]',
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and refused.stderr == "unsafe path '../x'\n"
