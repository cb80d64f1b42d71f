"""The host side of the rendezvous port's reservation and of the probe's round trip (launcher/remote/rdzv_port.py,
launcher/remote/probe_round.py, host_probe's address rule), called here as functions on a temporary reservation
directory: no SSH, no process. (Run as the hosts run them, over a connection: tests/test_round_trips.py.)"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.planning.facts import HostAddress, HostFacts
from launcher.remote import host_probe, probe_round, rdzv_port

ADDR = "127.0.0.1"


@pytest.fixture
def place(tmp_path: Path) -> Path:
    return tmp_path / "rdzv"


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """The listening sockets a test got, closed at its end."""
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


def reserve(place: Path, port: int, run_id: str, held: list[socket.socket], *, any_free: bool = True,
            ttl: float = 3600) -> int:
    sock = rdzv_port.reserve(ADDR, port, any_free=any_free, run_id=run_id, path=str(place), ttl=ttl,
                             workspace=f".ddpctl/runs/{run_id}")
    held.append(sock)
    return int(sock.getsockname()[1])


def reservations(place: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in place.glob("port-*")}


def test_a_reserved_port_listens_and_is_recorded_for_its_run(place: Path, sockets: list[socket.socket]) -> None:
    port = free_port()
    assert reserve(place, port, "run-a", sockets) == port
    assert rdzv_port.listening(port)  # read from /proc, as a later probe reads it
    (record,) = reservations(place).values()
    assert record["run_id"] == "run-a" and record["port"] == port and record["addr"] == ADDR
    assert record["workspace"] == os.path.join(os.path.expanduser("~"), ".ddpctl/runs/run-a")
    assert oct(place.stat().st_mode & 0o7777) == "0o1777", "every login user reserves; only owners remove"
    assert not list(place.glob(".new-*")), "the record is written under a temporary name, then renamed"


def test_another_run_gets_another_port_and_an_explicit_taken_port_is_refused(place: Path,
                                                                              sockets: list[socket.socket]) -> None:
    port = free_port()
    reserve(place, port, "run-a", sockets)
    sockets.pop().close()  # run A's probe has ended: the port is reserved, not bound
    assert not rdzv_port.listening(port)
    other = reserve(place, port, "run-b", sockets)
    assert other != port
    with pytest.raises(rdzv_port.Refusal) as refused:
        reserve(place, port, "run-c", sockets, any_free=False)
    words = str(refused.value).split()
    assert words[:3] == ["reserved", str(port), "run-a"] and words[-1] == "0"  # held, torchrun not listening
    assert {r["run_id"] for r in reservations(place).values()} == {"run-a", "run-b"}


def test_a_port_another_program_listens_on_is_in_use(place: Path, sockets: list[socket.socket]) -> None:
    other_program = socket.socket()
    sockets.append(other_program)
    other_program.bind((ADDR, 0))
    other_program.listen(1)
    port = other_program.getsockname()[1]
    with pytest.raises(rdzv_port.Refusal, match=f"^in-use {port}$"):
        reserve(place, port, "run-a", sockets, any_free=False)
    assert reserve(place, port, "run-a", sockets) != port  # without --rdzv-port: one the host has free


def test_a_dry_run_reads_reservations_and_writes_nothing(place: Path, sockets: list[socket.socket]) -> None:
    port = free_port()
    assert reserve(place, port, "", sockets) == port
    assert not place.exists(), "a dry run creates no reservation directory"
    sockets.pop().close()
    assert reserve(place, port, "run-a", sockets, any_free=False) == port
    sockets.pop().close()
    assert reserve(place, port, "", sockets) != port, "a dry run avoids a port another run reserved"
    assert list(reservations(place)) == [f"port-{port}-run-a"]


def test_a_stale_reservation_of_ones_own_is_removed_and_its_port_reused(place: Path,
                                                                        sockets: list[socket.socket]) -> None:
    port = free_port()
    reserve(place, port, "old-run", sockets)
    sockets.pop().close()
    old = place / f"port-{port}-old-run"
    os.utime(old, (time.time() - 7200, time.time() - 7200))  # older than the time to live, torchrun never bound
    assert reserve(place, port, "new-run", sockets, any_free=False) == port
    assert list(reservations(place)) == [f"port-{port}-new-run"]


@pytest.mark.parametrize("kind", ["link", "no sticky bit"])
def test_an_unsafe_reservation_directory_is_refused(tmp_path: Path, sockets: list[socket.socket], kind: str) -> None:
    place = tmp_path / "rdzv"
    if kind == "link":
        (tmp_path / "elsewhere").mkdir()
        place.symlink_to(tmp_path / "elsewhere")
    else:
        place.mkdir()
        place.chmod(0o777)
    with pytest.raises(rdzv_port.Refusal, match="^unsafe: "):
        reserve(place, free_port(), "run-a", sockets)


def test_release_removes_only_the_runs_own_reservation(place: Path, sockets: list[socket.socket]) -> None:
    first, second = reserve(place, free_port(), "run-a", sockets), reserve(place, free_port(), "run-b", sockets)
    assert rdzv_port.release("run-a", str(place), 0, ".ddpctl/runs/run-a") == "released 1"
    assert list(reservations(place)) == [f"port-{second}-run-b"] and first != second
    assert rdzv_port.release("run-a", str(place), 0, ".ddpctl/runs/run-a") == "released 0"
    assert rdzv_port.release("run-x", str(place / "missing"), 0, "") == "released 0"


def test_accept_ends_at_once_when_no_connection_is_expected(sockets: list[socket.socket]) -> None:
    sock = socket.socket()
    sock.bind((ADDR, 0))
    sock.listen(1)
    began = time.monotonic()
    assert rdzv_port.accept(sock, 0, 30) == 0 and time.monotonic() - began < 1
    assert sock.fileno() == -1, "the listener is closed"


def test_the_address_rule_is_one_on_both_sides() -> None:
    """Node 0 listens on the address the plan then gives it: HostFacts.address and the probe's own_address are
    one rule (the address reached over SSH when it is the host's own, else its first non-loopback IPv4)."""
    addrs = [{"iface": "lo", "addr": "127.0.0.1"}, {"iface": "eth0", "addr": "fe80::1"},
             {"iface": "eth0", "addr": "10.0.0.5"}, {"iface": "eth1", "addr": "10.1.0.5"}]
    cases = [("10.1.0.5", "10.1.0.5"), ("192.0.2.7", "10.0.0.5"), (None, "10.0.0.5")]
    for reached, expected in cases:
        assert host_probe.own_address(reached, addrs) == expected
        facts = HostFacts("h", ssh_server_addr=reached,
                          addrs=tuple(HostAddress(a["iface"], a["addr"]) for a in addrs))
        assert facts.address == expected
    assert host_probe.own_address("192.0.2.7", [{"iface": "lo", "addr": "127.0.0.1"}]) == "192.0.2.7"


def test_node_0_listens_on_the_given_address_else_its_own_else_its_name() -> None:
    facts = {"ssh_server_addr": "10.0.0.5", "addrs": [{"iface": "eth0", "addr": "10.0.0.5"}]}
    given = {"addr": "10.9.9.9", "own": True, "hostname": "node0.example"}
    assert probe_round.listen_address(given, facts) == "10.9.9.9"
    assert probe_round.listen_address(dict(given, addr=None), facts) == "10.0.0.5"
    assert probe_round.listen_address(dict(given, addr=None, own=False), facts) == "node0.example"
    assert probe_round.listen_address(dict(given, addr=None), {"addrs": []}) == "node0.example"
    assert probe_round.is_public("8.8.8.8") and not probe_round.is_public("10.0.0.5")
    assert not probe_round.is_public("node0.example")  # a name: judged by the launcher from the nodes' own
