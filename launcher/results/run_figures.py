"""The data model of scaling reports: run directories -> figures per run -> one row per process layout.

Reads only the files of the run-directory contract (docs/contracts.md): timing.jsonl, summary.json and, when
present, run.json. Compose runs (no run.json) and runs pulled from hosts (nodes/<k>/) read the same way.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import RunDirError
from launcher.results.network_share import NetworkFigures, network_figures
from launcher.results.progress import finite_number
from launcher.results.record import load_run_record
from launcher.results.rundir import RUN_FILE, primary_node_out, read_json, read_jsonl
from launcher.results.script_curves import ScriptScalars, event_files, read_scalars
from launcher.results.script_progress import FIELD_RANGES, out_of_range
from launcher.spec.presets import ReferenceFigures

TIMING_FILE = "timing.jsonl"
SUMMARY_FILE = "summary.json"
SWEEP_FILE = "sweep.json"
# A run is "not comparable" when other work kept at least this share of its cores busy, or when its scaling
# efficiency is above SUPERLINEAR: on CPU that is a slow (busy, or thread-starved) baseline, not a result.
BUSY_FRACTION = 0.5
SUPERLINEAR = 1.05


@dataclass(frozen=True)
class RunFigures:
    """One run's records and what it was: the input of a report."""

    path: Path
    run_id: str
    world_size: int
    nnodes: int
    model: str
    dataset: str
    batch_size: int | None
    lr: float | None
    epochs_planned: int | None
    records: tuple[dict[str, Any], ...]  # one per finished epoch, in epoch order
    cost_usd: float | None
    started: float  # unix time; decides which of two runs of one layout is newer
    strategy: str = "ddp"
    precision: str = "fp32"  # --precision: bf16 runs are rows of their own
    threads_per_process: int | None = None
    processes_per_node: int | None = None
    cores: int | None = None
    load_start: float | None = None  # 1-minute load average when the trainer started
    load_end: float | None = None
    network: NetworkFigures = NetworkFigures()  # exposed communication, bandwidth measured before the run
    # A `-- CMD` run without epoch records: its wall time, and what its own TensorBoard scalars showed.
    wall_seconds: float | None = None
    script_scalars: ScriptScalars | None = None
    interruptions: tuple[dict[str, Any], ...] = ()  # --interruptible: machines lost and replaced (run.json)

    def timed_seconds(self) -> float | None:
        """The seconds its speed-up is measured on: training (the epochs' sum) when epochs were recorded; for a
        script without them, from its first to its last logged scalar where seen, else its wall time."""
        if self.records:
            return sum(float(r["seconds"]) for r in self.records)
        scalars = self.script_scalars
        if scalars is not None and scalars.last_time > scalars.first_time:
            return scalars.last_time - scalars.first_time
        return self.wall_seconds

    def busy(self) -> str:
        """Why the machine was busy while this run trained (others' load against its cores), or ""."""
        if not self.cores:
            return ""
        own = (self.processes_per_node or 1) * (self.threads_per_process or 1)
        # The load at the end includes our own threads; the 1-minute average lags, so leaving them all out is lenient.
        others = max(self.load_start or 0.0, (self.load_end or 0.0) - own)
        if others >= BUSY_FRACTION * self.cores:
            return f"machine busy (load {others:.1f} from other work on {self.cores} cores)"
        return ""


