"""Searching Vast.ai offers with sane defaults, pricing them for the disk we ask, and choosing nodes."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from launcher.errors import DdpctlError
from launcher.places.vast.client import VastClient
from launcher.places.vast.image_needs import MachineNeeds, runs_on_cap, supported_caps
from launcher.places.vast.models import Offer

# The search `type`: the spec's enum says "ondemand" but its own request example, vast-cli and every user
# send "on-demand", which the live service accepts; we send what is known to work.
OFFER_TYPE = "on-demand"
# Interruptible offers: the OpenAPI enum's "bid" ("uses minimum bid price"), as vast-cli's `--interruptible` sends.
BID_TYPE = "bid"


class OfferError(DdpctlError):
    """No offer (or no set of offers) fits what was asked."""


@dataclass(frozen=True)
class OfferFilter:
    """What an offer must have. Defaults: what a DDP run needs to start and be reached."""

    gpu_name: str | None = None
    num_gpus: int | None = None
    max_price: float | None = None  # $/hour, disk included
    min_reliability: float = 0.95
    disk_gb: float = 32.0
    min_inet_down_mbps: float = 100.0  # the image (GBs) and data sets come down this link
    min_cuda: float | None = None  # the CUDA version the image is built for
    min_direct_ports: int = 1  # direct SSH: the proxy is slower and less reliable
    limit: int = 64
    needs: MachineNeeds | None = None  # what the image and the run need of the machine (None: nothing)
    cluster_only: bool = False  # only offers in a physical cluster (multi-node: overlay networks live there)
    interruptible: bool = False  # search `type: "bid"`: offers priced at their min_bid

    def __post_init__(self) -> None:
        if self.num_gpus is not None and self.num_gpus < 1:
            raise OfferError(f"--gpus must be at least 1, not {self.num_gpus}")
        if self.max_price is not None and self.max_price <= 0:
            raise OfferError(f"--max-price must be a positive $/hour, not {self.max_price}")
        if not 0 <= self.min_reliability <= 1:
            raise OfferError(f"--min-reliability must be between 0 and 1, not {self.min_reliability}")
        if self.disk_gb < 8:
            raise OfferError(f"--disk must be at least 8 GB (Vast's minimum), not {self.disk_gb}")
        if not 1 <= self.limit <= 1000:
            raise OfferError(f"--limit must be between 1 and 1000, not {self.limit}")


def normalise_gpu_name(name: str) -> str:
    """Vast names GPUs with spaces ("RTX 3080"); users often type the CLI's underscores ("RTX_3080")."""
    return " ".join(name.replace("_", " ").split())


def build_query(flt: OfferFilter) -> dict[str, Any]:
    """The POST /api/v0/bundles/ body: the CLI's defaults (verified, rentable, not rented, not external)
    plus our filters, cheapest first, priced for `disk_gb` of storage."""
    query: dict[str, Any] = {
        "verified": {"eq": True},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "external": {"eq": False},
        "reliability": {"gte": flt.min_reliability},
        "direct_port_count": {"gte": flt.min_direct_ports},
        "inet_down": {"gte": flt.min_inet_down_mbps},
        "disk_space": {"gte": flt.disk_gb},
        "type": BID_TYPE if flt.interruptible else OFFER_TYPE,
        # the schema wants exactly two [field, direction] pairs (minItems = maxItems = 2 on `order`)
        "order": [["dph_total", "asc"], ["id", "asc"]],
        "limit": flt.limit,
        "allocated_storage": flt.disk_gb,
    }
    if flt.gpu_name:
        query["gpu_name"] = {"eq": normalise_gpu_name(flt.gpu_name)}
    if flt.num_gpus is not None:
        query["num_gpus"] = {"eq": flt.num_gpus}
    if flt.max_price is not None:
        query["dph_total"] = {"lte": flt.max_price}
    if flt.min_cuda is not None:
        query["cuda_max_good"] = {"gte": flt.min_cuda}
    needs = flt.needs
    if needs is not None:  # what Vast can filter; the client re-checks every offer (unmet_needs)
        if needs.min_cuda is not None:
            query["cuda_max_good"] = {"gte": max(needs.min_cuda, flt.min_cuda or 0)}
        if needs.arches is not None:  # Vast's compute_cap is x 100
            query["compute_cap"] = {"in": [cap * 10 for cap in supported_caps(needs.arches)]}
        if needs.min_gpu_ram_mb is not None:
            query["gpu_ram"] = {"gte": needs.min_gpu_ram_mb}
        if needs.min_contract_s is not None:
            query["duration"] = {"gte": needs.min_contract_s}
    if flt.cluster_only:  # as Vast's multi-node guide searches: cluster_id != None
        query["cluster_id"] = {"neq": None}
    return query


