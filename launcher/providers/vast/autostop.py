"""Autostop for detached Vast.ai runs: once training has ended and nothing has pulled for --autostop minutes, the
machines stop (not destroyed: the results stay on their disks, and only storage bills) until `ddpctl pull` or
`ddpctl down` starts them again.

Who may stop what. Vast.ai's API has scoped API keys (POST /api/v0/auth/apikeys/, permissions as
{"api": {CATEGORY: {ENDPOINT: {"constraints": {PARAM: {eq|lte|gte: VALUE}}}}}}, docs: api-reference/permissions).
Every node runs its own small watchdog holding its own key, created for this run and limited to one request:
manage instance (instance_write) with `id` eq its own instance and `state` eq "stopped". That key can stop its
own machine and nothing else: not start, destroy, rent, read, or touch another instance. It is kept 0600 in the
node's workspace and deleted from the account at `down` (with the machines). Vast also puts an instance key of
its own into every container (CONTAINER_API_KEY); its scope is not documented, so it is not used.

One watchdog per node rather than one on node 0 holding keys for all: a node then holds no power over another,
and every node's own exit_code (written when its torchrun ends) says when its part of training is over.
The endpoint's permission name "api.instance.manage" follows the documented pattern ("api.instance.request_logs"
for request logs). The permission's shape is not trusted: each key is read back and proven before it goes to a node
(scoped_key.py), and the shape that passed is recorded.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, HostError
from launcher.providers.vast.apikey import delete_keys
from launcher.providers.vast.scoped_key import SHAPES, make_stop_key
from launcher.transport.parallel import raise_for_errors, run_on_hosts

if TYPE_CHECKING:
    from launcher.providers.vast.client import VastClient
    from launcher.providers.vast.ledger import Ledger
    from launcher.results.rundir import RunDir
    from launcher.transport.hostsession import HostSession

DEFAULT_MINUTES = 30.0
STATE_DIR = ".autostop"  # inside the node's workspace: key (0600), pulled (touched by `ddpctl pull`), state.json

# Runs on the node with its own python (stdlib only). Forks away from the SSH session and then checks every
# `poll` seconds; the key is read from its file only when it is used, and never printed.
WATCHDOG = r"""
import json, os, sys, time, urllib.error, urllib.request
ws, url, iid = sys.argv[1], sys.argv[2].rstrip("/"), int(sys.argv[3])
idle, poll = float(sys.argv[4]), float(sys.argv[5])
d = os.path.join(ws, ".autostop")
state = os.path.join(d, "state.json")
def write(**kw):
    tmp = state + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(kw, pid=os.getpid()), f)
    os.replace(tmp, state)
sys.stdout.flush()
if os.fork():
    print("watching"); sys.exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
write(state="watching", since=time.time())
while True:
    time.sleep(poll)
    code = os.path.join(ws, "exit_code")
    if not os.path.exists(code):
        continue
    marks = [os.path.getmtime(p) for p in (code, os.path.join(d, "pulled")) if os.path.exists(p)]
    if time.time() - max(marks) < idle:
        continue
    with open(os.path.join(d, "key")) as f:
        key = f.read().strip()
    req = urllib.request.Request("%s/api/v0/instances/%d/" % (url, iid), data=b'{"state": "stopped"}',
                                 method="PUT", headers={"Authorization": "Bearer " + key,
                                                        "Content-Type": "application/json"})
    for attempt in range(12):
        try:
            urllib.request.urlopen(req, timeout=30).read()
            write(state="stopped", stopped_at=time.time())
            sys.exit(0)
        except urllib.error.HTTPError as e:
            if e.code not in (429, 500, 502, 503, 504):
                write(state="failed", error="HTTP %d" % e.code)
                sys.exit(1)
        except OSError:
            pass
        time.sleep(min(60.0, 2.0 ** attempt))
    write(state="failed", error="no answer from the API")
"""


def arm_autostop(client: VastClient, session: HostSession, ledger: Ledger, minutes: float | None) -> None:
    """`up --detach`'s autostop (`minutes` None: the default; 0: none), said on stderr either way."""
    from launcher.providers.vast.ledger import say

    minutes = DEFAULT_MINUTES if minutes is None else minutes
    if minutes <= 0:
        say("autostop is off (--autostop 0): the machines bill in full until `ddpctl down`", style="yellow")
        return
    try:
        start_autostop(client, session, ledger, minutes)
    except DdpctlError as exc:
        ledger.run_dir.event("vast.autostop_failed", error=str(exc))
        say(f"autostop is off: {exc}; the machines bill in full until `ddpctl down`", style="bold yellow")
        return
    say(f"autostop: each machine stops {minutes:g} min after its training ended and nothing pulled; then only "
        "its storage bills until `ddpctl pull` or `ddpctl down` starts it again")


