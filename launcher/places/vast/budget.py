"""--max-cost before anything is rented: the worst case of a run's expected time at the chosen offers' prices,
and a sweep's one budget shared by its runs (each run gets what the earlier ones left). While a run goes, the
budget is watched by provider.CostWatch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import DdpctlError
from launcher.places.vast.billing import reserve_usd

if TYPE_CHECKING:
    from launcher.places.vast.models import Offer
    from launcher.spec.vast_request import VastRequest

DATA_GB = 1.0  # data moved each way per machine that --max-cost keeps back (code, data set, results)


def worst_case_usd(picked: list[Offer], req: VastRequest, hours: float) -> float:
    """Dollars `picked` cost over `hours` at their $/hour (disk included), plus the bandwidth kept back."""
    return sum(o.hourly_price(req.disk) for o in picked) * hours + reserve_usd(picked, DATA_GB)


def budget_line(picked: list[Offer], req: VastRequest) -> str:
    """What --dry-run says of the budget: the worst case of --expected-hours, and how it compares to --max-cost
    (or how long --max-cost lasts at these prices); '' when neither was given."""
    hourly = sum(o.hourly_price(req.disk) for o in picked)
    bandwidth = reserve_usd(picked, DATA_GB)
    if req.expected_hours is not None:
        worst = worst_case_usd(picked, req, req.expected_hours)
        line = f"worst case for --expected-hours {req.expected_hours:g}: ${worst:.4f}"
        if req.max_cost is not None:
            line += f" against --max-cost ${req.max_cost:g} ({'fits' if worst <= req.max_cost else 'does NOT fit'})"
        return line
    if req.max_cost is not None and hourly > 0:
        hours = max(0.0, req.max_cost - bandwidth) / hourly
        return f"--max-cost ${req.max_cost:g} pays for about {hours:.2f} hour(s) at ${hourly:.4f}/hour; the run is " \
               "stopped, pulled and destroyed before it passes"
    return ""


def check_fits(picked: list[Offer], req: VastRequest) -> None:
    """Refuse a run whose --expected-hours cannot be paid within --max-cost at these offers' prices (both given)."""
    if req.max_cost is None or req.expected_hours is None:
        return
    worst = worst_case_usd(picked, req, req.expected_hours)
    if worst > req.max_cost:
        hourly = sum(o.hourly_price(req.disk) for o in picked)
        raise DdpctlError(f"--max-cost ${req.max_cost:g} does not cover --expected-hours {req.expected_hours:g}: "
                          f"{len(picked)} machine(s) at ${hourly:.4f}/hour plus ~${reserve_usd(picked, DATA_GB):.4f} "
                          f"of bandwidth is ${worst:.4f}; raise --max-cost, lower --expected-hours, or leave "
                          "--expected-hours out to let --max-cost stop the run")


def spent_under(runs_dir: Path) -> float:
    """Dollars every rented run directly under `runs_dir` has cost so far (their run.json `cost_usd`)."""
    total = 0.0
    for path in sorted(runs_dir.glob("*/run.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("provider") == "vast":
            total += float(record.get("cost_usd") or 0.0)
    return total


def sweep_run_request(req: VastRequest, sweep_dir: Path) -> VastRequest:
    """The next run of a sweep gets what its earlier runs left of the sweep's --max-cost; none left: refused."""
    if req.max_cost is None:
        return req
    spent = spent_under(sweep_dir)
    left = req.max_cost - spent
    if left <= 0.0:
        raise DdpctlError(f"the sweep's --max-cost ${req.max_cost:g} is spent (${spent:.4f} by its runs so far); "
                          "nothing more is rented, and the runs so far keep their results")
    return replace(req, max_cost=left)
