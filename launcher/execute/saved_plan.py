"""`up --plan FILE` on the executor's side: the options that reach the saved plan's hosts again (or this machine),
and the check that the hosts still give that plan before it runs, so the run is exactly the plan that was saved.

The probe runs as for any run (host keys verified, node 0's rendezvous port reserved) with everything the plan
decided given: runtime, processes per node, rendezvous address and port. The plan it gives must equal the saved one
but for the hosts' facts of the moment; the saved plan is what runs and what the run keeps as plan.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.errors import PlanError
from launcher.planning.plan import RunPlan
from launcher.planning.plan_file import is_local
from launcher.planning.request import UpOptions
from launcher.spec.hosts import parse_hosts

# What may differ between the saved plan and the one the hosts give now: facts that change by themselves, and
# what is settled apart from the probe (what is shipped, which ddpctl wrote the file).
NOT_COMPARED = ("node_facts", "ship", "ddpctl")


def options_for_saved(plan: RunPlan, options: UpOptions) -> UpOptions:
    """`options` (how to connect and show the run) with everything the plan decided: where it runs, the runtime,
    the image, the layout, the rendezvous address and port."""
    if is_local(plan):
        return replace(options, provider="local", hosts=(), runs_dir=Path(plan.nodes[0].workspace).parent)
    return replace(options, provider="ssh", hosts=parse_hosts([node.host.label for node in plan.nodes]),
                   runtime=plan.runtime, image=None if plan.pull_image else plan.image,
                   registry=plan.image if plan.pull_image else None, rdzv_addr=plan.rdzv_addr, auto_gpus=False,
                   auto_rdzv_port=False, dry_run=False, probe=True)


def same_plan(saved: RunPlan, now: RunPlan) -> RunPlan:
    """The saved plan, when the hosts give it still (PlanError naming what changed, else)."""
    differ = _differences(_compared(saved.to_json()), _compared(now.to_json()))
    if differ:
        shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        raise PlanError(f"the hosts no longer give the saved plan ({shown} differ): make it again with `ddpctl up "
                        "--dry-run --save-plan FILE`")
    return saved


def _compared(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in NOT_COMPARED}


def _differences(saved: Any, now: Any, where: str = "") -> list[str]:
    """The paths (e.g. nodes[1].command) at which two JSON values differ."""
    if isinstance(saved, dict) and isinstance(now, dict):
        return [d for key in sorted(set(saved) | set(now), key=str)
                for d in _differences(saved.get(key), now.get(key), f"{where}.{key}" if where else str(key))]
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        return [d for i, (a, b) in enumerate(zip(saved, now, strict=True)) for d in _differences(a, b, f"{where}[{i}]")]
    return [] if saved == now else [where or "the plan"]
