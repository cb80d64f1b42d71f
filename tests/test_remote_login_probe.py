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

from launcher.places.slurm import cluster
from launcher.remote import login_probe, tree_sync
from launcher.remote.program import program
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


def test_a_workdir_from_variables_and_home_is_measured_and_not_made(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe is read-only (`up --dry-run` runs it): a workdir that does not exist yet is asked of the deepest
    folder above it that does, and left unmade (the run makes it when it places the job's files)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    facts = login_probe.login_facts("$SCRATCH/runs/../ddpctl/deep")
    assert facts["workdir"] == str(tmp_path / "scratch" / "ddpctl" / "deep")
    assert facts["writable"] is True and facts["free"] > 0 and "why" not in facts and "unset" not in facts
    assert facts["home"] == str(tmp_path / "home") and facts["python"] == sys.executable
    assert login_probe.login_facts("~/w")["workdir"] == str(tmp_path / "home" / "w")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch"] and list((tmp_path / "scratch").iterdir()) == []


def test_an_existing_workdir_is_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    before = (tmp_path / "w").stat()
    facts = login_probe.login_facts(str(tmp_path / "w"))
    assert facts["writable"] is True and list((tmp_path / "w").iterdir()) == []
    assert (tmp_path / "w").stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize(("given", "unset"), [
    ("$NOPE_UNSET", ["NOPE_UNSET"]), ("${NOPE_A}/x/$NOPE_B", ["NOPE_A", "NOPE_B"]),
    ("$HOME/$NOPE_C/runs", ["NOPE_C"]), ("/scratch/${NOPE_D}", ["NOPE_D"]),
])
def test_variables_the_login_node_does_not_set_are_named_and_nothing_is_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, unset: list[str]) -> None:
    """Left unexpanded they would be literal folder names (`$NOPE_UNSET`): named, so that the dry run refuses."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert login_probe.login_facts(given)["unset"] == unset
    assert list(tmp_path.iterdir()) == []


def test_the_unset_variables_are_one_line_of_the_preflight(tmp_path: Path) -> None:
    from launcher.places.slurm.cluster import ClusterFacts, Partition, preflight_refusal
    from launcher.spec.run_spec import RunSpec
    from launcher.spec.slurm_request import SlurmRequest

    part = Partition(name="debug", state="UP", total_nodes=2, max_minutes=None, gpus_per_node=[0, 0],
                     cpus_per_node=[2, 2])
    facts = ClusterFacts(partition=part, select_type="select/linear", workdir="/x", python="python3", torch="2.13.0")
    request = SlurmRequest(workdir="$NOPE_UNSET/exp")
    login = {"unset": ["NOPE_UNSET"], "writable": True, "torch": "2.13.0"}
    line = preflight_refusal(RunSpec(run_id="r"), request, facts, login)
    assert line == ("--workdir $NOPE_UNSET/exp: $NOPE_UNSET is not set on the login node: give the folder's path, "
                    "or name variables set there (e.g. $HOME, $SCRATCH)")


def test_a_workdir_under_a_file_says_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    facts = login_probe.login_facts(str(tmp_path / "file" / "runs"))
    assert facts["writable"] is False and "free" not in facts
    assert facts["why"] == f"{tmp_path / 'file'} is not a folder"


def test_torch_is_found_by_its_metadata_or_named_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert login_probe.login_facts(str(tmp_path))["torch"] == importlib.metadata.version("torch")
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find(name, *a))
    facts = login_probe.login_facts(str(tmp_path))
    assert "torch" not in facts and facts["torch_error"] == "No module named 'torch'"


def test_torch_version_is_read_from_its_version_file_else_from_its_metadata(tmp_path: Path) -> None:
    """torch/version.py says the version without importlib.metadata; a torch folder without it (or one that does
    not say it) is asked of its metadata."""
    stated = tmp_path / "stated"
    stated.mkdir()
    (stated / "version.py").write_text("__all__ = ['__version__']\n__version__ = '9.8.7+cu999'\ndebug = False\n")
    assert login_probe._torch_version([str(tmp_path / "missing"), str(stated)]) == "9.8.7+cu999"
    (stated / "version.py").write_text("debug = False\n")
    assert login_probe._torch_version([str(stated)]) == importlib.metadata.version("torch")
    assert login_probe._torch_version(None) == importlib.metadata.version("torch")


@pytest.mark.integration
def test_the_probe_run_as_the_launcher_runs_it_answers_one_json_line(tmp_path: Path) -> None:
    """`python -c SOURCE WORKDIR`, read by probe_login's own parsing."""

    class ThisMachine:
        label = "this machine"

        def run(self, argv: list[str], *, timeout: float | None = None) -> CommandResult:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            return CommandResult(done.returncode, done.stdout, done.stderr)

    answer = cluster.probe_login(ThisMachine(), sys.executable, str(tmp_path / "w"))  # type: ignore[arg-type]
    assert answer["workdir"] == str(tmp_path / "w") and answer["writable"] is True and not (tmp_path / "w").exists()
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
