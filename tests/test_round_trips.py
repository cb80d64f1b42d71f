"""How often `up` reaches each host before the first training step, counted on the connections themselves (every
SSH channel a Connection opens: a command, the SFTP subsystem), on the real two-host test bed: one round trip per
host per phase (connect, probe, ship, start), the probe's pieces (facts, Docker engine check, node 0's rendezvous
reservation, the other nodes' reachability check, the code cache's listing) merged into one
(launcher/remote/probe_round.py), the code's copy into the workspace done by the start, and a followed run's
polls asked of one node program per host."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed
from launcher.cli.doctor import run_doctor
from launcher.execute.following import interruption
from launcher.execute.hosts import run as on_hosts
from launcher.places.registry import run_up
from launcher.planning.rdzv_reservation import RESERVATION_DIR
from launcher.planning.request import UpOptions
from launcher.runtimes.served_polls import ServedNodeProgram
from launcher.spec.hosts import parse_host
from launcher.spec.run_spec import RunSpec, new_run_id
from launcher.transport.ssh import Connection
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
TRAIN = ("--synthetic-train-size", "256", "--synthetic-test-size", "64")


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """Two hosts with this machine's python and torch (the shared ones: their code caches start empty)."""
    yield from lent(two_hosts)


@pytest.fixture
def channels(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Channels opened per host label, from now on (every command and the SFTP subsystem open one)."""
    opened: Counter[str] = Counter()
    original = Connection._session

    def counted(self: Connection) -> object:
        opened[self.label] += 1
        return original(self)

    monkeypatch.setattr(Connection, "_session", counted)
    return opened


def wait_for_exit_codes(bed: Testbed, run_id: str) -> None:
    deadline = time.monotonic() + 300
    codes = [Path(h.home, ".ddpctl", "runs", run_id, "exit_code") for h in bed.hosts]
    while not all(c.exists() for c in codes):
        assert time.monotonic() < deadline, f"run {run_id} did not end within 300 s"
        time.sleep(0.5)
    assert [c.read_text().strip() for c in codes] == ["0", "0"]


def test_a_dry_run_and_up_reach_each_host_once_per_phase(bed: Testbed, tmp_path: Path, channels: Counter[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Dry run: connect and probe, two channels per host (before: three, the rendezvous check apart), and
    nothing left on the hosts. `up --detach`: connect, probe (which lists the code cache too), ship (create the
    cache's folders, on the first run only: the files go over the SFTP channel opened at connect), start (which
    copies the cache into the workspace), and node 0's reservation released. Before: the cache's listing and the
    copy were a channel each (7 and 6 channels on the first run, 6 and 5 on a relaunch)."""
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(bed.known_hosts_path))
    for host in bed.hosts:  # the first run here ships the code: the hosts' code caches start empty
        shutil.rmtree(Path(host.home, ".ddpctl", "code"), ignore_errors=True)
    labels = [h.spec for h in bed.hosts]
    options = UpOptions(runs_dir=tmp_path / "runs", hosts=tuple(parse_host(h) for h in labels),
                        identity_file=Path(bed.client_key_path), show_progress=False, show_output=False,
                        runtime="auto", auto_rdzv_port=True, dry_run=True)  # auto: the engine check is asked too
    spec = RunSpec(run_id=new_run_id(None, "mnist-cnn", "synthetic"), nnodes=2, nproc_per_node=1, epochs=1,
                   trainer_args=TRAIN)
    dry = run_up(spec, options)
    assert dry.error is None and dry.plan is not None and dry.plan.unknown == () and dry.plan.runtime == "native"
    assert dict(channels) == {labels[0]: 2, labels[1]: 2}
    assert not list(Path(RESERVATION_DIR).glob(f"*{spec.run_id}*")), "a dry run reserves nothing"
    assert not any(Path(h.home, ".ddpctl", "runs", spec.run_id).exists() for h in bed.hosts)

    previous = interruption.catch_stop_signals()
    try:
        for expected in ({labels[0]: 5, labels[1]: 4}, {labels[0]: 4, labels[1]: 3}):  # cold, then warm
            channels.clear()
            run_id = new_run_id(None, "mnist-cnn", "synthetic")
            started = run_up(replace(spec, run_id=run_id), replace(options, dry_run=False, detach=True))
            assert started.exit_code == 0 and started.run_dir is not None
            assert dict(channels) == expected, f"channels per host: {dict(channels)}"
            wait_for_exit_codes(bed, run_id)
            assert not list(Path(RESERVATION_DIR).glob(f"*{run_id}*")), "the reservation goes once torchrun listens"
    finally:
        interruption.act_on_deferred()
        interruption.restore_signals(previous)


