"""Adding a place is a module and one registry line: a toy place, registered here only, passes the local part of
the contract every place keeps (`up --detach` of a `-- python script.py` run, `status` shows it running, `logs`
shows its lines, `down` stops it and nothing of it is left), and so does this machine's own place. The contract is
asked of the Place interface, as the commands ask it (launcher/cli/run_commands.py); real torchrun, real script."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.execute.local_machine import LocalMachine
from launcher.execute.recorded import LocalRun
from launcher.places.on_provider import ProvidedPlace
from launcher.places.registry import PLACES, place_named, place_of_record, run_up
from launcher.planning.request import UpOptions
from launcher.providers.base import AcquiredHosts
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec, new_run_id
from tests.faults.fault_support import wait_for
from tests.test_local_place import processes_of

pytestmark = pytest.mark.integration

SCRIPT = """import os, sys, time
for step in range(600):
    print(f"toy step {step} of rank {os.environ['RANK']}", flush=True)
    time.sleep(0.2)
"""


class ToyMachine(LocalMachine):
    """This machine, recorded under the toy place's name (what a new place's provider gives: hosts, or none)."""

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        acquired = super().acquire(spec, options)
        return replace(acquired, record={**acquired.record, "provider": "toy"})


class ToyPlace(ProvidedPlace):
    """A place of its own: its name, its options (none), where its machines come from, how its runs are asked."""

    name = "toy"
    runs_here = True

    def host_provider(self, options: UpOptions) -> LocalMachine:
        return ToyMachine()

    def recorded(self) -> LocalRun:
        return LocalRun()


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PLACES, "toy", ToyPlace())  # the one registry line


def keeps_the_local_contract(name: str, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """up --detach of `-- python script.py` through place `name`; status running; logs with rank 0's lines; down
    stops it, status says so, nothing of it is left."""
    (folder / "script.py").write_text(SCRIPT)
    spec = RunSpec(run_id=new_run_id(None, "script", "none", ("python", "script.py")), nproc_per_node=1,
                   user_command=("python", "script.py"), python=sys.executable)
    options = UpOptions(runs_dir=folder / "runs", provider=name, detach=True, show_progress=False,
                        show_output=False)
    started = run_up(spec, options)
    assert started.exit_code == 0 and started.run_dir is not None
    run_dir = RunDir.open(started.run_dir)
    place = place_of_record(run_dir.typed_record())
    assert place is place_named(name)
    asked = UpOptions(runs_dir=folder / "runs", show_progress=False)
    try:
        [row] = wait_for("the run to be running",
                         lambda: (rows := place.status_rows(run_dir, asked))[0]["state"] == "running" and rows,
                         timeout=60)
        assert row["node"] == 0 and row["exit_code"] is None
        capsys.readouterr()

        def logged() -> str | None:
            place.print_log(run_dir, 0, 5, False, asked)
            out = capsys.readouterr().out
            return out if "toy step 3 of rank 0" in out else None

        assert "toy step" in wait_for("rank 0's lines in logs", logged, timeout=60)
        said = place.down(run_dir, asked, False)
        assert said.startswith(f"stopped run {run_dir.run_id} on this machine ("), said
        assert place.status_rows(run_dir, asked)[0]["state"] == "stopped"
        time.sleep(0.5)  # the follower records the stop, then exits
        assert processes_of(run_dir.path) == {}, "nothing of the run is left once down returns"
    finally:
        for pid in processes_of(run_dir.path):
            os.kill(pid, 9)


def test_a_toy_place_is_a_module_and_one_registry_line(toy_registered: None, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert place_named("toy").name == "toy"
    keeps_the_local_contract("toy", tmp_path, capsys)
    assert place_of_record(RunDir.open(next((tmp_path / "runs").iterdir())).typed_record()).name == "toy"


@pytest.mark.parametrize("name", ["local"])
def test_this_machine_keeps_the_local_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    keeps_the_local_contract(name, tmp_path, capsys)


def test_an_unknown_place_is_one_line_naming_the_places() -> None:
    with pytest.raises(SpecError, match=r"^--provider 'pbs': choose local, ssh, vast or slurm$"):
        place_named("pbs")
