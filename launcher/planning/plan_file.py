"""A plan saved to a file (`up --dry-run --save-plan FILE`) and read back to run (`up --plan FILE`): written
atomically as `RunPlan.to_json()` prints it, read back with `RunPlan.from_json`; a file that cannot be a plan, or a
plan that cannot run, is refused in one line naming the file and what to do."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.errors import PlanError, SpecError
from launcher.planning.plan import LOCAL, RunPlan
from launcher.results.user_files import write_user_file
from launcher.spec.hosts import parse_hosts
from launcher.spec.user_paths import read_user_file

PLAN_MAX_BYTES = 16 << 20  # a plan names its nodes and files: kilobytes
MAKE_ONE = "save one with `ddpctl up --dry-run --save-plan FILE` (add the options of the run)"


def save_plan(path: Path, plan: RunPlan) -> Path:
    """Write the plan (all of it or nothing; a link is followed to its file); returns the file written."""
    try:
        return write_user_file(path, (json.dumps(plan.to_json(), indent=2) + "\n").encode(), "--save-plan")
    except OSError as e:
        raise PlanError(f"--save-plan {path}: cannot write it ({e.strerror or e})") from None


def load_plan(path: Path) -> RunPlan:
    """The plan saved in `path`, refused when it is missing, malformed, made by a newer ddpctl, or cannot run."""
    try:
        text = read_user_file(path, "--plan", PLAN_MAX_BYTES, MAKE_ONE).decode("utf-8")
    except FileNotFoundError:
        raise PlanError(f"--plan {path}: no such file: {MAKE_ONE}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"--plan {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise PlanError(f"--plan {path}: it is not JSON ({e}): {MAKE_ONE}") from None
    try:
        plan = RunPlan.from_json(data)
    except PlanError as e:
        raise PlanError(f"--plan {path}: {e}") from None
    problem = unrunnable(plan)
    if problem:
        raise PlanError(f"--plan {path}: {problem}")
    return plan


def is_local(plan: RunPlan) -> bool:
    """Whether the plan runs on this machine (one node, no host)."""
    return [node.host.label for node in plan.nodes] == [LOCAL]


def unrunnable(plan: RunPlan) -> str | None:
    """Why the plan cannot run as it is, or None."""
    if plan.unknown:
        named = "; ".join(item.split(":")[0].split(" (")[0] for item in plan.unknown)
        return (f"the plan leaves {named} unknown (made without probing the hosts, or on Vast.ai offers), and a plan "
                f"with unknowns never runs: {MAKE_ONE} on hosts it can reach")
    if plan.spec.withheld_env:
        names = ", ".join(plan.spec.withheld_env)
        return (f"the plan holds no values for --env {names} (a plan never stores them): run `ddpctl up` with the "
                "options and --env NAME=VALUE instead")
    if not plan.nodes or [node.index for node in plan.nodes] != list(range(len(plan.nodes))):
        return "its nodes are not numbered 0, 1, ...: it was not written by ddpctl"
    if is_local(plan):
        return None
    if LOCAL in (node.host.label for node in plan.nodes) or plan.ship is None:
        return "it mixes this machine with hosts, or says nothing of what to ship: it was not written by ddpctl"
    try:
        parse_hosts([node.host.label for node in plan.nodes])
    except SpecError as e:
        return f"its hosts cannot be reached as written ({e})"
    return None
