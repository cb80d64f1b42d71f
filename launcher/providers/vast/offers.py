"""Searching Vast.ai offers with sane defaults, pricing them for the disk we ask, and choosing nodes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from launcher.errors import DdpctlError
from launcher.providers.vast.client import VastClient
from launcher.providers.vast.models import Offer

# The search `type`: the spec's enum says "ondemand" but its own request example, vast-cli and every user
# send "on-demand", which the live service accepts; we send what is known to work.
OFFER_TYPE = "on-demand"


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
        "type": OFFER_TYPE,
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
    return query


def search_offers(client: VastClient, flt: OfferFilter) -> list[Offer]:
    """Offers matching `flt`, sorted by real hourly price for `flt.disk_gb` (cheapest first)."""
    offers = [Offer.from_json(o) for o in client.search_offers(build_query(flt))]
    if flt.max_price is not None:  # the server filtered on its dph_total; ours counts our disk
        offers = [o for o in offers if o.hourly_price(flt.disk_gb) <= flt.max_price]
    return sorted(offers, key=lambda o: (o.hourly_price(flt.disk_gb), o.id))


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