def start_autostop(client: VastClient, session: HostSession, ledger: Ledger, minutes: float) -> None:
    """Create each node's stop-only key, put it on the node (0600) and start the node's watchdog. A failure
    deletes the keys made so far and raises: the run goes on, without autostop, and the caller says so."""
    run_dir = ledger.run_dir
    nodes = run_dir.record().get("nodes") or []
    by_node = {int(i["node"]): i for i in ledger.instances if i.get("state") == "rented" and i.get("node") is not None}
    made: list[int] = []
    shapes: list[str] = []  # the permission shape each node's key was proven with
    try:
        for index, node in enumerate(nodes):
            inst = by_node[index]
            # the shape proven on the first node is tried first on the others (each key is proven all the same)
            order = [*shapes[:1], *(s for s in SHAPES if s not in shapes[:1])]
            stop_key = make_stop_key(client, f"ddpctl-autostop-{run_dir.run_id}-{inst['instance_id']}"[:255],
                                     inst["instance_id"], order, on_rejected=_rejected_event(run_dir, index))
            made.append(stop_key.key_id)
            shapes.append(stop_key.shape)
            # the id only: the key itself goes to the node and nowhere else
            inst["autostop_key_id"], inst["autostop_key_shape"] = stop_key.key_id, stop_key.shape
            ledger.save()
            _install(session, index, node["workspace"], stop_key.key)
        run_dir.update_record(autostop={"minutes": minutes, "api_url": client.base_url, "key_shapes": shapes})
        start_watchdogs(session, run_dir, list(range(len(nodes))))
    except (DdpctlError, KeyError) as exc:
        delete_keys(client, made)
        for inst in ledger.instances:
            inst.pop("autostop_key_id", None)
            inst.pop("autostop_key_shape", None)
        ledger.save()
        run_dir.update_record(autostop=None)
        raise DdpctlError(str(exc).splitlines()[0]) from None
    run_dir.event("vast.autostop_armed", minutes=minutes, keys=made, key_shapes=shapes)


def _rejected_event(run_dir: RunDir, index: int) -> Callable[[str, str, Any], None]:
    """Record a key that failed its proof: the shape, why, and what the account stored (so a first real use tells)."""
    def record(shape: str, why: str, stored: Any) -> None:
        run_dir.event("vast.autostop_key_rejected", node=index, shape=shape, error=why, stored_permissions=stored)
    return record


def start_watchdogs(session: HostSession, run_dir: RunDir, indexes: list[int]) -> None:
    """Start the watchdog on these nodes (its key is already there), as run.json's `autostop` says."""
    record = run_dir.record()
    nodes, settings = record.get("nodes") or [], record["autostop"]
    by_node = {int(i["node"]): i for i in record.get("instances") or [] if i.get("node") is not None
               and i.get("state") in ("rented", "stopped")}
    minutes, python = float(settings["minutes"]), run_dir.spec().python
    poll = max(0.5, min(30.0, minutes * 60 / 6))

    def start(index: int) -> None:
        ws, iid = nodes[index]["workspace"], by_node[index]["instance_id"]
        argv = [python, "-c", WATCHDOG, ws, settings["api_url"], str(iid), f"{minutes * 60:g}", f"{poll:g}"]
        out = session.conn(index).run(argv, timeout=30)
        if out.exit_code != 0 or "watching" not in out.stdout:
            raise HostError(session.label_of(index), f"the autostop watchdog did not start: "
                                                     f"{(out.stderr or out.stdout).strip()[-200:]}")

    raise_for_errors(run_on_hosts(indexes, start, timeout=60, label=session.label_of), "autostop")


def _install(session: HostSession, index: int, workspace: str, key: str) -> None:
    """Write the key to the node's workspace, readable by its owner only from the moment it exists; it goes
    through the command's stdin, never its command line."""
    folder = f"{workspace}/{STATE_DIR}"
    script = f"umask 077 && mkdir -p {shlex.quote(folder)} && cat > {shlex.quote(folder + '/key')}"
    out = session.conn(index).run(["sh", "-c", script], stdin=key.encode(), timeout=30)
    if out.exit_code != 0:
        raise HostError(session.label_of(index), f"cannot write the autostop key: {out.stderr.strip()[-200:]}")


def mark_pulled_command(workspace: str) -> list[str]:
    """The command `ddpctl pull` runs on a node so that its watchdog counts the idle time from now."""
    folder = f"{workspace}/{STATE_DIR}"
    return ["sh", "-c", f"if [ -d {shlex.quote(folder)} ]; then touch {shlex.quote(folder + '/pulled')}; fi"]


def stopped_at_command(workspace: str) -> list[str]:
    """The command that prints the node's watchdog state (JSON), empty when it has none."""
    return ["sh", "-c", f"cat {shlex.quote(workspace + '/' + STATE_DIR + '/state.json')} 2>/dev/null || true"]
