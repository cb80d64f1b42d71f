"""Interruptible (bid) machines on Vast.ai: what to bid, whether a rented machine was outbid or lost, and what one
interruption cost, measured from the ledger.

Vast's market (docs.vast.ai, "Instance types"; the OpenAPI's search `type: bid` and create `price`): an
interruptible instance runs while its bid is the highest for its machine; a higher bid stops it. The stopped
instance keeps `intended_status` "running" while its `actual_status` (and `cur_state`) leave it ("stopped"), its
processes are gone, and it bills only its storage; it starts again by itself only if the market price falls back
under its bid. Raising the bid through the API would get the same machine back at a price the user did not agree
to, so ddpctl does not: it destroys the stopped machine and rents another
(launcher/places/vast/interruptible_chain.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.errors import RunStopRequested
from launcher.places.vast.errors import VastError
from launcher.places.vast.ledger import say
from launcher.places.vast.models import InstanceState, Offer
from launcher.places.vast.offers import OfferError
from launcher.results.interruptions import interruption_line

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient
    from launcher.places.vast.ledger import Ledger

# Without --bid: each offer's min_bid (measured by the search just before renting) plus this share. A bid at the
# minimum is outbid by the first competitor; a quarter more rides out small moves of the market and still costs
# well under on-demand.
BID_MARGIN = 0.25
# How often a followed run asks the API for its machines' states (one list request): a loss is seen this soon.
CHECK_EVERY_S = 3.0
# The reason a run is stopped with when one of its machines is lost (RunStopRequested.reason).
NODE_LOST = "node-lost"
# A run replaced this many times in a row is given up: the market, not one machine, is the problem.
MAX_INTERRUPTIONS = 5
# States of an instance that was running and is no longer usable (Vast's docs: outbid -> stopped; a machine
# whose host dropped off -> offline; exited; unknown: no heartbeat).
LOST_STATES = frozenset({"stopped", "exited", "offline", "unknown", "frozen"})


def bid_for(offer: Offer, bid: float | None) -> float:
    """The $/hour to bid on `offer`: --bid, else its min_bid + BID_MARGIN (rounded up to $0.0001)."""
    if bid is not None:
        return bid
    if offer.min_bid is None:
        raise OfferError(f"offer {offer.id} has no min_bid: it cannot be rented interruptible; give --bid")
    return max(0.001, math.ceil(round(offer.min_bid * (1 + BID_MARGIN) * 10000, 6)) / 10000)


def biddable(offers: list[Offer], bid: float | None) -> list[Offer]:
    """The offers a bid can rent: those with a min_bid, and with --bid, a min_bid at or under it."""
    with_bid = [o for o in offers if o.min_bid is not None]
    usable = [o for o in with_bid if bid is None or (o.min_bid or 0.0) <= bid]
    if not usable:
        lowest = min((o.min_bid or 0.0 for o in with_bid), default=None)
        raise OfferError("no interruptible offer fits" + (f": the lowest min_bid is ${lowest:.4f}/hour, above --bid "
                                                          f"${bid:g}; raise --bid" if lowest is not None else
                                                          " (no offer reports a min_bid); rent on demand"))
    return usable


def bid_line(picked: Iterable[Offer], bid: float | None) -> str:
    """What is bid on the offers about to be rented, with each min_bid as the search just measured it."""
    parts = [f"${bid_for(o, bid):.4f}/hour on offer {o.id} (its min_bid ${o.min_bid or 0.0:.4f}/hour)" for o in picked]
    why = "--bid" if bid is not None else f"min_bid +{BID_MARGIN:.0%}"
    return f"interruptible: bidding {'; '.join(parts)} ({why}); an outbid machine is replaced and the run resumed"


def lost_reason(obj: dict[str, Any] | None) -> str | None:
    """Why a rented instance can no longer train (None: it still runs), from its API object."""
    if obj is None:
        return "gone from Vast.ai's instance list"
    state = InstanceState.from_json(obj)
    if state.actual_status not in LOST_STATES:
        return None
    told = (f"actual_status {state.actual_status}, intended_status {state.intended_status}, "
            f"cur_state {obj.get('cur_state')}")
    if state.actual_status == "stopped" and state.intended_status == "running":
        return f"stopped by the market (outbid: {told})"
    return told


def lost_nodes(client: VastClient, label: str, by_node: dict[int, int]) -> dict[int, dict[str, Any]]:
    """The nodes (node -> instance) whose machine can no longer train, each with why and the states the API
    showed; one list request (an instance missing from it is asked once by id: lists may lag)."""
    listed = {int(i["id"]): i for i in client.list_instances(label=label)}
    lost: dict[int, dict[str, Any]] = {}
    for node, iid in by_node.items():
        obj = listed.get(iid) if iid in listed else client.show_instance(iid)
        why = lost_reason(obj)
        if why is not None:
            lost[node] = {"instance_id": iid, "reason": why, "machine_id": (obj or {}).get("machine_id"),
                          "actual_status": (obj or {}).get("actual_status"),
                          "intended_status": (obj or {}).get("intended_status"),
                          "cur_state": (obj or {}).get("cur_state")}
    return lost


@dataclass
class LossWatch:
    """Called on every poll of a followed interruptible run (as its `watch`): the cost text, the newest outputs
    pulled as they are written (`follow`), and every CHECK_EVERY_S a look at the machines' states; a lost one
    stops the run with RunStopRequested(reason NODE_LOST), `lost` and `detected_at` saying what and when."""

    cost: Callable[[], str]
    check: Callable[[], dict[int, dict[str, Any]]]
    follow: Callable[[], None]
    clock: Callable[[], float] = time.time
    last_check: float = 0.0
    lost: dict[int, dict[str, Any]] | None = None
    detected_at: float | None = None

    def __call__(self) -> str:
        text = self.cost()
        self.follow()
        now = self.clock()
        if now - self.last_check >= CHECK_EVERY_S:
            self.last_check = now
            try:
                lost = self.check()
            except VastError:  # the API is busy or away for a moment: the machines are asked again next time
                lost = {}
            if lost:
                self.lost, self.detected_at = lost, now
                said = "; ".join(f"node {n} (vast:{v['instance_id']}): {v['reason']}" for n, v in sorted(lost.items()))
                raise RunStopRequested(f"lost {said}", NODE_LOST, tuple(sorted(lost)))
        return f"{text} interruptible"


def mark_stopped(ledger: Ledger, lost: dict[int, dict[str, Any]], at: float) -> None:
    """The lost instances bill only storage from `at` (the ledger's stops), until they are destroyed."""
    for item in lost.values():
        inst = next((i for i in ledger.instances if i["instance_id"] == item["instance_id"]), None)
        if inst is not None and inst.get("state") == "rented" and item.get("actual_status") == "stopped":
            inst.setdefault("stops", []).append([at, None])
            inst["state"] = "stopped"
    ledger.save()


def spent_between(instances: Iterable[dict[str, Any]], start: float, end: float) -> float:
    """Dollars the recorded instances billed between `start` and `end` (stopped spans at their storage price)."""
    total = 0.0
    for inst in instances:
        created, destroyed = inst.get("created_at"), inst.get("destroyed_at")
        begin = max(start, float(created) if created is not None else end)
        finish = min(end, float(destroyed) if destroyed is not None else end)
        if finish <= begin:
            continue
        stopped = sum(max(0.0, min(finish, s[1] or finish) - max(begin, s[0])) for s in inst.get("stops") or [])
        stopped = min(stopped, finish - begin)
        total += (float(inst.get("dph") or 0.0) * (finish - begin - stopped)
                  + float(inst.get("storage_dph") or 0.0) * stopped) / 3600.0
    return total


def interruption_cost(instances: list[dict[str, Any]], snapshot_at: float | None, lost_at: float,
                      training_at: float) -> dict[str, float]:
    """What one interruption cost: the spend on the work redone (every machine, from the snapshot resumed from to
    the loss) and on the gap (everything billing from the loss until training again)."""
    redone = spent_between(instances, snapshot_at, lost_at) if snapshot_at is not None else 0.0
    gap = spent_between(instances, lost_at, training_at)
    redone, gap = round(redone, 6), round(gap, 6)  # the total is the sum of the parts as written, to the last digit
    return {"redone_usd": redone, "gap_usd": gap, "cost_usd": round(redone + gap, 6)}


def tell_interruption(entry: dict[str, Any]) -> None:
    say(interruption_line(entry), style="yellow")
