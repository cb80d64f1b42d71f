"""Rendezvous port reservations on node 0: the probe picks node 0's port and reserves it for the run in one step,
under a lock shared by every user of the host, so two runs probing at the same moment never get the same port
(on the host: launcher/remote/rdzv_port.py, run within node 0's probe, launcher/planning/host_round.py).

The port is only *bound* minutes later, when torchrun starts (after the ship). Between the two, a reservation
file in RESERVATION_DIR (mode 1777, sticky: any login user may reserve, only the owner may remove) tells every
other probe that the port is taken. A reservation is live while a socket listens on its port (a torchrun
listening always wins), or while it is younger than RESERVATION_TTL and its run's torchrun has not ended; a
launcher that died leaves one that goes stale by that rule. Reservations are kept per network namespace (ports
are), and each names its run. `up` releases its reservation however it ends (`reservation_released`); `down`
releases it too. A dry run or `doctor` reads reservations (to avoid a reserved port) but writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from launcher.errors import HostError
from launcher.planning.host_round import run_probe
from launcher.planning.plan import REMOTE_RUNS_ROOT
from launcher.remote import daemon, rdzv_port
from launcher.remote.program import program
from launcher.transport.parallel import run_on_hosts

if TYPE_CHECKING:
    from launcher.transport.connection import HostConnection
    from launcher.transport.hostsession import HostSession

# The same directory for every user of a host, so it is not $TMPDIR (which may differ between users).
RESERVATION_DIR = "/tmp/ddpctl-rdzv"
# Seconds a reservation of a run that has not started torchrun stays live: covers the ship (image streaming and
# code, retried) between the probe and torchrun's start. Past it, only a listening socket keeps the port.
RESERVATION_TTL = 3600
RELEASE_TIMEOUT = 10.0  # seconds: a node 0 that cannot be reached leaves its reservation to go stale
START_WAIT = 600.0  # seconds a release waits for a started torchrun to listen (it imports torch first)

# `python -c RELEASE_PROGRAM release RUN_ID DIR WAIT WORKSPACE` (launcher/remote/rdzv_port.py): removes the run's
# reservations (this user's), once a started torchrun listens; prints `released N` or `waiting`.
RELEASE_PROGRAM = program(rdzv_port, daemon)


def listen_request(*, addr: str | None, port: int, expect: int, seconds: float, any_free: bool,
                   run_id: str | None, own: bool = False, hostname: str = "",
                   allow_public: bool = True) -> dict[str, Any]:
    """What node 0's probe is asked (launcher/remote/probe_round.py's `listen`): listen on `addr` (else, with
    `own`, the host's own address, else `hostname`), on `port` (or with `any_free` one the host has free), for
    `expect` connections during `seconds`; reserve the port for `run_id` (None: a dry run, nothing written).
    Unless `allow_public`, a public address is not listened on."""
    return {"addr": addr, "own": own, "hostname": hostname, "port": port, "expect": expect, "seconds": seconds,
            "any_free": any_free, "allow_public": allow_public, "run_id": run_id or "", "dir": RESERVATION_DIR,
            "ttl": RESERVATION_TTL, "workspace": f"{REMOTE_RUNS_ROOT}/{run_id}" if run_id else ""}


def listening_port(label: str, answer: str, addr: str, port: int) -> int:
    """The port node 0 listens on, from its answer; else a HostError saying why not in one line (a port another
    run holds or another program uses, an unsafe reservation directory, an address that cannot be listened on)."""
    words = answer.split()
    if len(words) == 2 and words[0] == "listening" and words[1].isdigit():
        return int(words[1])
    advice = "omit --rdzv-port to have a free port chosen, or pick another with --rdzv-port"
    if len(words) == 6 and words[0] == "reserved":
        _, taken, run, user, age, bound = words
        state = ("its torchrun listens there" if bound == "1"
                 else f"reserved {int(age)} s ago, torchrun not started yet")
        raise HostError(label, f"rendezvous port {taken} on node 0 is held by run {run} of user {user} ({state}): "
                        f"{advice}")
    if answer.startswith(("unsafe: ", "locked: ")):
        raise HostError(label, f"cannot reserve node 0's rendezvous port: {answer.split(': ', 1)[1]}")
    if len(words) == 2 and words[0] == "in-use":
        raise HostError(label, f"rendezvous port {words[1]} on node 0 is in use by another program: {advice}")
    raise HostError(label, f"cannot listen on rendezvous address {addr}:{port} ({answer or 'no answer'}); pass "
                    "--rdzv-addr or --rdzv-port")


def reserve_and_listen(conn: HostConnection, python: str, label: str, addr: str, port: int, *, expect: int,
                       seconds: float, any_free: bool, run_id: str | None) -> int:
    """Node 0's probe asked only to choose its rendezvous port (`port` unless another run reserved it or it is in
    use; with `any_free` then another), reserve it for `run_id` (None: reserve nothing) and listen on it for
    `expect` connections. Returns the port; an explicit port that is taken is refused in one line."""
    answer = run_probe(conn, python, label, listen=listen_request(
        addr=addr, port=port, expect=expect, seconds=seconds, any_free=any_free, run_id=run_id))
    return listening_port(label, answer.listen or "", addr, port)


def release_reservation(conn: HostConnection, python: str, run_id: str, wait: float = START_WAIT) -> str:
    """Remove the run's reservation on node 0 (at once, or once its started torchrun listens); the program's
    answer. A reservation left behind goes stale by rule."""
    result = conn.run([python, "-c", RELEASE_PROGRAM, "release", run_id, RESERVATION_DIR, str(wait),
                       f"{REMOTE_RUNS_ROOT}/{run_id}"], timeout=RELEASE_TIMEOUT)
    return str(result.stdout).strip()


def release_on_node0(session: HostSession, python: str, run_id: str) -> None:
    """Release the run's reservation on node 0's host, bounded in time; a host that cannot be reached keeps it
    until it goes stale."""
    if len(session.targets) < 2:
        return  # one node: no rendezvous port was reserved
    run_on_hosts([0], lambda i: release_reservation(session.conn(i), python, run_id), timeout=RELEASE_TIMEOUT + 5,
                 label=session.label_of)


@contextmanager
def reservation_released(session: HostSession, python: str, run_id: str) -> Iterator[None]:
    """Around `up` on hosts from the probe on: however it ends (finished, failed, interrupted, refused before
    the start, detached), node 0's reservation is released, a started torchrun's once it listens."""
    try:
        yield
    finally:
        release_on_node0(session, python, run_id)


def rendezvous_taken_hint(port: int | None, node: int) -> str | None:
    """When node 0's torchrun could not bind its rendezvous port (another program took it after the probe):
    what happened and what to do, in one line. ddpctl does not retry on its own: every node's command names
    the port, so a retry is a new run."""
    if port is None or node != 0:
        return None
    return (f"rendezvous port {port} on node 0 was taken by another program between ddpctl's probe and "
            "torchrun's start (address already in use): rerun; without --rdzv-port ddpctl picks a port free then")
