"""Scaling reports: run directories -> figures per world size -> terminal table, Markdown and JSON.

Reads only the files of the run-directory contract (docs/contracts.md): timing.jsonl, summary.json and, when
present, run.json. Compose runs (no run.json) and runs pulled from hosts (nodes/<k>/) read the same way.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.errors import RunDirError
from launcher.results.rundir import RUN_FILE, primary_node_out, read_json, read_jsonl
from launcher.spec.presets import ReferenceFigures

TIMING_FILE = "timing.jsonl"
SUMMARY_FILE = "summary.json"
SWEEP_FILE = "sweep.json"


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
    epoch_seconds: float  # median of the per-epoch training times
    train_seconds: float  # sum of the per-epoch training times (validation excluded)
    speedup: float
    efficiency: float
    samples_per_s: float
    train_acc: float | None
    val_acc: float | None
    cost_usd: float | None
    superseded: tuple[str, ...] = ()  # older runs of the same layout left out of the table

    @property
    def layout(self) -> str:
        return f"{self.nnodes}x{self.world_size // self.nnodes}"


def find_result_file(path: Path, name: str) -> Path | None:
    """`name` at the top of a run directory, else among the pulled files of the node that held global rank 0;
    None when absent."""
    if (path / name).is_file():
        return path / name
    nodes = sum(1 for p in (path / "nodes").glob("*") if p.name.isdigit())
    primary = primary_node_out(path, nodes)
    return primary / name if primary is not None and (primary / name).is_file() else None


def epoch_records(timing: Path | None) -> tuple[dict[str, Any], ...]:
    """The timing records, one per finished epoch in order."""
    # After a restart an epoch may be recorded twice; the later record is the one that counted.
    by_epoch: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(timing) if timing else []:
        if isinstance(record, dict) and isinstance(record.get("epoch"), int) and "seconds" in record:
            by_epoch[record["epoch"]] = record
    return tuple(by_epoch[e] for e in sorted(by_epoch))


def _cost(*sources: dict[str, Any]) -> float | None:
    for source in sources:
        value = source.get("cost_usd")
        if isinstance(value, int | float):
            return float(value)
    return None


def load_run(path: Path) -> RunFigures:
    """Read one run directory; RunDirError naming it when it is not a run or has no finished epoch."""
    if not path.is_dir():
        raise RunDirError(f"{path} is not a directory: give run directories (or a sweep directory) to report")
    run = read_json(path / RUN_FILE) or {}
    summary_path = find_result_file(path, SUMMARY_FILE)
    summary = (read_json(summary_path) if summary_path else None) or {}
    timing = find_result_file(path, TIMING_FILE)
    if not run and not summary and timing is None:
        raise RunDirError(f"{path} is not a run directory (no {RUN_FILE}, {TIMING_FILE} or {SUMMARY_FILE})")
    records = epoch_records(timing)
    if not records:
        raise RunDirError(f"run {path} has no finished epoch in {TIMING_FILE}: nothing to report for it")
    spec: dict[str, Any] = run["spec"] if isinstance(run.get("spec"), dict) else {}
    last = records[-1]
    world_size = int(last.get("world_size") or summary.get("world_size") or
                     int(spec.get("nnodes", 1)) * int(spec.get("nproc_per_node", 1)))
    started = run.get("created") or records[0].get("time") or path.stat().st_mtime
    return RunFigures(
        path=path,
        run_id=str(run.get("run_id") or path.name),
        world_size=world_size,
        nnodes=int(summary.get("nnodes") or spec.get("nnodes") or 1),
        model=str(summary.get("model") or spec.get("model") or "?"),
        dataset=str(summary.get("dataset") or spec.get("dataset") or "?"),
        batch_size=summary.get("batch_size") or spec.get("batch_size"),
        lr=summary.get("lr") or spec.get("lr"),
        epochs_planned=last.get("epochs") or summary.get("epochs") or spec.get("epochs"),
        records=records,
        cost_usd=_cost(run, summary),
        started=float(started),
    )


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
    """One row per layout (newest run of it kept), ordered by world size; speed-up over the first row."""
    newest: dict[tuple[int, int], RunFigures] = {}
    older: dict[tuple[int, int], list[str]] = {}
    for run in sorted(runs, key=lambda r: r.started):
        key = (run.world_size, run.nnodes)
        if key in newest:
            older.setdefault(key, []).append(newest[key].run_id)
        newest[key] = run
    rows: list[Row] = []
    base_seconds = base_ws = 0.0
    for key in sorted(newest):
        run = newest[key]
        seconds = [float(r["seconds"]) for r in run.records]
        train_seconds = sum(seconds)
        if not rows:
            base_seconds, base_ws = train_seconds, float(run.world_size)
        speedup = base_seconds / train_seconds if train_seconds > 0 else 0.0
        samples = sum(float(r.get("samples", 0)) for r in run.records)
        last = run.records[-1]
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
            epoch_seconds=statistics.median(seconds),
            train_seconds=train_seconds,
            speedup=speedup,
            efficiency=speedup / (run.world_size / base_ws),
            samples_per_s=samples / train_seconds if train_seconds > 0 else 0.0,
            train_acc=last.get("train_acc"),
            val_acc=last.get("val_acc"),
            cost_usd=run.cost_usd,
            superseded=tuple(older.get(key, ())),
        ))
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = ("layout", "world", "global batch", "lr", "steps/epoch", "epoch time (s, median)",
           "training time (s)", "speed-up", "efficiency", "samples/s", "train acc", "val acc", "cost (USD)")


def row_cells(row: Row) -> list[str]:
    """A row as the strings every rendering shows."""
    return [
        row.layout, str(row.world_size), _num(row.global_batch, "d"), _num(row.lr, "g"),
        _num(row.steps_per_epoch, "d"), f"{row.epoch_seconds:.2f}", f"{row.train_seconds:.2f}",
        f"{row.speedup:.2f}x", f"{100 * row.efficiency:.0f}%", f"{row.samples_per_s:.1f}",
        _pct(row.train_acc), _pct(row.val_acc), _num(row.cost_usd, ".2f"),
    ]


# Short two-line headers so the table fits an 80-column terminal; same order as COLUMNS.
_TERMINAL_HEADERS = ("layout", "world\nsize", "global\nbatch", "lr", "steps\n/epoch", "epoch s\nmedian",
                     "train\ns", "speed-\nup", "effi-\nciency", "samples\n/s", "train\nacc", "val\nacc", "cost\nUSD")


def render_terminal(rows: list[Row]) -> Any:
    """A rich Table of the rows; lr and cost are left out when they say nothing (one lr, nothing rented)."""
    from rich.table import Table

    cells = [row_cells(row) for row in rows]
    drop = set()
    lrs = {c[3] for c in cells}
    if len(lrs) == 1:
        drop.add(3)
    if all(c[12] == "-" for c in cells):
        drop.add(12)
    title = f"Scaling: {_what_ran(rows)}" + (f", lr {lrs.pop()}" if 3 in drop else "")
    table = Table(title=title, box=None, padding=(0, 0, 0, 1), pad_edge=False, header_style="bold")
    keep = [i for i in range(len(COLUMNS)) if i not in drop]
    for i in keep:
        table.add_column(_TERMINAL_HEADERS[i], justify="left" if i == 0 else "right", no_wrap=True)
    for line in cells:
        table.add_row(*(line[i] for i in keep))
    return table


def _what_ran(rows: list[Row]) -> str:
    models = sorted({r.model for r in rows})
    datasets = sorted({r.dataset for r in rows})
    batches = sorted({r.batch_size for r in rows if r.batch_size})
    text = f"model {', '.join(models)} on data set {', '.join(datasets)}"
    return text + (f", batch {', '.join(map(str, batches))} per process" if batches else "")


def render_json(rows: list[Row], reference: ReferenceFigures | None = None,
                plots: list[Path] | None = None) -> dict[str, Any]:
    """The report's figures for scripts: rows (raw numbers, accuracies as fractions), reference, plot files."""
    out_rows = []
    for row in rows:
        data = asdict(row)
        data["layout"] = row.layout
        data["superseded"] = list(row.superseded)
        out_rows.append(data)
    return {
        "rows": out_rows,
        "baseline_world_size": rows[0].world_size if rows else None,
        "reference": reference.to_json() if reference else None,
        "plots": [p.name for p in plots or []],
    }


