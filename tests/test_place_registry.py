"""Adding a place is a folder and one registry line: a toy place, registered here only, keeps the contract every
place keeps (tests/place_contract.py: `up --detach` of a `-- python script.py` run; status, logs, logs -f, pull, down,
the measured world, the report row and --stall-timeout, as a user asks them; nothing of it left), and so do this
machine's own place, two SSH hosts of the test bed and a job on the test Slurm cluster (a rented Vast.ai machine:
tests/test_vast_up.py).
Real torchrun, real script, real sshd, real Slurm."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from infra.testbed import Testbed
from launcher.errors import SpecError
from launcher.execute.day2.recorded import LocalRun
from launcher.places.local.machine import LocalMachine
from launcher.places.on_provider import ProvidedPlace
from launcher.places.registry import PLACES, place_named, place_of_record
from launcher.planning.request import UpOptions
from launcher.providers.base import AcquiredHosts
from launcher.results.rundir import RunDir
from launcher.spec.hosts import parse_host
from launcher.spec.run_spec import RunSpec
from tests.place_contract import LOCAL_SAYS, SLURM_SAYS, keeps_the_contract
from tests.slurm_fixtures import needs_slurm
from tests.testbed_fixtures import lent


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


@pytest.mark.integration
def test_a_toy_place_is_a_module_and_one_registry_line(toy_registered: None, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert place_named("toy").name == "toy"
    # Its runs are this machine's runs, followed by the same code: their --stall-timeout is this machine's (below).
    keeps_the_contract("toy", tmp_path, capsys, said=LOCAL_SAYS, stall_args=None)
    assert place_of_record(RunDir.open(next((tmp_path / "runs").iterdir())).typed_record()).name == "toy"


@pytest.mark.integration
def test_this_machine_keeps_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    keeps_the_contract("local", tmp_path, capsys, said=LOCAL_SAYS, stall_args=("--gpus", "1"))


@pytest.mark.e2e
@pytest.mark.testbed
def test_two_ssh_hosts_keep_the_contract(bed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(bed.known_hosts_path))
    on_bed = tuple(arg for h in bed.hosts for arg in ("--host", h.spec))
    keeps_the_contract("ssh", tmp_path, capsys, bed, stall_args=(*on_bed, "-i", bed.client_key_path, "--gpus", "1"))


@pytest.mark.unit
def test_an_unknown_place_is_one_line_naming_the_places() -> None:
    with pytest.raises(SpecError, match=r"^--provider 'pbs': choose local, ssh, vast or slurm$"):
        place_named("pbs")


@pytest.mark.e2e
@needs_slurm
def test_a_slurm_job_keeps_the_contract(slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """On the test cluster (the Slurm tests' own, made once per session): the same contract, in Slurm's words; and
    what `down` of the running job left in Slurm and in run.json (cancelled while it ran, its end the failure)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(slurm_cluster.bed.known_hosts_path))
    requests = place_named("slurm").requests({"nodes": 1, "partition": slurm_cluster.partition, "time": "10"})
    run_dir = keeps_the_contract("slurm", tmp_path, capsys, slurm_cluster.bed,
                                 hosts=(parse_host(slurm_cluster.login.spec),), extra=requests, said=SLURM_SAYS,
                                 left_in=lambda run: [Path(run.record()["slurm"]["remote_dir"])],
                                 stall_args=("--provider", "slurm", "--host", slurm_cluster.login.spec, "-i",
                                             slurm_cluster.bed.client_key_path, "--gpus", "1", "--partition",
                                             slurm_cluster.partition, "--time", "10"))
    record = run_dir.record()
    job = str(record["slurm"]["job_id"])
    assert job not in slurm_cluster.slurm("squeue", "-h", "-o", "%i").stdout.split()  # nothing left queued
    assert "JobState=CANCELLED" in slurm_cluster.slurm("scontrol", "show", "job", job).stdout
    cancels = [e for e in run_dir.events() if e.get("event") == "cancel_requested"]
    assert [(e["job_id"], e["state"]) for e in cancels] == [(job, "RUNNING")]  # `down` cancelled it while it ran
    assert record["slurm"]["end"].startswith(f"job {job} CANCELLED")
    assert record["failure"]["slurm_state"] == "CANCELLED"
    assert record["failure"]["summary"].startswith(f"job {job} CANCELLED")
