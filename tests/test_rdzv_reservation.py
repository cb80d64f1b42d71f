"""Rendezvous port reservations (launcher/planning/rdzv_reservation.py), run here as node 0 would run them: the
scripts are started as separate processes (two at once where it matters), in a reservation directory of the
test's own, with a HOME of its own. The end-to-end checks (two `up` at once on the test bed, an explicit port
that another run holds) are in tests/faults/test_fault_matrix.py."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import HostError
from launcher.execute.failures.cause import attribute, final_line
from launcher.planning import rdzv_reservation
from launcher.planning.host_round import probe_all
from launcher.planning.preflight import reached_port
from launcher.planning.rdzv_reservation import (
    RESERVATION_TTL,
    listen_request,
    release_reservation,
    reserve_and_listen,
)
from launcher.remote.attribution import node_report
from launcher.transport.connection import HostConnection
from launcher.transport.parallel import raise_for_errors
from launcher.transport.ssh import CommandResult

ADDR = "127.0.0.1"
SYSTEM_PYTHON = "/usr/bin/python3"  # one another login user can run (this python may live under /root)


class Shell:
    """Runs argv here as node 0's login user would over SSH: its own HOME, optionally as another user."""

    def __init__(self, home: Path, as_user: str | None = None) -> None:
        self.env = {**os.environ, "HOME": str(home)}
        ids = pwd.getpwnam(as_user) if as_user else None
        self.prefix = (["setpriv", f"--reuid={ids.pw_uid}", f"--regid={ids.pw_gid}", "--clear-groups"] if ids
                       else [])

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | Iterable[bytes] | None = None) -> CommandResult:
        given = stdin if isinstance(stdin, bytes) else b"".join(stdin or ())  # parts: the last may wait for node 0
        done = subprocess.run([*self.prefix, *argv], capture_output=True, timeout=timeout, env=self.env, input=given)
        out, err = (stream.decode(errors="replace") for stream in (done.stdout, done.stderr))
        return CommandResult(done.returncode, out, err)


