"""Autostop for detached Vast.ai runs: once training has ended and nothing has pulled for --autostop minutes, the
machines stop (not destroyed: the results stay on their disks, and only storage bills) until `ddpctl pull` or
`ddpctl down` starts them again.

Which key stops a machine. Every node runs its own small watchdog, and it stops its machine with, in this order:

1. the instance's own key, CONTAINER_API_KEY. Vast creates it with the instance (the create answer's
   `instance_api_key`) and injects it into the container; "it can only start, stop, or destroy that specific
   instance" (Vast's docs, "Hello World", https://docs.vast.ai/api-reference/hello-world). The watchdog reads it on
   the node when it stops the machine: from its own environment, else from the environment of the container's
   process 1 (Vast's SSH sessions do not see the container's variables). Nothing is created, sent or deleted, and
   the key never leaves the node. Used whenever the node has it (asked before arming, without printing it).
2. only when a node has no CONTAINER_API_KEY: a scoped account key made for that node (POST /api/v0/auth/apikeys/,
   permissions as {"api": {CATEGORY: {ENDPOINT: {"constraints": {PARAM: {eq|lte|gte: VALUE}}}}}}, docs:
   api-reference/permissions), limited to manage instance with `id` eq its own instance and `state` eq "stopped".
   The permission name "api.instance.manage" and the `state` constraint are not in Vast's docs, so each key is
   read back and proven before it goes to the node (scoped_key.py). Kept 0600 in the node's workspace and
   deleted from the account at `down` (with the machines).

Which one each node uses, and why, is in run.json (`autostop.keys`), the `vast.autostop_armed` event, the ledger
(`autostop_key`) and `ddpctl status` (the autostop column).

One watchdog per node rather than one on node 0 holding keys for all: a node then holds no power over another,
and every node's own exit_code (written when its torchrun ends) says when its part of training is over.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, HostError
from launcher.places.vast.apikey import delete_keys
from launcher.places.vast.scoped_key import SHAPES, make_stop_key
from launcher.remote import autostop_watchdog, daemon, source_of
from launcher.transport.parallel import raise_for_errors, run_on_hosts

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient
    from launcher.places.vast.ledger import Ledger
    from launcher.results.rundir import RunDir
    from launcher.transport.hostsession import HostSession

DEFAULT_MINUTES = 30.0
STATE_DIR = ".autostop"  # inside the node's workspace: key (0600), pulled (touched by `ddpctl pull`), state.json
CONTAINER_ENVIRON = "/proc/1/environ"  # the container's first process: where Vast's CONTAINER_API_KEY lives
CONTAINER, SCOPED = "container", "scoped"  # which key a node's watchdog stops its machine with

# The node's side (launcher/remote/autostop_watchdog.py), run by its own python: `where` says where its
# CONTAINER_API_KEY is ("environment", "process 1") or "absent", never the key; `watch` (after launcher/remote/
# daemon.py, which it detaches with) forks away from the SSH session and then checks every `poll` seconds; the key
# ("container": CONTAINER_API_KEY, from the environment or from the container's environ file; "scoped": the key
# file) is read only when it is used, and never printed.
CONTAINER_KEY_PROBE = source_of(autostop_watchdog)
WATCHDOG = source_of(daemon) + source_of(autostop_watchdog)


def arm_autostop(client: VastClient, session: HostSession, ledger: Ledger, minutes: float | None) -> None:
    """`up --detach`'s autostop (`minutes` None: the default; 0: none), said on stderr either way."""
    from launcher.places.vast.ledger import say

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
    keys = (ledger.run_dir.record().get("autostop") or {}).get("keys") or []
    scoped = [k["node"] for k in keys if k.get("key") == SCOPED]
    how = ("with its instance's own CONTAINER_API_KEY" if not scoped else
           f"with a stop-only account key made for node(s) {scoped} (no CONTAINER_API_KEY there)"
           + (", the others with their own CONTAINER_API_KEY" if len(scoped) < len(keys) else ""))
    say(f"autostop: each machine stops {minutes:g} min after its training ended and nothing pulled ({how}); then "
        "only its storage bills until `ddpctl pull` or `ddpctl down` starts it again")