def test_doctor_reaches_each_host_once_and_checks_the_network_in_the_same_round(
        bed: Testbed, channels: Counter[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`doctor` on two hosts: the facts and node 0's rendezvous port reached from node 1 come from one probe per
    host, one channel each (before: a probe, then a second round for the network)."""
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(bed.known_hosts_path))
    labels = [h.spec for h in bed.hosts]
    options = UpOptions(runs_dir=Path("unused"), hosts=tuple(parse_host(h) for h in labels),
                        identity_file=Path(bed.client_key_path), show_progress=False, show_output=False)
    assert run_doctor(options, gpus=1, python="python3", rdzv_port=29400, json_out=True)
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and [r["ok"] for r in report["hosts"]] == [True, True], report
    assert re.fullmatch(rf"every node reached node 0 at {re.escape(bed.hosts[0].address)}:\d+", report["network"])
    assert dict(channels) == {labels[0]: 1, labels[1]: 1}


def test_a_followed_runs_polls_go_to_one_node_program_per_host(bed: Testbed, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every poll of a followed run is asked of the node program kept running on each host (one channel, one
    Python start there for all of them: launcher/runtimes/served_polls.py), none of a program of its own, and
    no served program is left on a host once `up` has returned."""
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(bed.known_hosts_path))
    opened: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    one_shot: list[str] = []
    open_served, ask_served = ServedNodeProgram.__init__, ServedNodeProgram.ask

    def counted_open(self: ServedNodeProgram, conn: Any, python: str) -> None:
        opened[conn.label] += 1
        open_served(self, conn, python)

    def counted_ask(self: ServedNodeProgram, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        found = ask_served(self, request, timeout)
        asked[self.label] += 1
        return found

    monkeypatch.setattr(ServedNodeProgram, "__init__", counted_open)
    monkeypatch.setattr(ServedNodeProgram, "ask", counted_ask)
    monkeypatch.setattr(on_hosts, "read_state", lambda conn, *a, **k: one_shot.append(conn.label))
    labels = [h.spec for h in bed.hosts]
    options = UpOptions(runs_dir=tmp_path / "runs", hosts=tuple(parse_host(h) for h in labels),
                        identity_file=Path(bed.client_key_path), show_progress=False, show_output=False)
    spec = RunSpec(run_id=new_run_id(None, "mnist-cnn", "synthetic"), nnodes=2, nproc_per_node=1, epochs=1,
                   trainer_args=TRAIN)
    result = run_up(spec, options)
    assert result.error is None and result.exit_code == 0
    assert dict(opened) == {labels[0]: 1, labels[1]: 1} and one_shot == []
    assert all(asked[label] >= 2 for label in labels), f"polls answered per host: {dict(asked)}"
    deadline = time.monotonic() + 10
    while left := [line for h in bed.hosts for line in _served_programs(h.user)]:
        assert time.monotonic() < deadline, f"served node programs left: {left}"
        time.sleep(0.2)


def _served_programs(user: str) -> list[str]:
    found = subprocess.run(["pgrep", "-a", "-u", user, "-f", "--", "--serve"], capture_output=True, text=True)
    return found.stdout.splitlines()
