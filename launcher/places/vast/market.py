"""Finding the machines `up --provider vast` rents: offers that can run the image (image_needs), a cluster's
machines searched explicitly for multi-node, and the price with bandwidth and the --max-cost check on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.places.vast.billing import IMAGE_PULL_GB, reserve_usd
from launcher.places.vast.budget import DATA_GB, budget_line, check_fits
from launcher.places.vast.image_needs import MachineNeeds
from launcher.places.vast.offers import OfferError, OfferFilter, choose_offers, search_cluster_offers, search_offers

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient
    from launcher.places.vast.image_labels import ImageNeeds
    from launcher.places.vast.models import Offer, RentedInstance
    from launcher.spec.run_spec import RunSpec
    from launcher.spec.vast_request import VastRequest

def find_offers(client: VastClient, spec: RunSpec, req: VastRequest, num_gpus: int | None,
                image_needs: ImageNeeds | None = None) -> list[Offer]:
    """The candidates provisioning tries, cheapest first: only machines that can run the image (`image_needs`,
    read from it; None: ddpctl's constants) and the run; for several nodes, the cheapest cluster with enough of
    them (searched page after page)."""
    needs = MachineNeeds.for_run(spec.model, req.expected_hours)
    flt = OfferFilter(gpu_name=req.gpu_name, num_gpus=num_gpus, max_price=req.max_price,
                      min_reliability=req.min_reliability, disk_gb=req.disk, interruptible=req.interruptible,
                      needs=image_needs.applied_to(needs) if image_needs else needs)
    try:
        found = search_cluster_offers(client, flt, req.nodes) if req.nodes > 1 else search_offers(client, flt)
        offers = choose_offers(found, req.nodes, req.disk)
    except OfferError as exc:
        raise OfferError(f"{exc}; {image_needs.summary}") if image_needs else exc from None
    if req.max_cost is not None:
        picked = first_machines(offers, req.nodes)
        reserve = reserve_usd(picked, DATA_GB)
        if reserve >= req.max_cost:
            raise OfferError(f"--max-cost ${req.max_cost:g} does not cover the bandwidth alone: pulling the image "
                             f"(~{IMAGE_PULL_GB:g} GB) and moving {DATA_GB:g} GB of data on {len(picked)} machine(s) "
                             f"costs about ${reserve:.4f} at their hosts' $/GB; raise --max-cost")
        if not req.interruptible:  # priced at min_bid here: checked at the bid (interruptible_provider.py)
            check_fits(picked, req)
    return offers


def first_machines(offers: list[Offer], nodes: int) -> list[Offer]:
    """The offers provisioning rents first: the cheapest on `nodes` distinct machines."""
    picked: list[Offer] = []
    for offer in offers:
        if offer.machine_id not in {o.machine_id for o in picked} and len(picked) < nodes:
            picked.append(offer)
    return picked


def pull_reserve_usd(rented: list[RentedInstance]) -> float:
    """Bandwidth --max-cost keeps back while the run goes: pulling DATA_GB of results off every machine."""
    return sum(DATA_GB * r.offer.inet_up_cost for r in rented)


def offer_note(offer: Offer) -> str:
    """', bandwidth $x/GB in, $y/GB out' when the host charges for it ('' when free)."""
    if not (offer.inet_down_cost or offer.inet_up_cost):
        return ""
    return f", bandwidth ${offer.inet_down_cost:g}/GB in, ${offer.inet_up_cost:g}/GB out"


def chosen_summary(picked: list[Offer], req: VastRequest) -> str:
    """One line for --dry-run: the cluster (multi-node), the hourly price and the bandwidth to expect."""
    hourly = sum(o.hourly_price(req.disk) for o in picked)
    where = f" in cluster {picked[0].cluster_id}" if req.nodes > 1 and picked else ""
    budget = budget_line(picked, req)
    return (f"would rent {len(picked)} machine(s){where}: ${hourly:.4f}/hour with {req.disk:g} GB disk each, plus "
            f"about ${reserve_usd(picked, DATA_GB):.4f} of bandwidth (image pull ~{IMAGE_PULL_GB:g} GB and "
            f"{DATA_GB:g} GB of data each way per machine)" + (f"; {budget}" if budget else ""))
