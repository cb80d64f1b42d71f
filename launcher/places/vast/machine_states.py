"""What a rented run's machines are doing now, asked of the Vast.ai API (one list request, by the run's label),
and starting stopped ones again so that `pull` and `down` can reach them.

A machine stopped by autostop (autostop.py) keeps its disk and bills only storage; the ledger records each stop
(`stops`) so that the cost counts GPU time only while it ran. When the machine is started again its SSH address
may have changed: run.json's `hosts` are updated from the API (its host key must still match the one recorded).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.places.vast.ledger import Ledger, live
from launcher.places.vast.models import InstanceState, is_frozen, is_halted
from launcher.places.vast.start_failures import FAILED_STATES

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient

START_TIMEOUT_S = 900.0
# A started instance still shown exited (or unknown, offline) this long after the start, without having been
# seen loading, did not start: the first listings after a start may still show the state from before it.
FAILED_AFTER_START_S = 60.0


def refresh(client: VastClient, ledger: Ledger, clock: Callable[[], float] = time.time) -> dict[int, dict[str, Any]]:
    """Bring the ledger's live instances up to date with the API: stopped (or frozen: halted too, but its GPU
    bills, so no `stops` entry) or running again. Returns the listed instances by id (an instance not listed is
    left as recorded: only `down` verifies an instance gone)."""
    listed = {int(i["id"]): i for i in client.list_instances(label=ledger.run_dir.run_id)}
    now = clock()
    changed = False
    for inst in live(ledger.instances):
        obj = listed.get(int(inst["instance_id"]))
        if obj is None or inst["state"] not in ("rented", "stopped"):
            continue
        trouble = obj.get("actual_status") if obj.get("actual_status") in FAILED_STATES else None
        if inst.get("api_state") != trouble:  # exited, unknown or offline: SSH will not answer; told by status
            inst["api_state"], changed = trouble, True
        stops = inst.setdefault("stops", [])
        if is_halted(obj) and inst["state"] == "rented":
            inst["state"], changed = "stopped", True
            if is_frozen(obj):
                inst["frozen"] = True
                continue
            # first seen stopped now; the node's own watchdog knows the exact time (read after the restart)
            stops.append([now, None])
            if obj.get("storage_total_cost") is not None:
                inst["storage_dph"] = float(obj["storage_total_cost"])
        elif not is_halted(obj) and inst["state"] == "stopped":
            if stops and stops[-1][1] is None:
                stops[-1][1] = now
            inst.pop("frozen", None)
            inst["state"], changed = "rented", True
    if changed:
        ledger.run_dir.event("vast.states", states={str(i["instance_id"]): i["state"] for i in live(ledger.instances)})
        ledger.save()
    return listed


def start_stopped(client: VastClient, ledger: Ledger, *, timeout: float = START_TIMEOUT_S, poll: float = 2.0,
                  clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Start every stopped instance of the run and wait until each runs with an SSH address; run.json's hosts
    follow the addresses. Returns the ids started (empty when none was stopped)."""
    refresh(client, ledger, clock)
    stopped = [i for i in ledger.instances if i["state"] == "stopped"]
    if not stopped:
        return []
    for inst in stopped:
        client.manage_instance(int(inst["instance_id"]), "running")
    ledger.run_dir.event("vast.starting_stopped", instances=[i["instance_id"] for i in stopped])
    started_at = clock()
    deadline = started_at + timeout
    waiting = {int(i["instance_id"]): i for i in stopped}
    moving: set[int] = set()  # seen leaving its halted state: a failed state from then on is the start's outcome
    while waiting:
        listed = {int(i["id"]): i for i in client.list_instances(label=ledger.run_dir.run_id)}
        for iid, inst in list(waiting.items()):
            state = InstanceState.from_json(listed[iid]) if iid in listed else None
            if state is not None and state.actual_status in FAILED_STATES and not is_halted(listed[iid]) and (
                    iid in moving or clock() - started_at > FAILED_AFTER_START_S):
                ledger.run_dir.event("vast.start_failed", instance_id=iid, actual_status=state.actual_status,
                                     status_msg=state.status_msg)
                raise DdpctlError(f"Vast.ai instance {iid} came back {state.actual_status} after the start"
                                  f"{f' ({state.status_msg})' if state.status_msg else ''}: it will not run again; "
                                  "`ddpctl down RUN --force` destroys it (what was not pulled is lost)")
            if state is not None and state.actual_status not in FAILED_STATES and not is_halted(listed[iid]):
                moving.add(iid)
            if state is not None and state.running and state.ssh_address is not None:
                inst["ssh_host"], inst["ssh_port"] = state.ssh_address
                inst["state"] = "rented"
                inst.pop("frozen", None)
                if inst.get("stops") and inst["stops"][-1][1] is None:
                    inst["stops"][-1][1] = clock()
                del waiting[iid]
        if waiting and clock() > deadline:
            raise DdpctlError(f"Vast.ai instance(s) {sorted(waiting)} did not start again within {timeout:.0f}s; "
                              f"they bill storage while stopped: retry, or `ddpctl down RUN --force` destroys them")
        if waiting:
            sleep(poll)
    _follow_addresses(ledger)
    return [int(i["instance_id"]) for i in stopped]


def _follow_addresses(ledger: Ledger) -> None:
    """run.json `hosts` (what reattach connects to) take each node's address after the restart."""
    record = ledger.run_dir.record()
    hosts = list(record.get("hosts") or [])
    for inst in ledger.instances:
        node = inst.get("node")
        if inst["state"] == "rented" and isinstance(node, int) and node < len(hosts):
            old = hosts[node]
            hosts[node] = dict(old, hostname=inst["ssh_host"], port=int(inst["ssh_port"]))
            _carry_host_key(ledger, (old["hostname"], int(old["port"])), (inst["ssh_host"], int(inst["ssh_port"])))
    ledger.run_dir.update_record(hosts=hosts)
    ledger.save()


def _known_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _carry_host_key(ledger: Ledger, old: tuple[str, int], new: tuple[str, int]) -> None:
    """The same instance (the API says where it listens now) keeps the host key recorded for it at `up`."""
    if old == new:
        return
    path = ledger.run_dir.path / "known_hosts"
    if not path.is_file():
        return
    old_name, new_name = _known_name(*old), _known_name(*new)
    lines = path.read_text().splitlines()
    carried = [new_name + " " + line.split(None, 1)[1] for line in lines
               if line.split(None, 1)[0] == old_name and len(line.split()) >= 3]
    if carried:
        path.write_text("\n".join(lines + carried) + "\n")


def exact_stop_times(ledger: Ledger, watchdog_states: dict[int, str]) -> None:
    """Replace the first-seen stop times with the ones each node's watchdog wrote (`node -> state.json text`)."""
    for inst in ledger.instances:
        text = watchdog_states.get(inst.get("node", -1), "")
        try:
            stopped_at = float(json.loads(text).get("stopped_at")) if text.strip() else None
        except (ValueError, TypeError, AttributeError):
            stopped_at = None
        stops = inst.get("stops") or []
        if stopped_at is not None and stops and stopped_at <= stops[-1][0]:
            stops[-1][0] = stopped_at
    ledger.save()
