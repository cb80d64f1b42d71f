"""`ddpctl sweep`: the same experiment once per process layout, one run after another, grouped under
runs/sweep-<id>/ with a manifest (sweep.json) rewritten atomically after every step, so that an interrupted
sweep continues where it stopped.

Resume semantics: finished entries are kept; an entry that was running or failed when the sweep stopped is run
again from scratch in a new run directory (its old directory is kept for its logs) unless its files show that it
had in fact finished, in which case it counts as done.
"""

from __future__ import annotations

import fcntl
import math
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.errors import DdpctlError, RunDirError, SpecError
from launcher.results.run_figures import (
    SUMMARY_FILE,
    SWEEP_FILE,
    TIMING_FILE,
    Report,
    epoch_records,
    find_result_file,
)
from launcher.results.run_records import WRITTEN_BY as SCRIPT_SUMMARY
from launcher.results.rundir import read_json, read_jsonl, write_json_atomic
from launcher.spec.run_spec import RunSpec
from launcher.spec.strategies import DEVICE_STRATEGIES

SCALE_LR_MODES = ("none", "linear", "sqrt")
MANIFEST_VERSION = 1

# Runs one spec to its end with its run directory under runs_dir; returns that directory.
# Raises DdpctlError when the run could not be started or ended with an error.
Execute = Callable[[RunSpec, Path], Path]


class SweepError(DdpctlError):
    """A sweep could not be planned, resumed or completed."""


@dataclass(frozen=True)
class Layout:
    """One point of a sweep: nodes x processes per node."""

    nnodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def label(self) -> str:
        return f"{self.nnodes}x{self.nproc_per_node}"


def parse_counts(text: str, option: str) -> list[int]:
    """A comma-separated list of positive integers (`1,2,4`); SpecError naming the option otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise SpecError(f"{option} {text!r} is not a list: give positive integers separated by commas, e.g. 1,2,4")
    counts = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise SpecError(f"{option} {text!r}: {part!r} is not a positive integer; e.g. {option} 1,2,4")
        counts.append(int(part))
    return counts


def plan_layouts(gpus: list[int], nodes: list[int]) -> list[Layout]:
    """Every nodes x gpus combination once, smallest world size first (fewer nodes first on a tie)."""
    layouts = {Layout(n, g) for n in nodes for g in gpus}
    return sorted(layouts, key=lambda layout: (layout.world_size, layout.nnodes))


def scaled_lr(lr: float, world_size: int, smallest: int, mode: str) -> float:
    """The learning rate for `world_size`: unchanged, x (world/smallest), or x sqrt(world/smallest)."""
    if mode not in SCALE_LR_MODES:
        raise SpecError(f"--scale-lr {mode!r}: choose one of {', '.join(SCALE_LR_MODES)}")
    factor = world_size / smallest
    if mode == "linear":
        return lr * factor
    if mode == "sqrt":
        return lr * math.sqrt(factor)
    return lr


def strategy_spec(base: RunSpec, strategy: str, options: dict[str, Any], layout: Layout, **fields: Any) -> RunSpec:
    """`base` run with `strategy` on `layout`, given those of `options` (devices, average_every) that apply to
    it, and `fields` (validated once, as a whole)."""
    applies = {"devices": strategy in DEVICE_STRATEGIES, "average_every": strategy == "local-sgd"}
    return replace(base, strategy=strategy, nnodes=layout.nnodes, nproc_per_node=layout.nproc_per_node,
                   **{k: v for k, v in options.items() if applies.get(k)}, **fields)


def entry_label(entry: dict[str, Any]) -> str:
    """`NxG`, after the strategy's name when it is not ddp (`hogwild-1x2`): part of run ids and messages."""
    label = f"{entry['nnodes']}x{entry['nproc_per_node']}"
    strategy = entry.get("strategy", "ddp")
    return label if strategy == "ddp" else f"{strategy}-{label}"


def new_sweep(base: RunSpec, layouts: list[Layout], runs_dir: Path, scale_lr: str = "none",
              preset: str | None = None, launch: dict[str, Any] | None = None,
              strategies: tuple[str, ...] = ("ddp",), strategy_options: dict[str, Any] | None = None,
              skipped: list[str] | None = None) -> Path:
    """Create runs_dir/sweep-<id>/ holding a manifest with every entry (strategy x layout) pending; return it.

    `launch` is what the caller needs to run the entries again on resume (hosts, runtime), stored as given.
    local-sgd on one process (nothing to average, refused by the trainer) is left out and named in `skipped`."""
    if not layouts:
        raise SpecError("a sweep needs at least one layout: give --gpus, e.g. --gpus 1,2,4")
    sweep_id = f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    options = dict(strategy_options or {})
    smallest = min(layout.world_size for layout in layouts)
    entries = []
    for strategy in strategies:
        for layout in layouts:
            entry = {"strategy": strategy, "nnodes": layout.nnodes, "nproc_per_node": layout.nproc_per_node,
                     "world_size": layout.world_size}
            if strategy == "local-sgd" and layout.world_size < 2:
                if skipped is not None:
                    skipped.append(entry_label(entry))
                continue
            # Validate every entry's spec now, so a bad value fails before the first run, not after it.
            strategy_spec(base, strategy, options, layout, run_id=f"{sweep_id}-{entry_label(entry)}")
            entry.update(lr=scaled_lr(base.lr, layout.world_size, smallest, scale_lr), status="pending", attempts=0,
                         run_dir=None, error=None)
            entries.append(entry)
    if not entries:
        raise SpecError("local-sgd needs at least 2 processes: give --gpus 2 or more")
    manifest = {"version": MANIFEST_VERSION, "sweep_id": sweep_id, "created": time.time(),
                "base_spec": replace(base, run_id=sweep_id).to_json(), "scale_lr": scale_lr,
                "preset": preset, "launch": launch or {}, "strategy_options": options, "entries": entries,
                "report": None}
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        sweep_dir = runs_dir / sweep_id
        sweep_dir.mkdir()
    except OSError as e:
        raise RunDirError(f"cannot create a sweep directory under {runs_dir}: {e.strerror}; "
                          "pick another with --runs-dir") from e
    write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
    return sweep_dir