@dataclass(frozen=True)
class Row:
    """Figures of one layout (nodes x processes); `speedup` and `efficiency` are against the table's first row."""

    world_size: int
    nnodes: int
    run_id: str
    model: str
    dataset: str
    batch_size: int | None
    global_batch: int | None
    lr: float | None
    epochs: int
    steps_per_epoch: int | None
    epoch_seconds: float | None  # median of the per-epoch training times (None: no epoch recorded)
    train_seconds: float  # sum of the per-epoch training times (validation excluded), else RunFigures.timed_seconds
    speedup: float
    efficiency: float
    samples_per_s: float | None
    train_acc: float | None
    val_acc: float | None
    cost_usd: float | None
    superseded: tuple[str, ...] = ()  # older runs of the same layout left out of the table
    strategy: str = "ddp"
    threads_per_process: int | None = None
    not_comparable: str = ""
    precision: str = "fp32"  # why speed-up and efficiency are not a result ("" when they are)
    exposed_comm_fraction: float | None = None  # a step's share spent waiting on the gradients' communication
    busbw_gbit_s: float | None = None  # up --check-bandwidth's figure for the run's hosts
    predicted_efficiency: float | None = None  # what that bandwidth allows (launcher/results/network_share.py)
    wall_seconds: float | None = None  # a script run without epoch records: launch to end
    first_step_s: float | None = None  # seconds from the launch to the script's first / last logged scalar
    last_step_s: float | None = None
    interruptions: tuple[dict[str, Any], ...] = ()  # --interruptible: what each lost machine took and cost
    script_scalars: tuple[tuple[str, float], ...] = ()  # each TensorBoard tag's last value

    @property
    def layout(self) -> str:
        return f"{self.nnodes}x{self.world_size // self.nnodes}"

    @property
    def strategy_label(self) -> str:
        """The strategy as tables and plots name it: with its precision when that is not the default fp32."""
        return self.strategy if self.precision == "fp32" else f"{self.strategy} ({self.precision})"


def find_result_file(path: Path, name: str) -> Path | None:
    """`name` at the top of a run directory, else among the pulled files of the node that held global rank 0;
    None when absent."""
    if (path / name).is_file():
        return path / name
    nodes = sum(1 for p in (path / "nodes").glob("*") if p.name.isdigit())
    primary = primary_node_out(path, nodes)
    return primary / name if primary is not None and (primary / name).is_file() else None


def epoch_records(timing: Path | None) -> tuple[dict[str, Any], ...]:
    """The timing records, one per finished epoch in order. A record holding a number no figure or plot can use
    (inf, nan, 1e308 seconds: script_progress.FIELD_RANGES) is left out, and one line on stderr says so."""
    # After a restart an epoch may be recorded twice; the later record is the one that counted.
    by_epoch: dict[int, dict[str, Any]] = {}
    left_out: list[str] = []
    for record in read_jsonl(timing) if timing else []:
        if isinstance(record, dict) and isinstance(record.get("epoch"), int) and "seconds" in record:
            problems = [why for name, value in record.items() if name in FIELD_RANGES
                        and (why := out_of_range(name, value))]
            if problems:
                left_out.append(", ".join(problems))
                continue
            by_epoch[record["epoch"]] = record
    if left_out:
        print(f"warning: {timing}: {len(left_out)} record(s) left out of the report ({'; '.join(left_out[:3])})",
              file=sys.stderr)
    return tuple(by_epoch[e] for e in sorted(by_epoch))


def _cost(*sources: dict[str, Any]) -> float | None:
    for source in sources:
        value = finite_number(source.get("cost_usd"))
        if value is not None and not isinstance(source.get("cost_usd"), str):
            return value
    return None


class UnmeasuredWorld(RunDirError):
    """A `-- CMD` run whose world size nobody measured: left out of a report rather than given the planned one."""