@pytest.fixture
def place(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A reservation directory of this test's own (in a folder every user may enter), in place of /tmp's."""
    base = Path(tempfile.mkdtemp(prefix="ddpctl-rdzv-test-", dir="/tmp"))
    base.chmod(0o755)
    monkeypatch.setattr(rdzv_reservation, "RESERVATION_DIR", str(base / "rdzv"))
    try:
        yield base / "rdzv"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


def reserve(shell: Shell, port: int, run_id: str | None, *, any_free: bool = True,
            python: str = sys.executable) -> int:
    """One probe of node 0 that no other node connects to: the port is listened on for a moment only."""
    return reserve_and_listen(shell, python, "node0", ADDR, port, expect=0, seconds=15, any_free=any_free,
                              run_id=run_id)


def wait_unbound(port: int) -> None:
    """Until nothing listens on `port` any more (the probe's child has ended): the window before torchrun binds."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ADDR, port))
                return
            except OSError:
                time.sleep(0.05)
    raise AssertionError(f"port {port} stayed bound")


def probe_round(nodes: list[HostConnection], labels: list[str], port: int, run_id: str | None = None) -> int:
    """One probe round as `up` makes it (`run_id`: the port reserved for that run) or a dry run and doctor do
    (None: read-only): node 0 listens on its rendezvous port, or on one it picks where that one is taken, and the
    other nodes connect to it; the port node 0 listened on."""
    listen = listen_request(addr=ADDR, port=port, expect=len(nodes) - 1, seconds=30, any_free=True, run_id=run_id)
    outcomes = probe_all(nodes, labels, sys.executable, listen=listen, connect_timeout=10)
    raise_for_errors(outcomes, "rendezvous check")
    return reached_port(outcomes, labels, ADDR, port)


def reserved(place: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in place.glob("port-*")}


def test_a_port_reserved_and_not_yet_bound_is_never_chosen_again(place: Path, tmp_path: Path) -> None:
    """Run A's probe reserved the default port; its torchrun has not bound it yet. Run B's probe (any user) gets
    another port, and an explicit --rdzv-port of A's is refused in one line naming the port, the run and what to do."""
    shell, port = Shell(tmp_path), free_port()
    nodes: list[HostConnection] = [shell, shell]
    labels = ["node0", "node1"]  # node 1 connects to node 0's port, as in a probe
    assert probe_round(nodes, labels, port, "run-a") == port
    wait_unbound(port)
    second = probe_round(nodes, labels, port, "run-b")
    assert second != port, "a reserved port was chosen again while its run had not started torchrun"
    assert {name: r["run_id"] for name, r in reserved(place).items()} == {f"port-{port}-run-a": "run-a",
                                                                         f"port-{second}-run-b": "run-b"}
    assert oct(place.stat().st_mode & 0o7777) == "0o1777", "every login user reserves; only owners remove"
    with pytest.raises(HostError) as refused:
        reserve(shell, port, "run-c", any_free=False)
    text = str(refused.value)
    assert f"rendezvous port {port} on node 0" in text and "run run-a" in text and "omit --rdzv-port" in text
    assert "torchrun not started yet" in text and "\n" not in text
    assert not list(place.glob("port-*-run-c")), "a refused probe reserves nothing"


def test_two_probes_at_the_same_moment_get_two_ports(place: Path, tmp_path: Path) -> None:
    """Two probes started together, each as its own process, both asked for the same free port."""
    shell, port, rounds = Shell(tmp_path), free_port(), 3
    for attempt in range(rounds):
        start, got = threading.Barrier(2), dict[str, int]()

        def probe(run_id: str, start: threading.Barrier, got: dict[str, int]) -> None:
            start.wait()
            got[run_id] = reserve(shell, port, run_id)

        threads = [threading.Thread(target=probe, args=(f"run-{attempt}-{k}", start, got)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(got) == 2 and len(set(got.values())) == 2, got
        assert port in got.values(), "one of them got the port it asked for"
        for run_id in got:
            assert release_reservation(shell, sys.executable, run_id) == "released 1"
        wait_unbound(port)


def test_stale_reservations_give_way_and_a_listening_socket_never_does(place: Path, tmp_path: Path) -> None:
    """An old reservation (a launcher that died) no longer holds its port, nor does one made in another network
    namespace; a port something listens on is never chosen, whatever its reservation's age."""
    shell, port = Shell(tmp_path), free_port()
    assert reserve(shell, port, "dead-run") == port
    wait_unbound(port)
    old = time.time() - RESERVATION_TTL - 60
    os.utime(place / f"port-{port}-dead-run", (old, old))
    assert reserve(shell, port, "next-run") == port, "a stale reservation kept its port"
    assert not (place / f"port-{port}-dead-run").exists(), "the owner's stale reservation is removed"
    wait_unbound(port)
    elsewhere = place / f"port-{port}-other-netns"
    elsewhere.write_text(json.dumps({"run_id": "other-netns", "port": port, "netns": "net:[1]"}))
    (place / f"port-{port}-next-run").unlink()
    assert reserve(shell, port, "third-run") == port, "another namespace's reservation held this one's port"
    wait_unbound(port)

    with socket.socket() as listener:  # e.g. the store of a torchrun whose reservation is older than the TTL
        listener.bind((ADDR, port))
        listener.listen()
        os.utime(place / f"port-{port}-third-run", (old, old))
        assert reserve(shell, port, "fourth-run") != port
        with pytest.raises(HostError, match=f"rendezvous port {port} on node 0 is held by run third-run .*"
                                            "its torchrun listens there"):
            reserve(shell, port, "fifth-run", any_free=False)
        (place / f"port-{port}-third-run").unlink()
        with pytest.raises(HostError, match=f"rendezvous port {port} on node 0 is in use by another program: "
                                            "omit --rdzv-port"):
            reserve(shell, port, "sixth-run", any_free=False)


def test_a_reservation_is_released_at_once_or_once_the_started_torchrun_listens(place: Path, tmp_path: Path) -> None:
    shell, port = Shell(tmp_path), free_port()
    reserve(shell, port, "never-started")
    assert release_reservation(shell, sys.executable, "never-started") == "released 1"  # refused before the start
    assert not reserved(place)

    reserve(shell, port, "detached")
    wait_unbound(port)
    workspace = tmp_path / ".ddpctl" / "runs" / "detached"
    workspace.mkdir(parents=True)
    (workspace / "pid").write_text("1\n")  # started, not listening yet: kept until it listens or ends
    assert release_reservation(shell, sys.executable, "detached") == "waiting"
    time.sleep(1.0)
    assert f"port-{port}-detached" in reserved(place), "released before torchrun held the port"
    (workspace / "exit_code").write_text("1\n")  # torchrun ended before listening
    deadline = time.monotonic() + 10
    while reserved(place) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not reserved(place)


def test_a_dry_run_or_doctor_reads_reservations_and_writes_nothing(place: Path, tmp_path: Path) -> None:
    shell, port = Shell(tmp_path), free_port()
    nodes: list[HostConnection] = [shell, shell]
    assert probe_round(nodes, ["n0", "n1"], port) == port
    assert not place.exists(), "a read-only probe made the reservation directory"
    reserve(shell, port, "holder")
    wait_unbound(port)
    before = sorted(p.name for p in place.iterdir())
    assert probe_round(nodes, ["n0", "n1"], port) != port
    assert sorted(p.name for p in place.iterdir()) == before


def test_another_login_user_respects_and_makes_reservations(place: Path, tmp_path: Path) -> None:
    """Root made the directory and the lock; `nobody` (another login user on the same host) still takes the lock,
    sees root's reservation and reserves a port of its own, which root's next probe respects in turn."""
    if not os.path.exists(SYSTEM_PYTHON) or os.geteuid() != 0:
        pytest.skip("needs root and /usr/bin/python3 to act as a second login user")
    root, other = Shell(tmp_path), Shell(Path("/nonexistent"), as_user="nobody")
    port = free_port()
    assert reserve(root, port, "roots-run", python=SYSTEM_PYTHON) == port
    wait_unbound(port)
    theirs = reserve(other, port, "nobodys-run", python=SYSTEM_PYTHON)
    assert theirs != port
    assert (place / f"port-{theirs}-nobodys-run").stat().st_uid == 65534
    wait_unbound(theirs)
    assert reserve(root, theirs, "roots-second", python=SYSTEM_PYTHON) not in (port, theirs)
    assert release_reservation(other, SYSTEM_PYTHON, "roots-run") == "released 0", "only the owner removes"


def test_an_unsafe_reservation_directory_is_refused_in_one_line(place: Path, tmp_path: Path) -> None:
    place.mkdir()
    place.chmod(0o777)  # writable by everyone but not sticky: anyone could replace another user's reservation
    with pytest.raises(HostError, match="cannot reserve node 0.s rendezvous port: .* writable by others without "
                                        "the sticky bit"):
        reserve(Shell(tmp_path), free_port(), "run-x")


# What node 0's torchrun (2.13, `--rdzv-conf is_host=1`) printed when its port had been taken (shortened): the
# cause is in the first of its two tracebacks, not the last one that the failure's lines show.
PORT_TAKEN_OUTPUT = """Traceback (most recent call last):
  File ".../torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 160, in _create_tcp_store
    store = TCPStore(
            ^^^^^^^^^
torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. \
port: 29400, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File ".../torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 180, in _create_tcp_store
    raise RendezvousConnectionError(
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. \
See inner exception for details.
"""


def test_a_port_taken_between_the_probe_and_torchrun_is_named_in_one_line(tmp_path: Path) -> None:
    """Another program (not a ddpctl run: those reserve) bound node 0's port after the probe: the run's failure
    line says so and what to do, not only c10d's 'connection to the C10d store has failed'."""
    workspace = tmp_path / "node0"
    workspace.mkdir()
    (workspace / "torchrun.out").write_text(PORT_TAKEN_OUTPUT)
    (workspace / "exit_code").write_text("1\n")
    record = attribute([node_report(str(workspace)), None], ["h0", "h1"])
    assert record is not None
    line = final_line(record)
    assert "rendezvous port 29400 on node 0 was taken by another program" in line and "rerun" in line, line
    assert "\n" not in line
