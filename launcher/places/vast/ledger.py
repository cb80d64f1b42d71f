"""The bill of a rented run: which instances it created (kept in run.json from the moment each exists), what
they cost, and destroying them (verified). `ddpctl down` of a rented run is release.py; what is still rented,
rented_list.py.

run.json `instances`: one object per instance the run ever created, in creation order: `instance_id`, `node`,
`dph` ($/hour, disk included), `created_at`, `state` (starting | failed | rented | destroyed | destroy_failed),
`destroyed_at`, plus RentedInstance.to_json() once it ran; `storage_dph` ($/hour of its disk alone), `stops`
([[stopped_at, started_at or null], ...]: while stopped only the storage bills), `frozen` (true while Vast shows
it frozen: halted like a stopped one, but its GPU bills on), `autostop_key` (which key its
autostop uses: "container", the instance's own CONTAINER_API_KEY, or "scoped") and `autostop_key_id` (the id of a
scoped stop-only API key, see autostop.py) when they apply. `cost_usd` at the top is the spend so far (final once
`released_at` is set).

run.json `create_intents`: one object per create request, written BEFORE the request is sent (a create whose answer
is lost may still have rented a machine): `offer_id`, `machine_id`, `node`, `label`, `sent_at`, `instance_id` once
known, and `state`: sent (no answer recorded yet), created, refused (the API said no: nothing rented), unresolved
(no answer, and not listed by its label within the grace), not_rented (looked up by label after the grace: nothing).
`sent` and `unresolved` ones may be billing: `status --rented` and `down` look them up by label (lost_creates.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.places.vast.billing import bandwidth_usd, cost_split
from launcher.places.vast.models import RentedInstance, TeardownResult
from launcher.results.progress import console
from launcher.results.record import RecordError
from launcher.results.rundir import RunDir, write_json_atomic

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient

LIVE_STATES = frozenset({"starting", "failed", "rented", "stopped", "destroy_failed"})  # may be billing
STATES = LIVE_STATES | {"destroyed"}
LEDGER_VERSION = 1
OPEN_INTENTS = frozenset({"sent", "unresolved"})  # a create that may have rented a machine nobody has seen yet


@dataclass
class InstanceRecord:
    """One instance in run.json's `instances` ledger; the fields RentedInstance.to_json() adds stay in `extra`."""

    instance_id: int
    state: str
    node: int | None = None
    dph: float | None = None
    created_at: float | None = None
    destroyed_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: str) -> InstanceRecord:
        """An instance from the ledger; RecordError naming `where` when it is not one."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: an entry of instances is not an object")
        iid = data.get("instance_id")
        if not isinstance(iid, int) or isinstance(iid, bool):
            raise RecordError(f"{where}: an instance's instance_id is {iid!r}, expected an integer")
        if data.get("state") not in STATES:
            raise RecordError(f"{where}: instance {iid} has state {data.get('state')!r}, expected one of "
                              f"{', '.join(sorted(STATES))}")
        for key in ("node", "dph", "created_at", "destroyed_at"):
            value = data.get(key)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
                raise RecordError(f"{where}: instance {iid}'s {key} is {value!r}, expected a number or null")
        typed = ("instance_id", "state", "node", "dph", "created_at", "destroyed_at")
        return cls(instance_id=iid, state=data["state"], node=data.get("node"), dph=data.get("dph"),
                   created_at=data.get("created_at"), destroyed_at=data.get("destroyed_at"),
                   extra={k: v for k, v in data.items() if k not in typed})

    def to_json(self) -> dict[str, Any]:
        """The instance as the ledger's JSON object."""
        return {**self.extra, "instance_id": self.instance_id, "state": self.state, "node": self.node,
                "dph": self.dph, "created_at": self.created_at, "destroyed_at": self.destroyed_at}


def read_ledger(run_dir: RunDir) -> list[dict[str, Any]]:
    """A run's instances from run.json, each checked as an InstanceRecord (the one place the ledger is read)."""
    where = str(run_dir.path / "run.json")
    instances = run_dir.record().get("instances") or []
    if not isinstance(instances, list):
        raise RecordError(f"{where}: instances is not a list")
    return [InstanceRecord.from_json(i, where).to_json() for i in instances]


def read_intents(run_dir: RunDir) -> list[dict[str, Any]]:
    """A run's create intents from run.json (see the module docstring); RecordError when they are malformed."""
    where = str(run_dir.path / "run.json")
    intents = run_dir.record().get("create_intents") or []
    if not isinstance(intents, list) or not all(isinstance(i, dict) and isinstance(i.get("state"), str)
                                                for i in intents):
        raise RecordError(f"{where}: create_intents is not a list of objects with a state")
    return intents


