"""A run whose measured world is not its planned one never ends in success. For our trainer the world is what its
summary.json records (torchrun's WORLD_SIZE and GROUP_WORLD_SIZE as the ranks saw them: a node that died in the
rendezvous leaves the others a smaller world, and they train alone); no summary at all means it trained nothing
(`--python /bin/true` ends with status 0 and writes nothing). A `-- CMD` run is measured by its join records
(launcher/results/joined_worlds.py, whose verdict run_records.finish_records puts in the summary it writes).
"""

from __future__ import annotations

from typing import Any

from launcher.results.rundir import RunDir, read_json, write_json_atomic
from launcher.spec.run_spec import RunSpec
from launcher.spec.strategies import SELF_SPAWNING, torchrun_workers


def planned_trainer_world(spec: RunSpec) -> int:
    """The processes of the trainer's process group that the plan asks for, across its nodes."""
    per_node = spec.nproc_per_node if spec.strategy in SELF_SPAWNING else torchrun_workers(spec.strategy,
                                                                                             spec.nproc_per_node)
    return spec.nnodes * per_node


def trainer_world_problem(spec: RunSpec, summary: dict[str, Any] | None) -> str | None:
    """What makes the trainer's recorded world not the planned one (one line), or None when it is."""
    if summary is None:
        return ("the trainer wrote no summary.json, so the run trained nothing although it ended with status 0: "
                f"check that --python {spec.python} runs Python with torch (and the trainer's log)")
    planned_nodes, planned = spec.nnodes, planned_trainer_world(spec)
    nodes, world = summary.get("nnodes"), summary.get("world_size")
    if isinstance(nodes, int) and nodes != planned_nodes:
        return (f"the trainer ran on {nodes} node(s) with world size {world}, not the planned {planned_nodes} "
                f"node(s) and {planned} processes: a node left the rendezvous (its torchrun log says why) and the "
                "others trained without it; the results are not those of the planned run")
    if isinstance(world, int) and world != planned:
        return (f"the trainer's world had {world} processes, not the planned {planned}: the results are not those "
                "of the planned run")
    return None


def checked_exit_code(run_dir: RunDir, script_summary: dict[str, Any] | None, code: int) -> int:
    """The run's exit status once its world is checked against the plan: 1 (with the reason in summary.json's
    world_warning, or run.json's failure when there is no summary) for a run that ended well in the wrong world."""
    if code != 0:
        return code
    spec = run_dir.spec()
    if spec.user_command:
        return 1 if script_summary is not None and script_summary.get("world_failed") else code
    summary = read_json(run_dir.path / "summary.json")
    problem = trainer_world_problem(spec, summary)
    if problem is None:
        return code
    if summary is not None:
        write_json_atomic(run_dir.path / "summary.json", {**summary, "world_warning": problem, "world_failed": True})
    elif not isinstance(run_dir.record().get("failure"), dict):
        run_dir.update_record(failure={"summary": problem, "world": True})
    run_dir.event("world_differs", error=problem)
    return 1