def dump_json(rows: list[Row], reference: ReferenceFigures | None = None, plots: list[Path] | None = None) -> str:
    return json.dumps(render_json(rows, reference, plots), indent=2, sort_keys=True)


def _md_table(header: list[str], lines: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out


def _by_world_size(rows: list[Row]) -> dict[int, Row]:
    # Where two layouts share a world size, the one on fewer nodes stands for it (rows are in that order).
    chosen: dict[int, Row] = {}
    for row in rows:
        chosen.setdefault(row.world_size, row)
    return chosen


def _reference_section(rows: list[Row], ref: ReferenceFigures) -> list[str]:
    ours = _by_world_size(rows)
    base = rows[0]
    lines = ["## Beside the reference", "",
             f"reference: {ref.source}, on {ref.hardware}. Columns marked (reference) are the write-up's own "
             "figures on its hardware; the others are this report's runs.", ""]
    header = ["world size", "steps/epoch", "steps/epoch (reference)", "time vs smallest",
              "time vs smallest (reference)", "train acc", "train acc (reference)", "val acc",
              "val acc (reference)", "val acc drop (points)", "acc drop (points, reference)"]
    cells = []
    for ws in sorted(set(ours) | set(ref.world_sizes())):
        row = ours.get(ws)
        drop = (100 * (base.val_acc - row.val_acc) if row and row.val_acc is not None
                and base.val_acc is not None else None)
        cells.append([
            str(ws),
            _num(row.steps_per_epoch if row else None, "d"), _num(ref.steps_per_epoch.get(ws), "d"),
            _num(1 / row.speedup if row and row.speedup else None, ".2f"), _num(ref.time_ratio.get(ws), ".2f"),
            _pct(row.train_acc if row else None), _pct(ref.train_acc.get(ws)),
            _pct(row.val_acc if row else None), _pct(ref.val_acc.get(ws)),
            _num(drop, ".1f"), _num(ref.acc_drop_points.get(ws), ".1f"),
        ])
    lines += _md_table(header, cells)
    if ref.train_minutes:
        minutes = ", ".join(f"{m} min on {ws}" for ws, m in sorted(ref.train_minutes.items()))
        lines += ["", f"reference training time: {minutes}."]
    lines += [""] + [f"- reference: {note}" for note in ref.notes]
    return lines


def _accuracy_section(rows: list[Row]) -> list[str]:
    base, last = rows[0], rows[-1]
    text = [
        "## Why accuracy drops at larger world sizes", "",
        "Each of the W processes trains on its own 1/W share of the data with the same per-process batch B, "
        "and DDP averages their gradients, so one optimizer step now stands for B x W samples (the global "
        "batch) and an epoch has about 1/W as many steps. With the same learning rate the model takes W times "
        "fewer steps of the same size per epoch, so after a fixed number of epochs it has moved less far: "
        "accuracy falls, as in the reference's 4-GPU run. Scaling the learning rate with the global batch "
        "wins much of it back: `ddpctl sweep --scale-lr linear` multiplies lr by W / W_smallest, "
        "`--scale-lr sqrt` by its square root (gentler, safer without a warm-up).",
    ]
    if len(rows) > 1:
        steps = (f"{base.steps_per_epoch} steps per epoch at world size {base.world_size} against "
                 f"{last.steps_per_epoch} at {last.world_size}" if base.steps_per_epoch and last.steps_per_epoch
                 else "")
        lrs = sorted({r.lr for r in rows if r.lr is not None})
        lr_text = ("the learning rate was scaled: " + ", ".join(f"{r.lr:g} at {r.world_size}" for r in rows)
                   if len(lrs) > 1 else f"the same learning rate {lrs[0]:g} everywhere" if lrs else "")
        drop = (f"validation accuracy {_pct(last.val_acc)} at world size {last.world_size} against "
                f"{_pct(base.val_acc)} at {base.world_size}" if last.val_acc is not None
                and base.val_acc is not None else "")
        facts = "; ".join(part for part in (steps, lr_text, drop) if part)
        if facts:
            text += ["", f"In these runs: {facts}."]
    return text


def render_markdown(rows: list[Row], reference: ReferenceFigures | None = None,
                    plots: list[Path] | None = None, preset: str | None = None,
                    preset_dataset: str | None = None) -> str:
    """The whole report as Markdown: what ran, the table, the reference beside it, the accuracy note, plots."""
    if not rows:
        raise RunDirError("no finished runs to report on")
    lines = ["# Scaling report", "", f"What ran: {_what_ran(rows)}"
             + (f" (preset {preset})" if preset else "") + "."]
    datasets = {r.dataset for r in rows}
    if preset_dataset and datasets != {preset_dataset}:
        lines += ["", f"Note: these runs used data set {', '.join(sorted(datasets))}, not the preset's "
                      f"{preset_dataset}: compare times and steps with the reference, not accuracies."]
    lines += ["", f"Speed-up and efficiency are against layout {rows[0].layout} (world size "
                  f"{rows[0].world_size}); times are training only (validation excluded); efficiency = speed-up "
                  "/ (world size / smallest world size). Layout = nodes x processes per node.", ""]
    lines += _md_table(list(COLUMNS), [row_cells(r) for r in rows])
    lines += ["", "Runs: " + ", ".join(f"`{r.run_id}` ({r.layout})" for r in rows) + "."]
    superseded = [f"`{old}`" for r in rows for old in r.superseded]
    if superseded:
        lines += ["", "Older runs of a layout already in the table were left out (the newest is shown): "
                  + ", ".join(superseded) + "."]
    if reference:
        lines += [""] + _reference_section(rows, reference)
    lines += [""] + _accuracy_section(rows)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Report:
    """Everything a report shows: the table, the runs behind it and the preset's reference figures."""

    rows: list[Row]
    runs: list[RunFigures]
    preset: str | None
    reference: ReferenceFigures | None
    preset_dataset: str | None


def build_report(paths: list[Path], preset: str | None = None) -> Report:
    """Load the run (or sweep) directories; the preset comes from `preset`, else from a sweep's manifest."""
    from launcher.spec.presets import get_preset

    run_paths, manifest = expand_report_dirs(paths)
    if not run_paths:
        raise RunDirError(f"no finished runs in {', '.join(map(str, paths))}: nothing to report")
    runs = [load_run(p) for p in run_paths]
    name = preset or (manifest or {}).get("preset")
    chosen = get_preset(name) if name else None
    return Report(scaling_table(runs), runs, name, chosen.reference if chosen else None,
                  chosen.spec_fields.get("dataset") if chosen else None)


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write report.md, report.json and the PNG plots into out_dir; return the files written."""
    from launcher.results.plots import write_plots
    from launcher.results.rundir import write_json_atomic

    if out_dir.exists() and not out_dir.is_dir():
        raise RunDirError(f"cannot write the report: {out_dir} is a file, not a directory; give a directory "
                          "with --out (it is created if missing)")
    try:
        plots = write_plots(report.rows, report.runs, out_dir)
        markdown = render_markdown(report.rows, report.reference, plots, report.preset, report.preset_dataset)
        md_path = out_dir / "report.md"
        tmp = out_dir / ".report.md.tmp"
        tmp.write_text(markdown)
        tmp.replace(md_path)
        json_path = out_dir / "report.json"
        write_json_atomic(json_path, render_json(report.rows, report.reference, plots))
    except OSError as e:
        where = e.filename or out_dir
        raise RunDirError(f"cannot write the report to {out_dir} ({where}: {e.strerror or e}); give a directory "
                          "you can write to with --out") from None
    return [md_path, json_path, *plots]
