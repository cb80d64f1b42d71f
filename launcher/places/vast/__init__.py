"""Vast.ai as a place, all in this folder: the API client and the market (client.py, offers.py), renting and giving
back (provider.py, provision.py, teardown.py), the ledger of what is rented (ledger.py), the autostop watchdog on the
machines (autostop.py), a rented run's day-2 commands (rented_run.py: `down` destroys the machines) and the place's
own commands (commands.py: `offers`, `vast login`). The run on the rented machines is a run on hosts
(launcher/execute/hosts/run.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.errors import SpecError
from launcher.places.on_provider import ProvidedPlace

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.execute.day2.recorded import RecordedRun
    from launcher.places.option_words import Flags
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.providers.base import HostProvider
    from launcher.spec.run_spec import RunSpec

# The options only --provider vast reads.
VAST_ONLY = ("nodes", "gpu_name", "max_price", "min_reliability", "disk", "down", "max_cost", "max_cost_reserve",
             "ready_timeout", "expected_hours",
             "interruptible", "bid")


class VastPlace(ProvidedPlace):
    """--provider vast: rented machines, our image as the machine."""

    name = "vast"
    own_options: tuple[str, ...] = VAST_ONLY
    own_options_hint = "add --provider vast to rent machines"
    allocates_nodes = True

    def add_commands(self, app: Any) -> None:
        """`ddpctl offers` and `ddpctl vast login` (launcher/places/vast/commands.py)."""
        from launcher.places.vast.commands import register

        register(app)

    def check_hosts(self, hosts: tuple[object, ...]) -> None:
        if hosts:
            raise SpecError(f"--host is for --provider ssh, not {self.name}")

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        if runtime != "native":
            raise SpecError("on Vast.ai our image is the machine: the run is native there (drop --runtime)")
        if "--registry" in given:
            raise SpecError("with --provider vast, --image is the registry reference each machine starts from: "
                            "drop --registry")

    def requests(self, values: dict[str, Any]) -> dict[str, Any]:
        """The VastRequest (what to rent) of the options' values; a number that is not finite is refused."""
        names = ("gpu_name", "max_price", "min_reliability", "disk", "down", "max_cost", "ready_timeout",
                 "registry_login")
        options = {name: values[name] for name in names}
        options.update(nodes=values.get("nodes", 1), max_cost_reserve_s=values["max_cost_reserve"],
                       autostop_minutes=values.get("autostop"))
        options["expected_hours"] = values.get("expected_hours")
        options.update(interruptible=bool(values.get("interruptible")), bid=values.get("bid"))
        for name, value in options.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"--{name.replace('_', '-').removesuffix('-s')} {value}: give a finite number")
        from launcher.spec.vast_request import VastRequest

        return {"vast": VastRequest(**options)}

    def up(self, spec: RunSpec, options: UpOptions) -> UpResult:
        if options.vast is not None and options.vast.interruptible:  # launcher/places/vast/interruptible_chain.py
            from launcher.places.vast.interruptible_chain import run_interruptible

            return run_interruptible(spec, options)
        return super().up(spec, options)

    def run_saved(self, plan: RunPlan, options: UpOptions) -> UpResult:
        if options.vast is not None and options.vast.interruptible:
            from launcher.places.vast.interruptible_chain import run_interruptible

            return run_interruptible(plan.spec, options, saved=plan)
        return super().run_saved(plan, options)

    def sweep_entry(self, options: UpOptions, nnodes: int, sweep_dir: Path) -> UpOptions:
        """An entry's machines; one --max-cost for the whole sweep: it gets what the earlier entries left."""
        if options.vast is None:
            return options
        from launcher.places.vast.budget import sweep_run_request

        return replace(options, vast=sweep_run_request(replace(options.vast, nodes=nnodes), sweep_dir))

    def host_provider(self, options: UpOptions) -> HostProvider:
        from launcher.execute.up import executor_calls
        from launcher.places.vast.provider import VastProvider

        return VastProvider(options, executor_calls())

    def recorded(self) -> RecordedRun:
        from launcher.places.vast.rented_run import RentedRun

        return RentedRun()

    def print_held(self, runs_dir: Path, json_out: bool) -> None:
        """Every Vast.ai machine a run under `runs_dir` still rents (launcher/places/vast/rented_list.py)."""
        from launcher.places.vast.rented_list import print_rented

        print_rented(runs_dir, json_out)

    def held_note(self, runs_dir: Path) -> str | None:
        from launcher.places.vast.rented_list import rented_rows

        still = rented_rows(runs_dir)
        if not still:
            return None
        return (f"{len(still)} Vast.ai machine(s) of run(s) {', '.join(sorted({r['run'] for r in still}))} are still "
                "rented and billing: see `ddpctl status --rented`; stop them with `ddpctl down RUN`")

    def not_pulled_after_down(self, run_id: str, record: dict[str, Any], after_down: bool) -> str:
        if after_down:
            return "what was not pulled is gone with the machines" if record.get("released_at") else ""
        return (f"`ddpctl down {run_id}` destroys the machines once the rest is verified, and what was not "
                "pulled with them")