def unmet_needs(offer: Offer, flt: OfferFilter, now: float | None = None) -> list[str]:
    """Why `offer` cannot run the run (empty: it can): the checks the search asked Vast for, made again here
    (the server may ignore a filter, and `offers --explain` searches without them to say why)."""
    reasons: list[str] = []
    needs = flt.needs or MachineNeeds(None, None)
    min_cuda = max(needs.min_cuda or 0.0, flt.min_cuda or 0.0)
    if min_cuda and offer.cuda_max_good < min_cuda:
        reasons.append(f"driver supports CUDA {offer.cuda_max_good:g} < {min_cuda:g} the image needs")
    if needs.arches is not None and not runs_on_cap(offer.compute_cap // 10, needs.arches):
        cap = f"{offer.compute_cap / 100:g}" if offer.compute_cap else "not reported"
        reasons.append(f"compute capability {cap}: the image's torch has no kernels for it")
    if needs.min_gpu_ram_mb is not None and offer.gpu_ram_mb < needs.min_gpu_ram_mb:
        reasons.append(f"GPU RAM {offer.gpu_ram_mb:.0f} MB < {needs.min_gpu_ram_mb:.0f} MB the model needs")
    if needs.min_contract_s is not None:
        left = offer.contract_left_s(time.time() if now is None else now)
        if left is not None and left < needs.min_contract_s:
            reasons.append(f"contract ends in {left / 3600:.1f} h < {needs.min_contract_s / 3600:.1f} h needed")
    if flt.cluster_only and offer.cluster_id is None:
        reasons.append("not in a cluster (multi-node needs one overlay network)")
    if flt.max_price is not None and offer.hourly_price(flt.disk_gb) > flt.max_price:
        reasons.append(f"${offer.hourly_price(flt.disk_gb):.4f}/h with the disk > --max-price {flt.max_price:g}")
    return reasons


def search_offers(client: VastClient, flt: OfferFilter) -> list[Offer]:
    """Offers matching `flt` that can run the run, sorted by real hourly price for `flt.disk_gb` (cheapest
    first)."""
    offers = [Offer.from_json(o) for o in client.search_offers(build_query(flt))]
    offers = [o for o in offers if not unmet_needs(o, flt)]  # the server's dph_total does not count our disk
    return sorted(offers, key=lambda o: (o.hourly_price(flt.disk_gb), o.id))


def explain_offers(client: VastClient, flt: OfferFilter) -> list[tuple[Offer, list[str]]]:
    """The offers Vast has without the machine-needs filters, each with why it would be excluded (empty: not)."""
    loose = OfferFilter(gpu_name=flt.gpu_name, num_gpus=flt.num_gpus, min_reliability=flt.min_reliability,
                        disk_gb=flt.disk_gb, min_inet_down_mbps=flt.min_inet_down_mbps,
                        min_direct_ports=flt.min_direct_ports, limit=flt.limit)
    offers = [Offer.from_json(o) for o in client.search_offers(build_query(loose))]
    now = time.time()
    return sorted(((o, unmet_needs(o, flt, now)) for o in offers), key=lambda p: (p[0].hourly_price(flt.disk_gb),
                                                                                   p[0].id))


MAX_CLUSTER_PAGES = 8  # cluster offers are few and seldom cheap: look this many pages deep, no further


def search_cluster_offers(client: VastClient, flt: OfferFilter, nodes: int) -> list[Offer]:
    """Offers in clusters (cluster_id != None), page after page (cheapest first) until some cluster has `nodes`
    usable machines or the market runs out. The search has no offset: each next page asks for offers priced at
    least the last one seen, leaving out the ids already seen (keyset paging on the `order`)."""
    flt = OfferFilter(**{**flt.__dict__, "cluster_only": True})
    found: dict[int, Offer] = {}
    query = build_query(flt)
    for _page in range(MAX_CLUSTER_PAGES):
        page = [Offer.from_json(o) for o in client.search_offers(query)]
        fresh = [o for o in page if o.id not in found]
        found.update((o.id, o) for o in fresh)
        usable = [o for o in found.values() if not unmet_needs(o, flt)]
        if not fresh or len(page) < flt.limit or _has_cluster_of(usable, nodes):
            break
        floor = max(o.dph_total for o in page)
        query = {**query, "dph_total": {**query.get("dph_total", {}), "gte": floor},
                 "id": {"notin": sorted(found)}}
    offers = [o for o in found.values() if not unmet_needs(o, flt)]
    return sorted(offers, key=lambda o: (o.hourly_price(flt.disk_gb), o.id))


def _has_cluster_of(offers: list[Offer], nodes: int) -> bool:
    machines: dict[int, set[int]] = defaultdict(set)
    for o in offers:
        if o.cluster_id is not None:
            machines[o.cluster_id].add(o.machine_id)
    return any(len(m) >= nodes for m in machines.values())


def choose_offers(offers: list[Offer], nodes: int, disk_gb: float) -> list[Offer]:
    """The candidates provisioning tries, cheapest first.

    One node: every offer. Several: NCCL and gloo cannot cross the NATs between Vast machines, so only
    offers of one physical cluster (same `cluster_id`, joined by an overlay network) can work together;
    pick the cluster whose `nodes` cheapest distinct machines cost least, and return all its offers.
    """
    if nodes < 1:
        raise OfferError(f"--nodes must be at least 1, not {nodes}")
    if nodes == 1:
        if not offers:
            raise OfferError("no Vast.ai offer matches; relax --gpu-name/--max-price/--min-reliability")
        return list(offers)
    by_cluster: dict[int, list[Offer]] = defaultdict(list)
    for offer in offers:
        if offer.cluster_id is not None:
            by_cluster[offer.cluster_id].append(offer)
    best: tuple[float, int] | None = None
    for cluster_id, members in by_cluster.items():
        cheapest_per_machine: dict[int, float] = {}
        for o in members:
            price = o.hourly_price(disk_gb)
            cheapest_per_machine[o.machine_id] = min(price, cheapest_per_machine.get(o.machine_id, price))
        if len(cheapest_per_machine) < nodes:
            continue
        cost = sum(sorted(cheapest_per_machine.values())[:nodes])
        if best is None or cost < best[0]:
            best = (cost, cluster_id)
    if best is None:
        raise OfferError(
            f"multi-node needs {nodes} machines in one Vast.ai cluster (offers sharing a cluster_id), and "
            "none of the matching offers has that: NCCL/gloo cannot cross the NATs between Vast machines "
            "without a cluster's overlay network; use --nodes 1 or relax the filters"
        )
    return sorted(by_cluster[best[1]], key=lambda o: (o.hourly_price(disk_gb), o.id))