def start_autostop(client: VastClient, session: HostSession, ledger: Ledger, minutes: float) -> None:
    """Arm every node's watchdog with the instance's own CONTAINER_API_KEY where the node has it, else with a
    stop-only scoped key made for it (put on the node, 0600), and start the watchdogs. A failure deletes the keys
    made so far and raises: the run goes on, without autostop, and the caller says so."""
    run_dir = ledger.run_dir
    nodes = run_dir.record().get("nodes") or []
    by_node = {int(i["node"]): i for i in ledger.instances if i.get("state") == "rented" and i.get("node") is not None}
    made: list[int] = []
    shapes: list[str] = []  # the permission shape each scoped key was proven with
    keys: list[dict[str, Any]] = []  # per node: which key stops its machine, and why
    try:
        found = container_keys(session, len(nodes), python=run_dir.spec().python)
        for index, node in enumerate(nodes):
            inst = by_node[index]
            if found.get(index):
                inst["autostop_key"] = CONTAINER
                keys.append({"node": index, "key": CONTAINER,
                             "why": f"the instance has CONTAINER_API_KEY ({found[index]}): Vast's own key, which "
                                    "can only start, stop or destroy this instance; nothing was created"})
                ledger.save()
                continue
            # the shape proven on the first node is tried first on the others (each key is proven all the same)
            order = [*shapes[:1], *(s for s in SHAPES if s not in shapes[:1])]
            stop_key = make_stop_key(client, f"ddpctl-autostop-{run_dir.run_id}-{inst['instance_id']}"[:255],
                                     inst["instance_id"], order, on_rejected=_rejected_event(run_dir, index))
            made.append(stop_key.key_id)
            shapes.append(stop_key.shape)
            # the id only: the key itself goes to the node and nowhere else
            inst["autostop_key_id"], inst["autostop_key_shape"] = stop_key.key_id, stop_key.shape
            inst["autostop_key"] = SCOPED
            keys.append({"node": index, "key": SCOPED, "key_id": stop_key.key_id,
                         "why": "the instance has no CONTAINER_API_KEY (neither in its SSH session nor in its first "
                                "process's environment): a stop-only account key was made for it, proven, and is "
                                "deleted at `down`"})
            ledger.save()
            _install(session, index, node["workspace"], stop_key.key)
        run_dir.update_record(autostop={"minutes": minutes, "api_url": client.base_url, "key_shapes": shapes,
                                        "keys": keys})
        start_watchdogs(session, run_dir, list(range(len(nodes))))
    except (DdpctlError, KeyError) as exc:
        delete_keys(client, made)
        for inst in ledger.instances:
            for field in ("autostop_key_id", "autostop_key_shape", "autostop_key"):
                inst.pop(field, None)
        ledger.save()
        run_dir.update_record(autostop=None)
        raise DdpctlError(str(exc).splitlines()[0]) from None
    run_dir.event("vast.autostop_armed", minutes=minutes, keys=made, key_shapes=shapes, key_sources=keys)


def container_keys(session: HostSession, count: int, python: str) -> dict[int, str | None]:
    """Where each node's CONTAINER_API_KEY is ("environment" or "process 1"), None where it has none (or could not
    be asked: that node falls back to a scoped key). The key itself is never printed nor read here."""
    def ask(index: int) -> str | None:
        out = session.conn(index).run([python, "-c", CONTAINER_KEY_PROBE, "where", CONTAINER_ENVIRON], timeout=30)
        where = out.stdout.strip().splitlines()[-1:] if out.exit_code == 0 else []
        return where[0] if where and where[0] in ("environment", "process 1") else None

    found: dict[int, str | None] = {}
    for index in range(count):
        try:
            found[index] = ask(index)
        except DdpctlError:
            found[index] = None
    return found


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
        ws, inst = nodes[index]["workspace"], by_node[index]
        source = inst.get("autostop_key") or SCOPED  # runs armed before the container key: scoped keys
        argv = [python, "-c", WATCHDOG, "watch", ws, settings["api_url"], str(inst["instance_id"]), f"{minutes * 60:g}",
                f"{poll:g}", source, CONTAINER_ENVIRON]
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
