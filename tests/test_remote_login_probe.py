"""The Slurm login node's probe (launcher/remote/login_probe.py) run here against temporary folders standing in
for the login node's file system; what probe_login sends is the module's text, with tree_sync's (the code cache's
listing comes back in the same answer)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.remote import login_probe, tree_sync
from launcher.remote.program import program
from launcher.schedulers.slurm import cluster
from launcher.transport.ssh import CommandResult


def test_what_probe_login_sends_is_the_modules_text() -> None:
    sent: list[list[str]] = []

    class Recorder:
        label = "login"

        def run(self, argv: list[str], *, timeout: float | None = None) -> CommandResult:
            sent.append(argv)
            return CommandResult(0, '{"workdir": "/w"}\n', "")

    assert cluster.probe_login(Recorder(), "python3", None) == {"workdir": "/w"}  # type: ignore[arg-type]
    assert cluster.probe_login(Recorder(), "python3", "/w", code_cache="code/ab12") == {"workdir": "/w"}  # type: ignore[arg-type]
    text = program(login_probe, tree_sync)
    assert sent == [["python3", "-c", text, cluster.DEFAULT_WORKDIR], ["python3", "-c", text, "/w", "code/ab12"]]


def test_a_workdir_from_variables_and_home_is_made_and_measured(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    facts = login_probe.login_facts("$SCRATCH/runs/../ddpctl")
    assert facts["workdir"] == str(tmp_path / "scratch" / "ddpctl") and (tmp_path / "scratch" / "ddpctl").is_dir()
    assert facts["writable"] is True and facts["free"] > 0 and "why" not in facts
    assert facts["home"] == str(tmp_path / "home") and facts["python"] == sys.executable
    assert login_probe.login_facts("~/w")["workdir"] == str(tmp_path / "home" / "w")
    assert list((tmp_path / "scratch" / "ddpctl").iterdir()) == []  # the write test leaves nothing


def test_a_workdir_that_cannot_be_made_says_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    facts = login_probe.login_facts(str(tmp_path / "file" / "runs"))
    assert facts["writable"] is False and "free" not in facts
    assert facts["why"] in ("Not a directory", "File exists")


def test_torch_is_found_by_its_metadata_or_named_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert login_probe.login_facts(str(tmp_path))["torch"] == importlib.metadata.version("torch")
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find(name, *a))
    facts = login_probe.login_facts(str(tmp_path))
    assert "torch" not in facts and facts["torch_error"] == "No module named 'torch'"


@pytest.mark.integration
def test_the_probe_run_as_the_launcher_runs_it_answers_one_json_line(tmp_path: Path) -> None:
    """`python -c SOURCE WORKDIR`, read by probe_login's own parsing."""

    class ThisMachine:
        label = "this machine"

        def run(self, argv: list[str], *, timeout: float | None = None) -> CommandResult:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            return CommandResult(done.returncode, done.stdout, done.stderr)

    answer = cluster.probe_login(ThisMachine(), sys.executable, str(tmp_path / "w"))  # type: ignore[arg-type]
    assert answer["workdir"] == str(tmp_path / "w") and answer["writable"] is True
    assert answer["torch"] == importlib.metadata.version("torch") and "manifest" not in answer
    # The code cache listed in the same answer, as shipping lists it (a cache not there yet: exists False).
    (tmp_path / "w" / "code" / "k1").mkdir(parents=True)
    (tmp_path / "w" / "code" / "k1" / "train.py").write_text("print(1)\n")
    listed = cluster.probe_login(ThisMachine(), sys.executable, str(tmp_path / "w"), code_cache="code/k1")  # type: ignore[arg-type]
    assert listed["manifest"] == tree_sync.manifest(str(tmp_path / "w" / "code" / "k1"))
    fresh = cluster.probe_login(ThisMachine(), sys.executable, str(tmp_path / "w"), code_cache="code/k2")  # type: ignore[arg-type]
    assert fresh["manifest"] == {"exists": False, "entries": []}


def test_a_cache_path_that_leaves_the_workdir_is_not_listed(tmp_path: Path) -> None:
    assert "error" in login_probe.cache_listing(str(tmp_path), "../elsewhere")
    assert "error" in login_probe.cache_listing(str(tmp_path), "/etc")