def load_run(path: Path) -> RunFigures:
    """Read one run directory; RunDirError naming it when it is not a run or has no finished epoch."""
    if not path.is_dir():
        raise RunDirError(f"{path} is not a directory: give run directories (or a sweep directory) to report")
    # A run.json that is there but unreadable is named as such (compose runs have none at all).
    run = load_run_record(path / RUN_FILE).to_json() if (path / RUN_FILE).exists() else {}
    summary_path = find_result_file(path, SUMMARY_FILE)
    summary = (read_json(summary_path) if summary_path else None) or {}
    timing = find_result_file(path, TIMING_FILE)
    if not run and not summary and timing is None:
        raise RunDirError(f"{path} is not a run directory (no {RUN_FILE}, {TIMING_FILE} or {SUMMARY_FILE})")
    records = epoch_records(timing)
    spec: dict[str, Any] = run["spec"] if isinstance(run.get("spec"), dict) else {}
    script_scalars = read_scalars(event_files(path)) if spec.get("user_command") else None
    wall = finite_number(summary.get("wall_seconds")) if spec.get("user_command") else None
    if not records and wall is None and script_scalars is None:
        raise RunDirError(f"run {path} has no finished epoch in {TIMING_FILE}: nothing to report for it")
    # A `-- CMD` run's spec holds our trainer's defaults (batch 32, lr 0.01...), which its script never read: its
    # figures come from what the script reported (the progress protocol's records, its summary) or stay unknown.
    trainer_spec = {} if spec.get("user_command") else spec
    last = records[-1] if records else {}
    measured = next((v for v in (last.get("world_size"), summary.get("world_size"))
                     if v and not out_of_range("world_size", v)), None)
    if measured is None and spec.get("user_command"):
        # The plan's nodes x processes is what was asked, not what ran (a script may spawn its own processes).
        raise UnmeasuredWorld(f"run {path}: its world size was not measured (no process of its script joined a "
                              "process group that ddpctl saw), so it has no place on a scaling axis")
    world_size = int(measured or int(spec.get("nnodes", 1)) * int(spec.get("nproc_per_node", 1)))
    started = run.get("created") or (records[0].get("time") if records else None) or path.stat().st_mtime
    return RunFigures(
        path=path,
        run_id=str(run.get("run_id") or path.name),
        world_size=world_size,
        nnodes=int(summary.get("nnodes") or spec.get("nnodes") or 1),
        model=str(summary.get("model") or spec.get("model") or "?"),
        dataset=str(summary.get("dataset") or spec.get("dataset") or "?"),
        batch_size=summary.get("batch_size") or trainer_spec.get("batch_size"),
        lr=summary.get("lr") or trainer_spec.get("lr"),
        epochs_planned=last.get("epochs") or summary.get("epochs") or trainer_spec.get("epochs"),
        records=records,
        cost_usd=_cost(run, summary),
        interruptions=tuple(i for i in run.get("interruptions") or [] if isinstance(i, dict)),
        started=float(started),
        strategy=str(summary.get("strategy") or spec.get("strategy") or "ddp"),
        precision=str(summary.get("precision") or spec.get("precision") or "fp32"),
        threads_per_process=_int_or_none(summary.get("threads_per_process") or trainer_spec.get("threads_per_process")),
        processes_per_node=_int_or_none(summary.get("processes_per_node")),
        cores=_int_or_none(summary.get("cores")),
        load_start=_first_load(summary.get("load_start")),
        load_end=_first_load(summary.get("load_end")),
        network=network_figures(run, summary),
        wall_seconds=wall,
        script_scalars=script_scalars,
    )


def _int_or_none(value: Any) -> int | None:
    number = finite_number(value) if isinstance(value, int | float) else None
    return None if number is None else int(number)


def _first_load(value: Any) -> float | None:
    """The 1-minute figure of a recorded os.getloadavg() triple."""
    if isinstance(value, list | tuple) and value and isinstance(value[0], int | float):
        return finite_number(value[0])
    return None


def expand_report_dirs(paths: list[Path]) -> tuple[list[Path], dict[str, Any] | None]:
    """Run directories to report on: sweep directories open into their finished runs. Also the sweep manifest
    (of the first sweep given), which names the preset."""
    runs: list[Path] = []
    manifest = None
    for path in paths:
        sweep = read_json(path / SWEEP_FILE) if path.is_dir() else None
        if sweep is None:
            runs.append(path)
            continue
        manifest = manifest or sweep
        runs += [path / Path(e["run_dir"]).name for e in sweep.get("entries", [])
                 if e.get("status") == "done" and e.get("run_dir")]
    return runs, manifest


