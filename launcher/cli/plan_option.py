"""`up --plan FILE` and `up --dry-run --save-plan FILE`: a plan saved by one invocation and run by another. The
plan holds the spec, the hosts, the runtime and what to ship; the only options that go with --plan are how to
connect and how to show or follow the run."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.cli.options import flag_of
from launcher.errors import SpecError
from launcher.planning.request import UpOptions, UpResult
from launcher.spec.validate import check_seconds

# What may be given with --plan: how to reach the hosts, how to follow and show the run, what to pull.
WITH_PLAN = ("plan", "runs_dir", "json_out", "quiet", "progress", "identity_file", "accept_new_host_keys",
             "connect_timeout", "allow_public_rendezvous", "stall_timeout", "detach", "outputs")


def up_saved_plan(values: dict[str, Any], given: list[str], command: list[str] | None) -> UpResult:
    """Load the plan (refused in one line when it cannot be used) and run it as it is."""
    from launcher.execute.following.interruption import catch_stop_signals
    from launcher.places.registry import run_saved_file, run_saved_plan
    from launcher.planning.plan_file import is_local, load_plan

    extra = [flag_of(name) for name in given if name not in WITH_PLAN] + (["-- CMD"] if command else [])
    if extra:
        raise SpecError(f"--plan runs the saved plan as it is (its spec, hosts, runtime and code): drop "
                        f"{', '.join(extra)}, or make a new plan with them and --dry-run --save-plan FILE")
    check_seconds(values["connect_timeout"], "--connect-timeout")
    if values["stall_timeout"] < 0 or not math.isfinite(values["stall_timeout"]):
        raise SpecError(f"--stall-timeout {values['stall_timeout']:g}: give seconds >= 0 (0 turns it off)")
    path = Path(values["plan"])
    common = UpOptions(
        runs_dir=Path(values["runs_dir"]), show_progress=not values["json_out"], show_output=not values["quiet"],
        detach=bool(values.get("detach")), identity_file=values["identity_file"],
        accept_new_host_keys=values["accept_new_host_keys"], connect_timeout=values["connect_timeout"],
        record={"options": {}, "from_plan": str(path.resolve())},
    )  # fmt: skip
    own = run_saved_file(path, common)  # a place's own kind of plan (a Slurm job's: its batch script)
    if own is not None:
        return own
    plan = load_plan(path)
    if is_local(plan) and "runs_dir" in given:
        planned = Path(plan.nodes[0].workspace).parent
        if Path(values["runs_dir"]).resolve() != planned:
            raise SpecError(f"--runs-dir {values['runs_dir']}: the plan in {path} writes its run into {planned} (on "
                            "this machine the run directory is part of the plan): drop --runs-dir")
    runs_dir = Path(plan.nodes[0].workspace).parent if is_local(plan) else Path(values["runs_dir"])
    if (runs_dir / plan.spec.run_id).exists():
        raise SpecError(f"--plan {path}: its run {plan.spec.run_id} has run already ({runs_dir / plan.spec.run_id}): "
                        "a plan runs once; make a new one with `ddpctl up --dry-run --save-plan FILE`")
    outputs = [str(p) for p in values.get("outputs") or []]
    options = replace(common, allow_public_rendezvous=values["allow_public_rendezvous"],
                      stall_timeout=values["stall_timeout"],
                      record={**common.record, "options": {"outputs": outputs} if outputs else {}})
    catch_stop_signals()  # SIGTERM and SIGHUP stop the run as Ctrl-C does, with an outcome
    return run_saved_plan(plan, options)


def check_saved_files_not_shipped(values: dict[str, Any], result: UpResult) -> None:
    """Refuse (before either is written) a --save-plan or --save-config file inside the folder the plan ships: it
    would change the files whose digest the plan records, and `up --plan` would refuse them for ever."""
    ship = result.plan.ship if result.plan is not None else None
    if ship is None:
        return
    from launcher.transport.sync import ignore_spec  # paramiko: only a plan that ships gets here

    source = Path(ship.source)
    for option in ("save_plan", "save_config"):
        if values.get(option) is None:
            continue
        target = Path(values[option]).resolve()
        if not target.is_relative_to(source) or ignore_spec(source).match_file(str(target.relative_to(source))):
            continue
        raise SpecError(f"{flag_of(option)} {values[option]}: it is inside {source}, the folder this run ships to "
                        "its hosts, so writing it would change the files the plan records (`up --plan` would then "
                        f"refuse them): write it outside, e.g. {flag_of(option)} ../{target.name}, or add "
                        f"{target.relative_to(source)} to {source / '.ddpctlignore'}")


def save_plan_if_asked(values: dict[str, Any], result: UpResult) -> None:
    """--save-plan: the plan the dry run printed, written to the file (refused without --dry-run)."""
    if values["save_plan"] is not None and result.scheduled_plan is not None:
        import json

        from launcher.results.user_files import write_user_file

        try:
            write_user_file(values["save_plan"], (json.dumps(result.scheduled_plan, indent=2) + "\n").encode(),
                            "--save-plan")
        except OSError as e:
            raise SpecError(f"--save-plan {values['save_plan']}: cannot write it ({e.strerror or e})") from None
        print(f"plan written to {values['save_plan']}; run it with `ddpctl up --plan {values['save_plan']}`",
              file=sys.stderr)
        return
    if values["save_plan"] is None or result.plan is None:
        return
    from launcher.planning.plan_file import save_plan

    save_plan(values["save_plan"], result.plan)
    print(f"plan written to {values['save_plan']}; run it with `ddpctl up --plan {values['save_plan']}`",
          file=sys.stderr)
