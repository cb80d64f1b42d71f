"""`ddpctl offers` and `ddpctl vast login`: thin commands over the Vast.ai client."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer
from rich.table import Table
from rich.text import Text

from launcher.places.vast.apikey import save_api_key, vast_client
from launcher.places.vast.errors import ApiKeyMissing
from launcher.results.table_output import table_console

if TYPE_CHECKING:
    from launcher.places.vast.models import Offer

vast_app = typer.Typer(help="Vast.ai account commands.", no_args_is_help=True)


def offers(
    gpu_name: str | None = typer.Option(None, "--gpu-name", help='GPU model, e.g. "RTX 3080" (or RTX_3080).'),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs per machine."),
    max_price: float | None = typer.Option(None, "--max-price", help="Most $/hour per machine, disk included."),
    min_reliability: float = typer.Option(0.95, "--min-reliability", help="Least reliability score, 0..1."),
    disk: float = typer.Option(32.0, "--disk", help="Disk to rent per machine, GB (priced in)."),
    min_cuda: float | None = typer.Option(None, "--min-cuda", help="Least CUDA version the driver supports."),
    limit: int = typer.Option(20, "--limit", help="Offers to show."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    explain: bool = typer.Option(False, "--explain", help="Also list the offers ddpctl would not rent, and why."),
    model: str | None = typer.Option(None, "--model", help="The model to train (sets the GPU RAM needed)."),
    expected_hours: float | None = typer.Option(None, "--expected-hours",
                                                help="How long the run takes (the contract must outlast it)."),
    image: str | None = typer.Option(None, "--image", help="Filter for this image's needs (CUDA floor, compute "
                                     "capabilities), read from the local engine or its registry; default ddpctl's."),
    registry_login: bool = typer.Option(False, "--registry-login", help="Read a private --image with the "
                                        "credentials of `docker login` (or DDPCTL_REGISTRY_LOGIN=USER:TOKEN)."),
) -> None:
    """List the Vast.ai offers that can run ddpctl's image, cheapest first (hourly price includes the disk asked
    for; bandwidth is billed per GB on top, at each host's price)."""
    # Imported here: requests costs a tenth of a second at every `ddpctl` start otherwise.
    from launcher.places.vast.image_needs import MachineNeeds
    from launcher.places.vast.offers import OfferError, OfferFilter, explain_offers, search_offers

    if limit < 1:
        raise OfferError(f"--limit must be at least 1, got {limit}")
    needs = MachineNeeds.for_run(model, expected_hours)
    if image is not None:
        from launcher.places.vast.image_labels import image_needs_for

        image_needs = image_needs_for(image, registry_login)
        typer.echo(image_needs.note, err=True)  # stderr: --json's stdout stays JSON
        needs = image_needs.applied_to(needs)
    elif explain:
        from launcher.places.vast.image_labels import constants_note

        typer.echo(f"image needs of {constants_note()}; --image REF reads another image's", err=True)
    flt = OfferFilter(gpu_name=gpu_name, num_gpus=gpus, max_price=max_price, min_reliability=min_reliability,
                      disk_gb=disk, min_cuda=min_cuda, limit=max(limit, 64), needs=needs)
    with vast_client() as client:  # paced together with every other ddpctl process using the key
        if explain:
            explained = explain_offers(client, flt)[:limit]
        else:
            explained = [(o, []) for o in search_offers(client, flt)[:limit]]
    found = [o for o, _ in explained]
    if as_json:
        typer.echo(json.dumps([{**_offer_json(o, disk), **({"excluded": why} if explain else {})}
                               for o, why in explained], indent=2))
        return
    console = table_console()  # the whole table into a pipe, not 80 columns of it
    if not found:
        console.print("no offers match; relax --gpu-name/--max-price/--min-reliability")
        return
    table = Table(title=f"Vast.ai offers ($/hour with {disk:g} GB disk)")
    columns = ["offer", "machine", "GPU", "GPUs", "$/hour", "$/GB up/down", "reliability", "down Mb/s", "CUDA",
               "sm", "cluster", "where"] + (["excluded because"] if explain else [])
    for col in columns:
        table.add_column(col, justify="right" if col in {"GPUs", "$/hour", "reliability", "down Mb/s"} else "left")
    for o, why in explained:
        # Text, not str: names and places come from the offers, and '[...]' in them is not rich markup.
        row: list[str | Text] = [
            str(o.id), str(o.machine_id), Text(str(o.gpu_name)), str(o.num_gpus), f"{o.hourly_price(disk):.4f}",
            f"{o.inet_up_cost:g}/{o.inet_down_cost:g}", f"{o.reliability:.3f}", f"{o.inet_down:.0f}",
            f"{o.cuda_max_good:g}", f"{o.compute_cap / 100:g}" if o.compute_cap else "?",
            str(o.cluster_id) if o.cluster_id is not None else "-", Text(str(o.geolocation or "?"))]
        if explain:
            row.append(Text("; ".join(why) or "-"))
        table.add_row(*row)
    console.print(table)


def _offer_json(o: Offer, disk: float) -> dict[str, object]:
    return {"id": o.id, "machine_id": o.machine_id, "gpu_name": o.gpu_name, "num_gpus": o.num_gpus,
            "hourly_price": round(o.hourly_price(disk), 6), "dph_total": o.dph_total, "disk_gb": disk,
            "reliability": o.reliability, "inet_down": o.inet_down, "cuda_max_good": o.cuda_max_good,
            "cluster_id": o.cluster_id, "geolocation": o.geolocation, "compute_cap": o.compute_cap,
            "inet_up_cost": o.inet_up_cost, "inet_down_cost": o.inet_down_cost}


@vast_app.command("login")
def login(
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Check the key with Vast.ai first."),
) -> None:
    """Store your Vast.ai API key (read from a hidden prompt, or from stdin when piped) with mode 0600."""
    tty = sys.stdin.isatty()
    key = (typer.prompt("Vast.ai API key", hide_input=True, default="", show_default=False) if tty
           else sys.stdin.readline()).strip()
    if not key or any(c.isspace() for c in key):  # refused here: never sent as an empty Bearer token
        raise ApiKeyMissing("the Vast.ai API key is empty or contains whitespace: paste the key from "
                            "https://cloud.vast.ai/manage-keys/ (input: `ddpctl vast login`, or pipe it to stdin)")
    if verify:
        from launcher.places.vast.client import VastClient

        with VastClient(key, shared_pacing=True) as client:
            client.list_instances()
    path = save_api_key(key)
    typer.echo(f"saved the Vast.ai API key to {path} (mode 0600)")


def register(app: typer.Typer) -> None:
    """Add `offers` and the `vast` command group to the ddpctl app."""
    app.command("offers")(offers)
    app.add_typer(vast_app, name="vast")
