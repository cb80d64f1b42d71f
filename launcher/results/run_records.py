"""After a run (or a pull): its restarts from torchrun's own records, and for a user's script the records our
trainer writes itself — timing.jsonl and summary.json at the top of the run directory — made from what the
script's global rank 0 printed (launcher.results.script_progress)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.results.joined_worlds import measure, world_verdict
from launcher.results.rank_layout import rank_layout
from launcher.results.restarts import attempt_number, restarts_in
from launcher.results.rundir import RunDir, read_json, write_bytes_atomic, write_json_atomic
from launcher.results.script_progress import ScriptProgress, script_summary

WRITTEN_BY = "ddpctl, from the script's output"


def node_logs_dirs(run_dir: RunDir) -> list[Path]:
    """Each node's torchrun --log-dir as this machine has it: the run directory's logs/ for a local run (no hosts),
    the pulled nodes/<k>/logs/ for a run on hosts, or reached through one (a Slurm job: run.json lists its login
    node, not its nodes, so they are counted from the spec)."""
    nodes = run_dir.record().get("nodes")
    if isinstance(nodes, list) and nodes:
        return [run_dir.path / "nodes" / str(k) / "logs" for k in range(len(nodes))]
    if run_dir.record().get("hosts"):
        return [run_dir.path / "nodes" / str(k) / "logs" for k in range(run_dir.spec().nnodes)]
    return [run_dir.path / "logs"]


def logged_restarts(run_dir: RunDir) -> dict[int, int]:
    """The restarts events.jsonl already records: per node, the newest attempt logged."""
    logged: dict[int, int] = {}
    for event in run_dir.events():
        if event.get("event") == "restarted" and isinstance(event.get("node"), int):
            logged[event["node"]] = max(logged.get(event["node"], 0), int(event.get("attempt") or 0))
    return logged


# attempt -> what ended the attempt before it (launcher/execute/failures/restart_causes.py), None when not known.
CauseOf = Callable[[int], "dict[str, Any] | None"]


def record_restarts(run_dir: RunDir, node: int, attempt: int | None, logged: dict[int, int],
                    cause_of: CauseOf | None = None) -> list[tuple[int, dict[str, Any] | None]]:
    """Log a `restarted` event (with its `cause` when `cause_of` knows it) for each attempt of `node` past those
    in `logged` (which is updated); returns the attempts logged now, each with its cause."""
    new: list[tuple[int, dict[str, Any] | None]] = []
    for number in range(logged.get(node, 0) + 1, (attempt or 0) + 1):
        cause = cause_of(number) if cause_of else None
        run_dir.event("restarted", node=node, attempt=number, **({"cause": cause} if cause else {}))
        logged[node] = number
        new.append((number, cause))
    return new


def restarts_told(run_dir: RunDir) -> list[dict[str, Any]]:
    """Each restart events.jsonl tells, once per attempt: {attempt, nodes (that restarted), cause (or None)}."""
    told: dict[int, dict[str, Any]] = {}
    for event in run_dir.events():
        if event.get("event") != "restarted" or not isinstance(event.get("attempt"), int):
            continue
        entry = told.setdefault(event["attempt"], {"attempt": event["attempt"], "nodes": [], "cause": None})
        entry["nodes"].append(event.get("node"))
        entry["cause"] = entry["cause"] or event.get("cause")
    return [told[k] for k in sorted(told)]


def node_restarts(run_dir: RunDir) -> list[int]:
    """Per node, how many times its torchrun restarted the workers, from the logs this machine has."""
    return [restarts_in(d) for d in node_logs_dirs(run_dir)]


def finish_records(run_dir: RunDir, cause_of: CauseOf | None = None) -> dict[str, Any] | None:
    """Record restarts not yet in events.jsonl (with their causes, from `cause_of`); for a user's script, write
    the summary (and timing records when it used the protocol). Returns the summary written, or None."""
    counts = node_restarts(run_dir)
    logged = logged_restarts(run_dir)
    for node, count in enumerate(counts):
        record_restarts(run_dir, node, count, logged, cause_of)
    spec = run_dir.spec()
    if not spec.user_command:
        return None
    summary_path = run_dir.path / "summary.json"
    existing = read_json(summary_path)
    if existing is not None and existing.get("written_by") != WRITTEN_BY:
        return None  # the script wrote its own
    layout = rank_layout(run_dir)
    node, local_rank = layout.locate(0)
    script, timing = ScriptProgress(), []
    logs = node_logs_dirs(run_dir)[node] if node < len(counts) else run_dir.path / "logs"
    attempts = sorted((d for d in logs.glob("*/attempt_*") if attempt_number(d.name) is not None),
                      key=lambda d: attempt_number(d.name) or 0)
    measured = measure(node_logs_dirs(run_dir))
    planned_world = spec.world_size if spec.launcher == "torchrun" else None  # spawn: the script picks its own
    world, warning, failed = world_verdict(measured, spec.nnodes, planned_world)
    for attempt_dir in attempts:
        seen = len(script.timing)
        try:
            script.feed((attempt_dir / str(local_rank) / "stdout.log").read_text(errors="replace") + "\n")
        except OSError:
            continue
        timing += [{**r, "world_size": world["world_size"], "restart_count": attempt_number(attempt_dir.name)}
                   for r in script.timing[seen:]]
    if timing:
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in timing)
        write_bytes_atomic(run_dir.path / "timing.jsonl", text.encode())
    summary = {"written_by": WRITTEN_BY, "command": list(spec.user_command), "model": _script_name(spec.user_command),
               "dataset": "-", **world, "nnodes": len(layout.node_of_group), "launcher": spec.launcher,
               "restarts": max(counts, default=0), "wall_seconds": _elapsed(run_dir),
               **script_summary(timing, script.record)}  # fmt: skip
    if warning is not None:
        summary.update(world_warning=warning, world_failed=failed)
    if not any(e.get("event") == "world_measured" for e in run_dir.events()):
        run_dir.event("world_measured", **{k: v for k, v in world.items() if k != "world_measured"},
                      measured=world["world_measured"], warning=warning, failed=failed)
    write_json_atomic(summary_path, summary)
    return summary


def world_exit_code(summary: dict[str, Any] | None, code: int) -> int:
    """A run that ended well but did not train as one world across its nodes fails (exit 1): never a silent
    success with the wrong world."""
    return 1 if code == 0 and summary is not None and summary.get("world_failed") else code


def _script_name(command: tuple[str, ...] | list[str]) -> str:
    """The script a command runs (`python train.py 50` -> train.py), for the report's model column."""
    words = [w for w in command[1:] if not w.startswith("-")] if command and "python" in command[0] else []
    return Path(words[0] if words else command[0]).name if command else "-"


def _elapsed(run_dir: RunDir) -> float | None:
    """Seconds from torchrun's start to the run's end, as events.jsonl records them."""
    events = run_dir.events()
    started = [e["time"] for e in events if e.get("event") == "started" and isinstance(e.get("time"), float)]
    ended = [e["time"] for e in events if e.get("event") in ("exited", "finished", "stopped")
             and isinstance(e.get("time"), float)]
    return round(max(ended) - min(started), 3) if started and ended and max(ended) > min(started) else None