def scaling_table(runs: list[RunFigures]) -> list[Row]:
    """One row per strategy x layout (newest run of it kept), by strategy then world size; speed-up over the
    strategy's smallest world size, flagged "not comparable" when super-linear or taken on a busy machine."""
    newest: dict[tuple[str, str, int, int], RunFigures] = {}
    older: dict[tuple[str, str, int, int], list[str]] = {}
    for run in sorted(runs, key=lambda r: r.started):
        key = (run.strategy, run.precision, run.world_size, run.nnodes)
        if key in newest:
            older.setdefault(key, []).append(newest[key].run_id)
        newest[key] = run
    order = {name: i for i, name in enumerate(dict.fromkeys((run.strategy, run.precision) for run in
                                                             sorted(newest.values(), key=lambda r: r.started)))}
    rows: list[Row] = []
    base: RunFigures | None = None
    base_seconds = 0.0
    for key in sorted(newest, key=lambda k: (order[k[0], k[1]], k[2], k[3])):
        run = newest[key]
        seconds = [float(r["seconds"]) for r in run.records]
        train_seconds = run.timed_seconds() or 0.0
        if base is None or (base.strategy, base.precision) != (run.strategy, run.precision):
            base, base_seconds = run, train_seconds
        speedup = base_seconds / train_seconds if train_seconds > 0 else 0.0
        efficiency = speedup / (run.world_size / base.world_size)
        samples = sum(float(r.get("samples", 0)) for r in run.records)
        last = run.records[-1] if run.records else {}
        rows.append(Row(
            world_size=run.world_size,
            nnodes=run.nnodes,
            run_id=run.run_id,
            model=run.model,
            dataset=run.dataset,
            batch_size=run.batch_size,
            global_batch=run.batch_size * run.world_size if run.batch_size else None,
            lr=run.lr,
            epochs=len(run.records),
            steps_per_epoch=last.get("steps"),
            epoch_seconds=statistics.median(seconds) if seconds else None,
            train_seconds=train_seconds,
            speedup=speedup,
            efficiency=efficiency,
            samples_per_s=(samples / train_seconds if train_seconds > 0 else 0.0) if run.records else None,
            train_acc=last.get("train_acc"),
            val_acc=last.get("val_acc"),
            cost_usd=run.cost_usd,
            superseded=tuple(older.get(key, ())),
            strategy=run.strategy,
            threads_per_process=run.threads_per_process,
            not_comparable=_not_comparable(run, base, efficiency),
            precision=run.precision,
            exposed_comm_fraction=run.network.exposed_comm_fraction,
            busbw_gbit_s=run.network.busbw_gbit_s,
            predicted_efficiency=run.network.predicted_efficiency,
            interruptions=run.interruptions,
            **_script_fields(run),
        ))
    return rows


def _script_fields(run: RunFigures) -> dict[str, Any]:
    """A script run's own figures for its row: wall time, when its logged scalars began and ended, their last
    values (all absent for runs that recorded epochs)."""
    scalars = run.script_scalars
    if run.records or (scalars is None and run.wall_seconds is None):
        return {}
    return {
        "wall_seconds": run.wall_seconds,
        "first_step_s": scalars.first_time - run.started if scalars else None,
        "last_step_s": scalars.last_time - run.started if scalars else None,
        "script_scalars": scalars.last_values if scalars else (),
    }


def _not_comparable(run: RunFigures, base: RunFigures, efficiency: float) -> str:
    """Why this run's speed-up over `base` is not a result, or "" when it is."""
    reasons = []
    if efficiency > SUPERLINEAR:
        reasons.append(f"super-linear: {100 * efficiency:.0f}% efficiency")
    if run.busy():
        reasons.append(run.busy())
    elif base is not run and base.busy():
        reasons.append(f"baseline {base.busy()}")
    return "; ".join(reasons)


@dataclass(frozen=True)
class Report:
    """Everything a report shows: the table, the runs behind it and the preset's reference figures."""

    rows: list[Row]
    runs: list[RunFigures]
    preset: str | None
    reference: ReferenceFigures | None
    preset_dataset: str | None
    # The write-up's figures for its other strategies (write-up 5: Hogwild beside parallel SGD).
    extra_references: tuple[ReferenceFigures, ...] = ()


def build_report(paths: list[Path], preset: str | None = None) -> Report:
    """Load the run (or sweep) directories; the preset comes from `preset`, else from a sweep's manifest."""
    from launcher.spec.presets import get_preset

    run_paths, manifest = expand_report_dirs(paths)
    if not run_paths:
        raise RunDirError(f"no finished runs in {', '.join(map(str, paths))}: nothing to report")
    runs: list[RunFigures] = []
    for run_path in run_paths:
        try:
            runs.append(load_run(run_path))
        except UnmeasuredWorld as e:
            if len(run_paths) == 1:
                raise
            print(f"warning: {e}: left out of the report", file=sys.stderr)
    if not runs:
        raise RunDirError(f"no run in {', '.join(map(str, paths))} has a measured world size: nothing to report")
    name = preset or (manifest or {}).get("preset")
    chosen = get_preset(name) if name else None
    return Report(scaling_table(runs), runs, name, chosen.reference if chosen else None,
                  chosen.spec_fields.get("dataset") if chosen else None,
                  chosen.extra_references if chosen else ())


