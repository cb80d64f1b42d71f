"""The one table of places: `--provider NAME` and run.json's `provider` -> its `Place`. Adding a place is its module
(or folder) and one line in PLACES; nothing outside the places compares a provider's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from launcher.errors import SpecError
from launcher.places.local import LocalPlace
from launcher.places.slurm import SlurmPlace
from launcher.places.ssh import SshPlace
from launcher.places.vast import VastPlace

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.places.base import Place
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.results.record import RunRecord
    from launcher.spec.run_spec import RunSpec

# The places meet here only: what one place must know of another's options is lent by this table.
_SLURM = SlurmPlace(rented_options=VastPlace.own_options)
PLACES: dict[str, Place] = {place.name: place for place in (LocalPlace(slurm_unused=_SLURM.unused_options), SshPlace(),
                                                              VastPlace(), _SLURM)}


def place_named(name: str) -> Place:
    """The place `--provider NAME` names; SpecError listing the places for any other name."""
    if name not in PLACES:
        names = list(PLACES)
        raise SpecError(f"--provider {name!r}: choose {', '.join(names[:-1])} or {names[-1]}")
    return PLACES[name]


def chosen_name(provider: str, hosts: tuple[object, ...]) -> str:
    """The place --provider names; without it, SSH hosts when --host is given, else this machine."""
    return provider or ("ssh" if hosts else "local")


def place_of(options: UpOptions) -> Place:
    """Where `up` runs with these options."""
    return place_named(chosen_name(options.provider, options.hosts))


def place_of_record(record: RunRecord | Mapping[str, Any]) -> Place:
    """Where a recorded run went (its typed run.json, or run.json as read): its recorded `provider` (records older
    than `provider` went to their recorded hosts, or ran here)."""
    fields = record if isinstance(record, Mapping) else record.extra
    provider = fields.get("provider")
    if isinstance(provider, str) and provider in PLACES:
        return PLACES[provider]
    return PLACES["ssh" if fields.get("hosts") else "local"]


def run_up(spec: RunSpec, options: UpOptions) -> UpResult:
    """Run one experiment to its end (or plan it, with dry_run) where the options say; where its results are."""
    return place_of(options).up(spec, options)


def run_saved_file(path: Path, options: UpOptions) -> UpResult | None:
    """`up --plan FILE` where FILE is a place's own kind of saved plan (a Slurm job's batch script), run by that
    place; None for a plan of hosts (launcher/planning/plan_file.py reads those)."""
    for place in PLACES.values():
        result = place.run_saved_file(path, options)
        if result is not None:
            return result
    return None


def run_saved_plan(plan: RunPlan, options: UpOptions) -> UpResult:
    """`up --plan FILE`: run exactly the saved plan, on its hosts or here (launcher/execute/saved_plan.py)."""
    from launcher.execute.saved_plan import options_for_saved

    options = options_for_saved(plan, options)
    return place_of(options).run_saved(plan, options)
