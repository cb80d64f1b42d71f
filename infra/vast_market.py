"""The market side of the Vast.ai stand-in (infra/vast_standin.py calls these from its search, create and overlay
handlers): what real offers and overlays do that the contract alone does not say. Each behaviour is a switch a
test turns on through `VastStandIn.market`. Not shipped.

- Offers carry their host's CUDA (cuda_max_good), compute capability (compute_cap, x 100), GPU RAM, contract end
  and bandwidth prices: `make_offer(..., cuda_max_good=11.8, compute_cap=610, inet_down_cost=0.02)`.
- `ignored_filters`: search fields the server does not filter on (the client must re-check what it asked for).
- `cluster_market()`: cluster offers few, not the cheapest, and past the first page of a cluster search.
- Instances created with `-n NAME` in their docker options join overlay NAME (Vast's documented order: the
  overlay first, then the instances into it); one for a network that does not exist fails to start.
- `null_subnet_reads`: GET /overlay/ answers internal_subnet null this many times after the overlay has members.
- `without_ip(host, shim_dir)`: the host's SSH sessions find an `ip` that is not there (command not found), like
  Vast's and PyTorch's images, which have no iproute2.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.vast_standin import Instance, VastStandIn


@dataclass
class Market:
    """Switches for the market behaviours (see the module docstring)."""

    ignored_filters: set[str] = field(default_factory=set)
    null_subnet_reads: int = 0
    overlay_reads: dict[str, int] = field(default_factory=dict)  # overlay name -> GET /overlay/ answered so far
    searches: list[dict[str, Any]] = field(default_factory=list)  # every search body, in order
    order: list[str] = field(default_factory=list)  # "overlay NAME" / "instance ID": creations in order


def search_filters(market: Market, query: dict[str, Any]) -> dict[str, Any]:
    """The filters the server applies to a search (those the market ignores left out); records the search."""
    market.searches.append(query)
    return {k: v for k, v in query.items() if isinstance(v, dict) and k not in market.ignored_filters}


def network_of(request: dict[str, Any]) -> str | None:
    """The docker network `-n NAME` / `--network NAME` an instance's create request asks for, if any."""
    env = request.get("env") or ""
    # vast-cli's object form ({"-n NAME": "1", ...}) or the OpenAPI file's string form
    words = [w for key in env for w in shlex.split(key)] if isinstance(env, dict) else shlex.split(str(env))
    for flag, value in zip(words, words[1:], strict=False):
        if flag in ("-n", "--network", "--net"):
            return value
    return None


def on_created(standin: VastStandIn, inst: Instance) -> str | None:
    """An instance was created: join the overlay its request names. Returns why it cannot start, or None."""
    standin.market.order.append(f"instance {inst.id}")
    name = network_of(inst.request)
    if name is None:
        return None
    overlay = standin.overlays.get(name)
    if overlay is None:
        return f"Error response from daemon: network {name} not found"
    if inst.offer.get("cluster_id") != overlay["cluster_id"]:
        return f"Error response from daemon: network {name} is not available on this machine"
    if overlay["internal_subnet"] is None:
        overlay["internal_subnet"] = ".".join(inst.address[0].split(".")[:3]) + ".0/24"
    overlay["instances"].append(inst.id)
    return None


def on_overlay_created(standin: VastStandIn, name: str) -> None:
    """An overlay was created (recorded, to check it came before the instances)."""
    standin.market.order.append(f"overlay {name}")


def listed_overlays(standin: VastStandIn) -> list[dict[str, Any]]:
    """GET /overlay/'s answer: internal_subnet null for the first `null_subnet_reads` reads of each overlay."""
    market, shown = standin.market, []
    for overlay in standin.overlays.values():
        reads = market.overlay_reads.get(overlay["name"], 0)
        market.overlay_reads[overlay["name"]] = reads + 1
        hidden = reads < market.null_subnet_reads
        shown.append(dict(overlay, instances=list(overlay["instances"]),
                          internal_subnet=None if hidden else overlay["internal_subnet"]))
    return shown


def cluster_market(*, cheap: int = 70, lone: int = 70, cluster_id: int = 9) -> list[dict[str, Any]]:
    """Offers where multi-node has one chance: `cheap` offers outside any cluster (the cheapest), `lone` cluster
    offers each the only machine of its cluster (next cheapest, more than a 64-offer page), then cluster
    `cluster_id`'s two machines, the dearest: found only on a later page of a cluster search."""
    from infra.vast_standin import make_offer

    offers = [make_offer(100 + k, 1100 + k, dph_base=0.05 + k / 10000) for k in range(cheap)]
    offers += [make_offer(300 + k, 1300 + k, dph_base=0.10 + k / 10000, cluster_id=500 + k) for k in range(lone)]
    offers += [make_offer(901, 1901, dph_base=0.30, cluster_id=cluster_id),
               make_offer(902, 1902, dph_base=0.31, cluster_id=cluster_id)]
    return offers


IP_SHIM = "#!/bin/sh\necho \"sh: 1: ip: not found\" >&2\nexit 127\n"


def without_ip(host: Any, shim_dir: Path) -> Any:
    """Make `ip` absent from `host`'s SSH sessions: a shim that answers "not found" (exit 127) comes first on
    their PATH. Returns the host (for use in a host factory)."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(shim_dir, 0o755)
    shim = shim_dir / "ip"
    if not shim.exists():
        shim.write_text(IP_SHIM)
        os.chmod(shim, 0o755)
    env = host.ssh_environment()
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    if not re.match(re.escape(str(shim_dir)) + r"(:|$)", path):
        host.update_ssh_environment({"PATH": f"{shim_dir}:{path}"})
    return host