def load_manifest(sweep_dir: Path) -> dict[str, Any]:
    """The manifest of a sweep directory; SweepError naming the directory when it is not one."""
    import json

    path = sweep_dir / SWEEP_FILE
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{sweep_dir} is not a sweep directory (no {SWEEP_FILE}); "
                         "give the runs/sweep-<id> directory a sweep printed") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"cannot read {path}: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
        raise SweepError(f"{path} is not a sweep manifest this ddpctl understands")
    return manifest


def entry_spec(manifest: dict[str, Any], entry: dict[str, Any]) -> RunSpec:
    """The spec of one entry's next attempt: the base spec on the entry's layout and lr, with a fresh run id."""
    base = RunSpec.from_json(manifest["base_spec"])
    label = entry_label(entry)
    attempt = int(entry["attempts"]) + 1
    run_id = f"{manifest['sweep_id']}-{label}" + (f"-r{attempt}" if attempt > 1 else "")
    layout = Layout(int(entry["nnodes"]), int(entry["nproc_per_node"]))
    return strategy_spec(base, str(entry.get("strategy", base.strategy)), manifest.get("strategy_options", {}),
                         layout, run_id=run_id, lr=float(entry["lr"]))


def run_finished(run_dir: Path, epochs: int) -> bool:
    """True when the run wrote its summary and a timing record for every epoch; a `-- CMD` script that printed no
    epochs, when its world was measured and every node's process exited 0."""
    summary_path = find_result_file(run_dir, SUMMARY_FILE) if run_dir.is_dir() else None
    if summary_path is None:
        return False
    records = epoch_records(find_result_file(run_dir, TIMING_FILE))
    summary = read_json(summary_path) or {}
    if not records and summary.get("written_by") == SCRIPT_SUMMARY:
        exits = [e.get("exit_code") for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == "exited"]
        return bool(summary.get("world_measured")) and not summary.get("world_failed") and bool(exits) \
            and all(code == 0 for code in exits)
    return bool(records) and int(records[-1]["epoch"]) >= epochs


@contextmanager
def _sweep_lock(sweep_dir: Path) -> Iterator[None]:
    # Two ddpctl processes driving one sweep would run the same layouts twice and fight over the manifest.
    fd = os.open(sweep_dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepError(f"sweep {sweep_dir} is being run by another ddpctl; wait for it to end") from None
        yield
    finally:
        os.close(fd)


def run_sweep(sweep_dir: Path, execute: Execute,
              on_entry: Callable[[dict[str, Any], RunSpec], None] | None = None) -> dict[str, Any]:
    """Run every entry that is not done, in order, rewriting the manifest after each step; return it.

    Stops at the first failing entry with a SweepError saying how to continue."""
    with _sweep_lock(sweep_dir):
        manifest = load_manifest(sweep_dir)
        epochs = int(manifest["base_spec"]["epochs"])
        for entry in manifest["entries"]:
            if entry["status"] == "done":
                continue
            if entry["run_dir"] and run_finished(sweep_dir / entry["run_dir"], epochs):
                # It ended after the manifest last said so (the sweep was stopped between the two).
                entry.update(status="done", error=None)
                write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
                continue
            spec = entry_spec(manifest, entry)
            entry.update(status="running", attempts=entry["attempts"] + 1, run_dir=spec.run_id, error=None,
                         started=time.time())
            write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
            if on_entry:
                on_entry(entry, spec)
            try:
                run_dir = execute(spec, sweep_dir)
            except DdpctlError as e:
                _fail(sweep_dir, manifest, entry, str(e))
            except BaseException:
                entry.update(status="interrupted", error="the sweep was stopped during this run")
                write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
                raise
            entry["run_dir"] = os.path.relpath(run_dir, sweep_dir)
            if not run_finished(run_dir, epochs):
                _fail(sweep_dir, manifest, entry, f"run {run_dir} ended before its last epoch")
            entry.update(status="done", finished=time.time())
            write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
        return manifest


def _fail(sweep_dir: Path, manifest: dict[str, Any], entry: dict[str, Any], reason: str) -> None:
    # Per-host failures arrive one host per line; the sweep's own error stays one line.
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    reason = " ".join(line if line.endswith(":") or i == len(lines) - 1 else line + ";"
                      for i, line in enumerate(lines))
    entry.update(status="failed", error=reason)
    write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
    label = entry_label(entry)
    raise SweepError(f"sweep stopped at layout {label}: {reason}; "
                     f"continue with `ddpctl sweep --resume {sweep_dir}`")


def finish_sweep(sweep_dir: Path) -> tuple[Report, list[Path]]:
    """Write the report of a finished sweep into its directory, record it in the manifest; return both."""
    from launcher.results.report import write_report
    from launcher.results.run_figures import build_report

    report = build_report([sweep_dir])
    files = write_report(report, sweep_dir)
    with _sweep_lock(sweep_dir):
        manifest = load_manifest(sweep_dir)
        manifest["report"] = "report.md"
        write_json_atomic(sweep_dir / SWEEP_FILE, manifest)
    return report, files
