"""Adding a place is a module and one registry line: a toy place, registered here only, passes the local part of
the contract every place keeps (`up --detach` of a `-- python script.py` run, `status` shows it running, `logs`
shows rank 0's lines, `down` stops it and nothing of it is left), and so do this machine's own place and two SSH
hosts of the test bed. The contract is asked of the Place interface, as the commands ask it
(launcher/cli/run_commands.py); real torchrun, real script, real sshd."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from infra.testbed import Testbed
from launcher.errors import SpecError
from launcher.execute.day2.recorded import LocalRun
from launcher.places.local.machine import LocalMachine
from launcher.places.on_provider import ProvidedPlace
from launcher.places.registry import PLACES, place_named, place_of_record, run_up
from launcher.planning.request import UpOptions
from launcher.providers.base import AcquiredHosts
from launcher.results.rundir import RunDir
from launcher.spec.hosts import parse_host
from launcher.spec.run_spec import RunSpec, new_run_id
from tests.faults.fault_support import wait_for
from tests.test_local_place import processes_of
from tests.testbed_fixtures import lent

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


@pytest.fixture
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


def keeps_the_contract(name: str, folder: Path, capsys: pytest.CaptureFixture[str], bed: Testbed | None = None
                       ) -> None:
    """up --detach of `-- python script.py` through place `name` (on the bed's hosts, one node each, when given);
    status: every node running; logs --rank 0: rank 0's lines; down stops it, and nothing of it is left (here, or in the
    hosts' run folders)."""
    (folder / "script.py").write_text(SCRIPT)
    hosts = tuple(parse_host(h.spec) for h in bed.hosts) if bed else ()
    spec = RunSpec(run_id=new_run_id(None, "script", "none", ("python", "script.py")), nproc_per_node=1,
                   nnodes=max(1, len(hosts)), user_command=("python", "script.py"),
                   python="python3" if bed else sys.executable)
    key = Path(bed.client_key_path) if bed else None
    options = UpOptions(runs_dir=folder / "runs", provider=name, detach=True, show_progress=False,
                        show_output=False, hosts=hosts, identity_file=key, auto_rdzv_port=True)
    started = run_up(spec, options)
    assert started.exit_code == 0 and started.run_dir is not None
    run_dir = RunDir.open(started.run_dir)
    places = [run_dir.path] + ([Path(h.home, ".ddpctl", "runs", spec.run_id) for h in bed.hosts] if bed else [])
    place = place_of_record(run_dir.typed_record())
    assert place is place_named(name)
    asked = UpOptions(runs_dir=folder / "runs", show_progress=False, identity_file=key)
    try:
        rows = wait_for("every node to be running", lambda: (rows := place.status_rows(run_dir, asked)) and all(
            row["state"] == "running" for row in rows) and rows, timeout=120)
        assert [row["node"] for row in rows] == list(range(spec.nnodes))
        capsys.readouterr()

        def logged() -> str | None:
            place.print_rank_log(run_dir, 0, 5, False, asked, None)  # `logs --rank 0`, the same on every place
            out = capsys.readouterr().out
            return out if "toy step 3 of rank 0" in out else None

        assert "toy step" in wait_for("rank 0's lines in logs", logged, timeout=60)
        said = place.down(run_dir, asked, False)
        assert said.startswith(f"stopped run {run_dir.run_id}"), said
        assert all(row["state"] != "running" for row in place.status_rows(run_dir, asked))
        wait_for("nothing of the run left", lambda: not any(processes_of(p) for p in places), timeout=10)
    finally:
        for pid in [pid for p in places for pid in processes_of(p)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_a_toy_place_is_a_module_and_one_registry_line(toy_registered: None, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert place_named("toy").name == "toy"
    keeps_the_contract("toy", tmp_path, capsys)
    assert place_of_record(RunDir.open(next((tmp_path / "runs").iterdir())).typed_record()).name == "toy"


@pytest.mark.integration
def test_this_machine_keeps_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    keeps_the_contract("local", tmp_path, capsys)


@pytest.mark.e2e
@pytest.mark.testbed
def test_two_ssh_hosts_keep_the_contract(bed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(bed.known_hosts_path))
    keeps_the_contract("ssh", tmp_path, capsys, bed)


@pytest.mark.unit
def test_an_unknown_place_is_one_line_naming_the_places() -> None:
    with pytest.raises(SpecError, match=r"^--provider 'pbs': choose local, ssh, vast or slurm$"):
        place_named("pbs")
