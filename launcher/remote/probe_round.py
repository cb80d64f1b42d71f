"""Runs on each host of a run (standard library only; sent as source, launcher/planning/preflight.py): the whole
probe of a host in one round trip. It learns what the host is (launcher/remote/host_probe.py), runs the checks
the launcher asks for (a runtime's engine check, the MPI check: each a quoted argv, its output given back), and
then, as the launcher asks:

- on node 0 (`listen`): chooses the rendezvous port, reserves it for the run (or, in a dry run, only reads the
  reservations: nothing is written) and listens on it (launcher/remote/rdzv_port.py); the answer comes back and
  the program goes on detached, accepting the other nodes' connections for a few seconds, then ends;
- on the other nodes (`connect`): connects to node 0's port, first, while node 0 listens; or, with `connect`
  "later" (the program started with node 0's, launcher/planning/host_round.py), after its own findings, once the
  launcher has sent node 0's address and port (a JSON line on standard input; null: nothing to connect to);
- on every node of a run that ships code (`manifest`): lists the host's code cache as shipping compares it
  (launcher/remote/tree_sync.py), so that a relaunch whose code is there already makes no round trip for it.

The request is one JSON argument (no secrets: addresses, ports, a run id, check commands); the answer is one
JSON line. Its `clock` is the host's wall clock when the program started and when it answered: with the
launcher's own clock around the round trip, the host's clock offset (launcher/planning/clock_offset.py). The
program never fails on what it finds: the launcher judges the answer."""

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import time

from launcher.remote import daemon, host_probe, rdzv_port, tree_sync

CHECK_TIMEOUT = 60.0  # seconds one check may take (a Docker engine that hangs is reported, not waited for)
# Seconds the code cache's listing may take within the probe (a cache of large files): past them the probe answers
# without it, and shipping lists the cache in a round trip of its own, under its own longer limit.
LIST_SECONDS = 20.0


def run_check(argv: "list[str]", timeout: float = CHECK_TIMEOUT) -> "dict":
    """Run one check's argv (no shell unless the argv is one): its exit code and output."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"code": 124, "stdout": "", "stderr": f"{argv[0]} did not answer within {timeout:g} s"}
    except OSError as e:
        return {"code": 127, "stdout": "", "stderr": f"{argv[0]}: {e.strerror or e}"}
    return {"code": done.returncode, "stdout": done.stdout.decode(errors="replace"),
            "stderr": done.stderr.decode(errors="replace")}


def is_public(addr: str) -> bool:
    """Whether `addr` is a global (public) IP address; a name is judged by the launcher from the nodes' own."""
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(addr).is_global
    return False


def listen_address(listen: "dict", facts: "dict") -> str:
    """The address node 0 listens on: the one given (--rdzv-addr, a provider's), else with `own` the host's own
    (host_probe.own_address), else the name it was reached by."""
    own = host_probe.own_address(facts.get("ssh_server_addr"), facts.get("addrs") or []) if listen.get("own") else None
    return str(listen.get("addr") or own or listen.get("hostname") or "")


def listing(root: str, seconds: float = LIST_SECONDS) -> "dict":
    """tree_sync's manifest of `root` (relative to the home folder), or {"error": why} where it cannot be made
    within `seconds`."""
    try:
        return tree_sync.manifest(os.path.join(os.path.expanduser("~"), root), time.monotonic() + seconds)
    except SystemExit as refused:  # ROOT is not a folder: shipping lists it again and says so
        return {"error": str(refused)}
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def connect_to(node0: "dict") -> str:
    """Connect to node 0's port as the launcher says ({addr, port, timeout}): rdzv_port.connect's outcome."""
    return rdzv_port.connect(str(node0["addr"]), int(node0["port"]), float(node0["timeout"]))


def connect_as_told(line: bytes) -> "str | None":
    """connect_to what `line` says (null, or no line: node 0 did not listen, nothing to connect to)."""
    try:
        told = json.loads(line) if line.strip() else None
    except ValueError:
        told = None
    return connect_to(told) if isinstance(told, dict) else None


def answered(answer: "dict") -> str:
    """The answer's JSON line, its clock stamped with the time it leaves."""
    answer["clock"] = [*answer["clock"][:1], time.time()]
    return json.dumps(answer)


def main(argv: "list[str]") -> int:
    """argv: one JSON object, {"checks": [ARGV...], "connect": {addr, port, timeout} or "later", "listen": {addr, own,
    hostname, port, expect, seconds, any_free, allow_public, run_id, dir, ttl, workspace}, "manifest": ROOT}
    (each optional). Prints {"clock", "facts", "checks", "connect", "listen", "addr", "manifest"}: `listen` is
    `listening PORT`, `public ADDR` (a public address is never listened on unless allowed) or rdzv_port's one-line
    refusal; `manifest` is listing(ROOT)."""
    answer: dict = {"clock": [time.time()]}
    request = json.loads(argv[0]) if argv else {}
    connect = request.get("connect")
    if isinstance(connect, dict):  # first: node 0 listens for a few seconds only
        answer["connect"] = connect_to(connect)
    answer["facts"] = facts = host_probe.host_facts()
    answer["checks"] = [run_check([str(word) for word in check]) for check in request.get("checks") or []]
    if request.get("manifest"):
        answer["manifest"] = listing(str(request["manifest"]))
    if connect == "later":
        answer["connect"] = connect_as_told(sys.stdin.buffer.readline())
    listen = request.get("listen")
    if not listen:
        print(answered(answer))
        return 0
    answer["addr"] = addr = listen_address(listen, facts)
    if is_public(addr) and not listen.get("allow_public"):
        answer["listen"] = f"public {addr}"
        print(answered(answer))
        return 0
    run_id = str(listen.get("run_id") or "")
    if run_id and os.getppid() == 1:  # orphaned: the launcher that asked left (interrupted); reserve nothing
        answer["listen"] = "bind-failed: the launcher that asked for the port is gone"
        print(answered(answer))
        return 0
    try:
        sock = rdzv_port.reserve(addr, int(listen["port"]), any_free=bool(listen.get("any_free")),
                                 run_id=run_id, path=str(listen["dir"]),
                                 ttl=float(listen["ttl"]), workspace=str(listen.get("workspace") or ""))
    except rdzv_port.Refusal as refusal:
        answer["listen"] = str(refusal)
        print(answered(answer))
        return 0
    answer["listen"] = f"listening {sock.getsockname()[1]}"
    daemon.detach(answered(answer))  # the SSH channel closes; this goes on in the background
    rdzv_port.accept(sock, int(listen["expect"]), float(listen["seconds"]))
    return 0
