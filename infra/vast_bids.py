"""Interruptible (bid) instances in the Vast.ai stand-in, as Vast's docs describe them: offers carry `min_bid`; a
search with `type: "bid"` prices offers at it ("uses minimum bid price"); a create with `price` below the
machine's current min_bid is refused (400 `invalid_price`, the documented error), else it rents an interruptible
instance (`is_bid`, billed at its bid). A test outbids a machine with `outbid(standin, machine_id, price)`: every
bid instance there under that price is stopped by the market (its processes end and its SSH port closes, as a
stopped container's does): `actual_status` and `cur_state` "stopped" while `intended_status` stays "running", and
it bills only its storage. Called by infra/vast_standin.py. Not shipped."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.vast_standin import Instance, VastStandIn

MIN_BID_SHARE = 0.4  # an offer's min_bid when a test gives none: this share of its on-demand dph_base


@dataclass
class Bids:
    """The market's side of bidding: the price others pay per machine, and the instances it stopped."""

    market: dict[int, float] = field(default_factory=dict)  # machine id -> the competing bid that holds it now
    outbid_at: dict[int, float] = field(default_factory=dict)  # instance id -> when the market stopped it (unix)


def min_bid(bids: Bids, offer: dict[str, Any]) -> float:
    """The lowest bid the machine takes now: its own min_bid, or a competitor's higher bid."""
    own = offer.get("min_bid")
    base = float(own) if own is not None else round(float(offer["dph_base"]) * MIN_BID_SHARE, 4)
    return max(base, bids.market.get(int(offer["machine_id"]), 0.0))


def priced(bids: Bids, offer: dict[str, Any], query: dict[str, Any]) -> dict[str, Any]:
    """The offer as a search shows it: min_bid filled in, and for `type: bid` priced at it."""
    offer = dict(offer, min_bid=min_bid(bids, offer))
    if query.get("type") == "bid":
        offer["dph_total"] = offer["min_bid"] + offer["storage_total_cost"]
        offer["is_bid"] = True
    return offer


def refused(bids: Bids, offer: dict[str, Any], request: dict[str, Any]) -> tuple[int, Any] | None:
    """The create's refusal when its bid is under the machine's min_bid; None: it may rent."""
    price = request.get("price")
    if price is None:
        return None
    lowest = min_bid(bids, offer)
    if float(price) < lowest:
        return 400, {"success": False, "error": "invalid_price",
                     "msg": f"bid price {price} is below the minimum bid {lowest:.4f} for this machine"}
    return None


def dress(bids: Bids, inst: Instance, obj: dict[str, Any]) -> None:
    """A bid instance as show instance gives it; an outbid one stopped by the market."""
    price = inst.request.get("price")
    if price is None or inst.destroyed_at is not None:
        return
    storage = float(obj.get("storage_total_cost") or 0.0)
    obj.update(is_bid=True, min_bid=min_bid(bids, inst.offer), dph_base=float(price), dph_total=float(price) + storage)
    if inst.id in bids.outbid_at:
        obj.update(actual_status="stopped", cur_state="stopped", intended_status="running", next_state="running",
                   status_msg="", ports={}, dph_total=storage)


def outbid(standin: VastStandIn, machine_id: int, price: float) -> list[int]:
    """Another renter bids `price` on the machine: every bid instance there under it is stopped; their ids."""
    stopped = []
    with standin._lock:
        standin.bids.market[machine_id] = price
        for inst in standin.instances.values():
            bid = inst.request.get("price")
            if (inst.offer["machine_id"] == machine_id and bid is not None and float(bid) < price
                    and inst.destroyed_at is None and inst.id not in standin.bids.outbid_at):
                standin.bids.outbid_at[inst.id] = time.time()
                stop_host(inst.host)
                stopped.append(inst.id)
    return stopped


def stop_host(host: Any) -> None:
    """The container stops: a test-bed host's processes end and its sshd goes (connections are refused)."""
    if host is None:
        return
    if hasattr(host, "stop_sshd"):
        from infra.testbed import _remove_reservations
        from infra.testbed_host import kill_and_wait, user_pids

        kill_and_wait(user_pids(host.user))
        host.stop_sshd()
        # the bed's hosts share one /tmp; a stopped machine's own /tmp (its rendezvous reservation) is no other's
        _remove_reservations({host.user})
    elif hasattr(host, "close"):
        host.close()