def open_intents(intents: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The creates that may have rented a machine not in the ledger."""
    return [i for i in intents if i.get("state") in OPEN_INTENTS]


def say(text: str, style: str | None = None) -> None:
    """One message on stderr, taken literally (ids and paths hold brackets) and never wrapped mid-command."""
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def stopped_seconds(inst: dict[str, Any], end: float) -> float:
    """Seconds the instance spent stopped before `end`."""
    return sum(max(0.0, min(end, stop[1] or end) - stop[0]) for stop in inst.get("stops") or [] if stop[0] < end)


def instance_cost(inst: dict[str, Any], now: float) -> float:
    """Dollars one recorded instance cost: its hourly price from creation to destruction (or to `now`), except
    while it was stopped, when only its storage bills."""
    end = inst.get("destroyed_at") or now
    total = max(0.0, end - float(inst.get("created_at") or end))
    stopped = min(total, stopped_seconds(inst, end))
    storage = float(inst.get("storage_dph") or 0.0)
    return (float(inst.get("dph") or 0.0) * (total - stopped) + storage * stopped) / 3600.0


def hourly(inst: dict[str, Any]) -> float:
    """What the instance bills per hour now: everything, or only its storage while stopped."""
    if inst.get("state") == "stopped" and not inst.get("frozen"):  # frozen: halted, but the GPU bills on
        return float(inst.get("storage_dph") or 0.0)
    return float(inst.get("dph") or 0.0)


def run_cost(instances: Iterable[dict[str, Any]], now: float | None = None) -> float:
    """Dollars spent by every instance a run created."""
    now = time.time() if now is None else now
    return sum(instance_cost(i, now) for i in instances)


def live(instances: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instances that may still be billing."""
    return [i for i in instances if i.get("state") in LIVE_STATES]


class Ledger:
    """A run's instances, written to run.json and events.jsonl as they are created, become ready, or go."""

    def __init__(self, run_dir: RunDir, clock: Callable[[], float] = time.time) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self.instances: list[dict[str, Any]] = read_ledger(run_dir)
        self.intents: list[dict[str, Any]] = read_intents(run_dir)

    def _find(self, instance_id: int) -> dict[str, Any]:
        """The record of an instance; made on the spot if its creation was not recorded (a Ctrl-C landed between
        the create and our write), so that what became of it is never lost."""
        found = next((i for i in self.instances if i["instance_id"] == instance_id), None)
        if found is None:
            found = {"instance_id": instance_id, "dph": None, "created_at": self.clock(), "state": "starting",
                     "destroyed_at": None}
            self.instances.append(found)
        return found

    def save(self) -> None:
        self.run_dir.update_record(instances=self.instances, create_intents=self.intents,
                                   cost_usd=round(self.cost(), 6),
                                   cost_split=cost_split(self.instances, self.run_dir.events(), self.clock()))

    def cost(self) -> float:
        return run_cost(self.instances, self.clock()) + bandwidth_usd(self.instances, self.run_dir.events())

    def hourly_rate(self) -> float:
        """$/hour of everything still rented (a stopped machine: its storage)."""
        return sum(hourly(i) for i in live(self.instances))

    def on_provision_event(self, event: dict[str, Any]) -> None:
        """provision()'s on_event: record each instance id the moment it exists, and what became of it."""
        now = self.clock()
        fields = {k: v for k, v in event.items() if k != "event"}
        self.run_dir.event(str(event["event"]), **fields)
        # provision destroys a failed instance before its next call; any event after the failure marks it gone
        for inst in self.instances:
            if inst["state"] == "failed":
                inst.update(state="destroyed", destroyed_at=now)
        kind, iid = event["event"], event.get("instance_id")
        self._note_intent(kind, event, now)
        if kind == "vast.instance_created":
            self.instances.append({"instance_id": iid, "node": event.get("node"), "offer_id": event.get("offer_id"),
                                   "machine_id": event.get("machine_id"), "dph": event.get("dph"),
                                   **({"bid": event["bid"]} if event.get("bid") is not None else {}),
                                   "inet_down_cost": event.get("inet_down_cost"),
                                   "inet_up_cost": event.get("inet_up_cost"),
                                   "storage_dph": event.get("storage_dph"),
                                   "created_at": now, "state": "starting", "destroyed_at": None})
        elif kind == "vast.instance_failed":
            self._find(int(str(iid))).update(state="failed")
        elif kind in ("vast.instance_destroyed", "vast.destroy_failed"):
            destroyed = kind == "vast.instance_destroyed"
            self._find(int(str(iid))).update(state="destroyed" if destroyed else "destroy_failed",
                                             destroyed_at=now if destroyed else None)
        self.save()

    def _note_intent(self, kind: str, event: dict[str, Any], now: float) -> None:
        """Keep create_intents up to date: `vast.create_sending` is saved before the request goes out."""
        if kind == "vast.create_sending":
            self.intents.append({"offer_id": event.get("offer_id"), "machine_id": event.get("machine_id"),
                                 "node": event.get("node"), "label": event.get("label"), "sent_at": now,
                                 "instance_id": None, "state": "sent"})
            return
        outcome = {"vast.instance_created": "created", "vast.offer_gone": "refused", "vast.create_refused": "refused",
                   "vast.create_unresolved": "unresolved"}.get(kind)
        intent = next((i for i in reversed(self.intents)
                       if i["state"] in OPEN_INTENTS and i.get("offer_id") == event.get("offer_id")), None)
        if outcome is not None and intent is not None:
            intent.update(state=outcome, instance_id=event.get("instance_id"))

    def adopt(self, listed: dict[str, Any], intent: dict[str, Any] | None) -> None:
        """An instance found by the run's label that the ledger lacked (its create's answer was lost): recorded
        from the listing, billed from when its create was sent, so that it is shown and destroyed like the rest."""
        iid = int(listed["id"])
        sent_at = float(intent["sent_at"]) if intent is not None else self.clock()
        self.instances.append({"instance_id": iid, "node": intent.get("node") if intent else None,
                               "offer_id": intent.get("offer_id") if intent else None,
                               "machine_id": listed.get("machine_id"), "dph": listed.get("dph_total"),
                               "storage_dph": listed.get("storage_total_cost"), "gpu_name": listed.get("gpu_name"),
                               "created_at": sent_at, "state": "starting", "destroyed_at": None,
                               "found_by_label": True})
        if intent is not None:
            intent.update(state="created", instance_id=iid)
        self.run_dir.event("vast.instance_found_by_label", instance_id=iid,
                           offer_id=intent.get("offer_id") if intent else None)

    def rented(self, rented: list[RentedInstance]) -> None:
        """Provisioning succeeded: every instance it created but did not return was destroyed by it."""
        ready = {r.instance_id: r for r in rented}
        for inst in self.instances:
            if inst["instance_id"] in ready:
                r = ready[inst["instance_id"]]
                inst.update(r.to_json(), state="rented", created_at=min(inst["created_at"], r.created_at))
            elif inst["state"] in ("starting", "failed"):
                inst.update(state="destroyed", destroyed_at=inst.get("destroyed_at") or self.clock())
        self.save()

    def set_overlay_ips(self, ips: dict[int, str]) -> None:
        for iid, ip in ips.items():
            self._find(iid)["overlay_ip"] = ip
        self.save()

    def record_teardown(self, results: list[TeardownResult], reason: str) -> None:
        for res in results:
            inst = self._find(res.instance_id)
            inst.update(state="destroyed" if res.destroyed else "destroy_failed", destroyed_at=res.destroyed_at)
            self.run_dir.event("vast.instance_destroyed" if res.destroyed else "vast.destroy_failed",
                               instance_id=res.instance_id, reason=reason, error=res.error)
        if not live(self.instances):
            self.run_dir.update_record(released_at=self.clock())
        self.save()


def destroy_all(client: VastClient, ledger: Ledger, reason: str) -> float:
    """Destroy every instance of the run that may still bill (each verified gone) and return the run's cost.

    A Ctrl-C during this is held back until it is done: stopping halfway would leave machines billing.
    Raises a one-line DdpctlError naming any instance that could not be verified destroyed."""
    from launcher.places.vast.teardown import teardown

    ids = [int(i["instance_id"]) for i in live(ledger.instances)]
    overlay = next((i.get("overlay_name") for i in ledger.instances if i.get("overlay_name")), None)
    ledger.run_dir.event("vast.teardown", reason=reason, instances=ids)
    interrupted = False
    while True:
        try:
            results = teardown(client, ids, overlay_name=overlay)
            break
        except KeyboardInterrupt:
            interrupted = True
    ledger.record_teardown(results, reason)
    _delete_autostop_keys(client, ledger)
    cost = ledger.cost()
    write_summary_cost(ledger.run_dir, cost)
    failed = [r for r in results if not r.destroyed]
    if failed:
        raise DdpctlError("could not verify that Vast.ai instance(s) " + ", ".join(str(r.instance_id) for r in failed)
                          + f" are destroyed ({failed[0].error}); they may still be billing: check "
                          "https://console.vast.ai and run `ddpctl down` again")
    if interrupted:
        raise KeyboardInterrupt
    return cost


def _delete_autostop_keys(client: VastClient, ledger: Ledger) -> None:
    """The destroyed instances' stop-only keys go too (each could only stop its own, now gone, instance)."""
    from launcher.places.vast.apikey import delete_keys

    gone = [i for i in ledger.instances if i.get("autostop_key_id") and i["state"] == "destroyed"]
    if not gone:
        return
    left = delete_keys(client, [int(i["autostop_key_id"]) for i in gone])
    for inst in gone:
        if inst["autostop_key_id"] not in left:
            inst.pop("autostop_key_id")
    ledger.run_dir.event("vast.autostop_keys_deleted", deleted=len(gone) - len(left), left=left)
    ledger.save()
    if left:
        say(f"could not delete the autostop API key(s) {left} (each can only stop an instance that is gone now); "
            "delete them at https://cloud.vast.ai/manage-keys/", style="yellow")


def write_summary_cost(run_dir: RunDir, cost: float) -> None:
    """Put the cost into summary.json, when the trainer wrote one (run.json always holds it)."""
    path = run_dir.path / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(summary, dict):
        summary["cost_usd"] = round(cost, 6)
        summary["cost_split"] = run_dir.record().get("cost_split")  # Ledger.save wrote it
        if run_dir.record().get("max_cost_reached"):  # stopped on --max-cost: the summary says so
            summary["max_cost_reached"] = run_dir.record()["max_cost_reached"]
        write_json_atomic(path, summary)
