"""The probe's one round trip to a host: launcher/remote/probe_round.py, sent as source with the modules it uses,
learns what the host is, runs the checks a runtime (or the MPI launcher) asks for, and on node 0 reserves and
listens on the rendezvous port, on the other nodes connects to it. `run_probe` sends one request and reads the
answer; launcher/planning/probe.py decides what to ask each host and when."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.errors import HostError
from launcher.planning.clock_offset import ClockOffset
from launcher.planning.facts import HostFacts
from launcher.remote import daemon, host_probe, probe_round, rdzv_port, tree_sync
from launcher.remote.program import ahead_of_input, on_stdin, program
from launcher.transport.connection import HostConnection
from launcher.transport.parallel import HostOutcome, run_on_hosts

# What the hosts run: PROBE_PROGRAM, the modules' own text (no second copy), sent on standard input
# (program.on_stdin), with the request as its argument.
PROBE_PROGRAM = program(probe_round, daemon, host_probe, rdzv_port, tree_sync, end_with_client=True)
PROBE_TIMEOUT = 90.0  # seconds: nvidia-smi, a Docker engine's answer, node 0's reservation lock (30 s at most)


@dataclass(frozen=True)
class CheckResult:
    """What one check run on a host gave: its exit code and output."""

    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class ProbeAnswer:
    """One host's answer: its facts, each check's result (in the order asked), what came of `connect`
    (`ok` or `failed: WHY`) and `listen` (`listening PORT` or why not) with the address listened on, and the
    `manifest` asked for (launcher/remote/tree_sync.py's JSON data, read by launcher/transport/sync.py); the host's
    `clock` offset, measured by this round trip (None: the answer had no clock stamps)."""

    facts: HostFacts
    checks: tuple[CheckResult, ...] = ()
    connect: str | None = None
    listen: str | None = None
    addr: str | None = None
    manifest: Any = None
    clock: ClockOffset | None = None


def run_probe(conn: HostConnection, python: str, label: str, *, checks: Sequence[Sequence[str]] = (),
              connect: dict[str, Any] | Callable[[], dict[str, Any] | None] | None = None,
              listen: dict[str, Any] | None = None, manifest: str | None = None,
              timeout: float = PROBE_TIMEOUT) -> ProbeAnswer:
    """Probe one host in one round trip (with `manifest`, a folder to list as shipping does: the code cache); a
    missing python or an unparsable answer is that host's HostError. `connect` as a function: the host starts at
    once, and what to connect to (its result, called while the host finds what it is) is sent when it is known."""
    later = connect if callable(connect) else None
    request = {"checks": [list(c) for c in checks], "connect": "later" if later else connect, "listen": listen,
               "manifest": manifest}
    if later is None:
        loader, text = on_stdin(PROBE_PROGRAM)
        stdin: bytes | Iterable[bytes] = text
    else:
        loader, first = ahead_of_input(PROBE_PROGRAM)
        stdin = (part() for part in (lambda: first, lambda: json.dumps(later()).encode() + b"\n"))
    sent = time.time()  # wall clock, as the host stamps its own: the two are compared
    result = conn.run([python, *loader, json.dumps(request)], timeout=timeout, stdin=stdin)
    received = time.time()
    if result.exit_code != 0:
        raise HostError(label, f"{python} failed ({(result.stderr or result.stdout).strip()[-200:]}); "
                        "install python3 there or pass --python PATH")
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
        found = tuple(CheckResult(int(c["code"]), str(c["stdout"]), str(c["stderr"])) for c in data["checks"])
        return ProbeAnswer(HostFacts.from_probe(label, data["facts"]), found, _text(data.get("connect")),
                           _text(data.get("listen")), _text(data.get("addr")), data.get("manifest"),
                           _clock(data.get("clock"), sent, received))
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise HostError(label, f"unexpected preflight answer: {result.stdout[:200]!r}") from e


def _clock(stamps: Any, sent: float, received: float) -> ClockOffset | None:
    """The host's clock offset from its two stamps, or None where the answer has none (two numbers)."""
    if not isinstance(stamps, list) or len(stamps) != 2 or not all(isinstance(s, (int, float)) for s in stamps):
        return None
    return ClockOffset.measured(sent, float(stamps[0]), float(stamps[1]), received)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def probe_all(conns: Sequence[HostConnection], labels: Sequence[str], python: str, *,
              checks: Callable[[int], Sequence[Sequence[str]]] = lambda index: (),
              listen: dict[str, Any] | None = None, connect_timeout: float = 10.0,
              manifest: str | None = None, timeout: float = PROBE_TIMEOUT) -> list[HostOutcome[int, ProbeAnswer]]:
    """Every host probed in one round trip, host k asked `checks(k)` (and with `manifest`, to list that folder):
    all at once. With `listen` (node 0's rendezvous request, launcher/planning/rdzv_reservation.py's
    listen_request) and several hosts, node 0 reserves its port and listens while the others find what they are;
    each of them is then sent node 0's port and connects to it (within `connect_timeout` seconds), or is told that
    node 0 does not listen. An outcome per host, in host order: its answer or its error."""

    def ask(index: int, connect: Callable[[], dict[str, Any] | None] | None = None,
            listen: dict[str, Any] | None = None) -> ProbeAnswer:
        return run_probe(conns[index], python, labels[index], checks=checks(index), connect=connect, listen=listen,
                         manifest=manifest, timeout=timeout)

    indexes = list(range(len(conns)))
    if listen is None or len(conns) < 2:
        return run_on_hosts(indexes, ask, timeout=timeout + 5, label=lambda i: labels[i])
    node0: list[ProbeAnswer] = []
    answered = threading.Event()

    def ask_node0(index: int) -> ProbeAnswer:
        try:
            node0.append(ask(index, listen=listen))
            return node0[0]
        finally:
            answered.set()

    def node0_port() -> dict[str, Any] | None:
        answered.wait(timeout)
        words = (node0[0].listen or "").split() if node0 else []
        if len(words) == 2 and words[0] == "listening" and words[1].isdigit():
            return {"addr": node0[0].addr, "port": int(words[1]), "timeout": connect_timeout}
        return None

    # All at once: the other nodes find what they are while node 0 reserves its port, then connect to it.
    return run_on_hosts(indexes, lambda i: ask_node0(i) if i == 0 else ask(i, connect=node0_port),
                        timeout=timeout + 5, label=lambda i: labels[i])
