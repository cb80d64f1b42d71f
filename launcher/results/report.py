"""Scaling reports written out: the rows of launcher.results.run_figures as a terminal table, Markdown, JSON
and plots (launcher.results.plots)."""

from __future__ import annotations

import json
import stat
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launcher.errors import RunDirError
from launcher.results.interruptions import interruption_line
from launcher.results.network_share import network_section
from launcher.results.run_figures import Report, Row
from launcher.spec.presets import ReferenceFigures
from launcher.spec.user_paths import file_target, kind_of


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = ("layout", "strategy", "world", "threads/process", "global batch", "lr", "steps/epoch",
           "epoch time (s, median)", "training time (s)", "speed-up", "efficiency", "exposed comm", "samples/s",
           "train acc", "val acc", "comparable", "cost (USD)")
NOT_COMPARABLE = "n/c"
_LR, _STRATEGY, _THREADS, _COMPARABLE, _COST, _EXPOSED = (
    COLUMNS.index(c) for c in ("lr", "strategy", "threads/process", "comparable", "cost (USD)", "exposed comm"))


def row_cells(row: Row) -> list[str]:
    """A row as the strings every rendering shows; a speed-up that is not a result shows as n/c."""
    flagged = bool(row.not_comparable)
    return [
        row.layout, row.strategy_label, str(row.world_size), _num(row.threads_per_process, "d"),
        _num(row.global_batch, "d"), _num(row.lr, "g"),
        _num(row.steps_per_epoch, "d"), _num(row.epoch_seconds, ".2f"), f"{row.train_seconds:.2f}",
        NOT_COMPARABLE if flagged else f"{row.speedup:.2f}x",
        NOT_COMPARABLE if flagged else f"{100 * row.efficiency:.0f}%",
        "-" if row.exposed_comm_fraction is None else f"{100 * row.exposed_comm_fraction:.0f}%",
        _num(row.samples_per_s, ".1f"),
        _pct(row.train_acc), _pct(row.val_acc), f"not comparable: {row.not_comparable}" if flagged else "yes",
        _num(row.cost_usd, ".2f"),
    ]


# Short two-line headers so the table fits an 80-column terminal; same order as COLUMNS.
_TERMINAL_HEADERS = ("layout", "strat-\negy", "world\nsize", "thr-\neads", "global\nbatch", "lr", "steps\n/epoch",
                     "epoch s\nmedian", "train\ns", "speed-\nup", "effi-\nciency", "exposed\ncomm", "samples\n/s",
                     "train\nacc", "val\nacc", "compa-\nrable", "cost\nUSD")


def render_terminal(rows: list[Row]) -> Any:
    """A rich Table of the rows; lr, strategy, threads, comparable and cost are left out when they say nothing
    (one lr, only ddp, no threads recorded, every row comparable, nothing rented)."""
    from rich.table import Table

    cells = [row_cells(row) for row in rows]
    for line in cells:  # the reasons are in report.md; a terminal column has room for the verdict
        line[_COMPARABLE] = "yes" if line[_COMPARABLE] == "yes" else "no"
    drop = set()
    lrs = {c[_LR] for c in cells}
    if len(lrs) == 1:
        drop.add(_LR)
    for index, says_nothing in ((_STRATEGY, "ddp"), (_THREADS, "-"), (_COMPARABLE, "yes"), (_COST, "-"),
                                    (_EXPOSED, "-")):
        if all(c[index] == says_nothing for c in cells):
            drop.add(index)
    title = f"Scaling: {_what_ran(rows)}" + (f", lr {lrs.pop()}" if _LR in drop else "")
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


def _rows_for(rows: list[Row], ref: ReferenceFigures) -> tuple[list[Row], str]:
    """Our rows to set beside `ref`: those of its strategy (a table of one strategy stands for any), with ddp's
    1-process run where local-sgd has none (one process of parallel SGD is plain SGD). Also a note on the choice."""
    strategies = {r.strategy for r in rows}
    chosen = [r for r in rows if r.strategy == ref.strategy]
    note = ""
    if not chosen and len(strategies) == 1:
        chosen = list(rows)
        note = f"ours ran {rows[0].strategy}, the write-up {ref.strategy}."
    if ref.strategy == "local-sgd" and chosen and min(r.world_size for r in chosen) > 1:
        single = [r for r in rows if r.strategy == "ddp" and r.world_size == 1]
        if single:
            chosen = single + chosen
            note = "our 1-process figures are ddp's (one process of parallel SGD is plain SGD)."
    return chosen, note


def _reference_section(rows: list[Row], ref: ReferenceFigures) -> list[str]:
    chosen, note = _rows_for(rows, ref)
    lines = [f"## Beside the reference ({ref.strategy})", "",
             f"reference: {ref.source}, on {ref.hardware}. Columns marked (reference) are the write-up's own "
             "figures on its hardware; the others are this report's runs." + (f" Note: {note}" if note else ""), ""]
    if not chosen:
        return lines + [f"No run of strategy {ref.strategy} here to set beside it."]
    ours = _by_world_size(chosen)
    base = chosen[0]
    header = ["world size", "steps/epoch", "steps/epoch (reference)", "training min", "training min (reference)",
              "time vs smallest", "time vs smallest (reference)", "train acc", "train acc (reference)", "val acc",
              "val acc (reference)", "val acc drop (points)", "acc drop (points, reference)", "comparable"]
    cells = []
    for ws in sorted(set(ours) | set(ref.world_sizes())):
        row = ours.get(ws)
        drop = (100 * (base.val_acc - row.val_acc) if row and row.val_acc is not None
                and base.val_acc is not None else None)
        ratio = row.train_seconds / base.train_seconds if row and base.train_seconds > 0 else None
        cells.append([
            str(ws),
            _num(row.steps_per_epoch if row else None, "d"), _num(ref.steps_per_epoch.get(ws), "d"),
            _num(row.train_seconds / 60 if row else None, ".2f"), _num(ref.train_minutes.get(ws), "g"),
            _num(ratio, ".2f"), _num(ref.time_ratio.get(ws), ".2f"),
            _pct(row.train_acc if row else None), _pct(ref.train_acc.get(ws)),
            _pct(row.val_acc if row else None), _pct(ref.val_acc.get(ws)),
            _num(drop, ".1f"), _num(ref.acc_drop_points.get(ws), ".1f"),
            "-" if row is None else ("no" if row.not_comparable else "yes"),
        ])
    lines += _md_table(header, cells)
    if ref.train_minutes:
        minutes = ", ".join(f"{m} min on {ws}" for ws, m in sorted(ref.train_minutes.items()))
        lines += ["", f"reference training time: {minutes}."]
    lines += [""] + [f"- reference: {note}" for note in ref.notes]
    return lines


def _comparability_section(rows: list[Row]) -> list[str]:
    flagged = [r for r in rows if r.not_comparable]
    return ["## Not comparable", "",
            "These rows' speed-up and efficiency are shown as n/c, not as results: a scaling efficiency above "
            "105% means the baseline was slowed (other work, or too few threads), not that more processes did "
            "more than their share, and a run taken while other work used the machine's cores measured that "
            "work too. Rerun them on an idle machine (threads per process are recorded in each row).", ""]  \
        + [f"- {r.strategy} {r.layout} (`{r.run_id}`): {r.not_comparable}; measured speed-up {r.speedup:.2f}x, "
           f"efficiency {100 * r.efficiency:.0f}%" for r in flagged]


def script_lines(rows: list[Row]) -> list[str]:
    """One line per row of a script that recorded no epochs: what its time column measured and what it logged."""
    lines = []
    for r in rows:
        if r.wall_seconds is None and not r.script_scalars:
            continue
        seen = (f"first logged scalar {r.first_step_s:.1f} s after the launch, last {r.last_step_s:.1f} s; its "
                "training time is the span between them" if r.first_step_s is not None and r.last_step_s is not None
                else "no step seen (no TensorBoard scalar logged): its training time is the wall time")
        scalars = ", ".join(f"{tag} {value:.4g}" for tag, value in r.script_scalars)
        lines.append(f"{r.layout} (`{r.run_id}`): {r.world_size} process(es) measured, wall time "
                     f"{_num(r.wall_seconds, '.1f')} s; {seen}" + (f"; last values: {scalars}" if scalars else ""))
    return lines


def _accuracy_section(rows: list[Row]) -> list[str]:
    rows = [r for r in rows if r.strategy == rows[0].strategy]
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
                    preset_dataset: str | None = None, extra_references: tuple[ReferenceFigures, ...] = ()) -> str:
    """The whole report as Markdown: what ran, the table, the reference beside it, the accuracy note, plots."""
    if not rows:
        raise RunDirError("no finished runs to report on")
    lines = ["# Scaling report", "", f"What ran: {_what_ran(rows)}"
             + (f" (preset {preset})" if preset else "") + "."]
    datasets = {r.dataset for r in rows}
    if preset_dataset and datasets != {preset_dataset}:
        lines += ["", f"Note: these runs used data set {', '.join(sorted(datasets))}, not the preset's "
                      f"{preset_dataset}: compare times and steps with the reference, not accuracies."]
    lines += ["", f"Speed-up and efficiency are against each strategy's first row (here {rows[0].strategy} "
                  f"{rows[0].layout}, world size {rows[0].world_size}); times are training only (validation "
                  "excluded); efficiency = speed-up "
                  "/ (world size / smallest world size). Layout = nodes x processes per node. Exposed comm: "
                  "the share of a step spent waiting on the gradients' all-reduce that computation did not hide "
                  "(timed with and without DDP's sync after training; - where nothing was synced).", ""]
    lines += _md_table(list(COLUMNS), [row_cells(r) for r in rows])
    lines += ["", "Runs: " + ", ".join(f"`{r.run_id}` ({r.strategy} {r.layout})" for r in rows) + "."]
    superseded = [f"`{old}`" for r in rows for old in r.superseded]
    if superseded:
        lines += ["", "Older runs of a layout already in the table were left out (the newest is shown): "
                  + ", ".join(superseded) + "."]
    interrupted = [f"- `{r.run_id}` {interruption_line(entry)}" for r in rows for entry in r.interruptions]
    if interrupted:  # one run each, over the sets of machines the market left it (--interruptible)
        lines += ["", "## Interruptions", ""] + interrupted
    scripts = script_lines(rows)
    if scripts:
        lines += ["", "## Scripts without epoch records", ""] + [f"- {line}" for line in scripts]
    if any(r.not_comparable for r in rows):
        lines += [""] + _comparability_section(rows)
    for ref in ([reference] if reference else []) + list(extra_references):
        lines += [""] + _reference_section(rows, ref)
    network = network_section(rows)
    if network:
        lines += [""] + network
    lines += [""] + _accuracy_section(rows)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write report.md, report.json and the PNG plots into out_dir; return the files written."""
    from launcher.results.plots import PLOT_FILES, write_plots
    from launcher.results.user_files import REPORT_FILE, REPORT_FIX, write_user_file

    if out_dir.exists() and not out_dir.is_dir():  # a link to a directory is followed
        mode = out_dir.stat().st_mode
        raise RunDirError(f"cannot write the report: {out_dir} is {'a file' if stat.S_ISREG(mode) else kind_of(mode)}"
                          ", not a directory; give a directory with --out (it is created if missing)")
    md_path, json_path = out_dir / "report.md", out_dir / "report.json"
    for path in (md_path, json_path, *(out_dir / name for name in PLOT_FILES)):  # refused before anything is written
        file_target(path, REPORT_FILE, fix=REPORT_FIX)
    try:
        references = ((report.reference,) if report.reference else ()) + report.extra_references
        plots = write_plots(report.rows, report.runs, out_dir, references)
        markdown = render_markdown(report.rows, report.reference, plots, report.preset, report.preset_dataset,
                                   report.extra_references)
        write_user_file(md_path, markdown.encode(), REPORT_FILE, fix=REPORT_FIX)
        text = json.dumps(render_json(report.rows, report.reference, plots), indent=2, sort_keys=True) + "\n"
        write_user_file(json_path, text.encode(), REPORT_FILE, fix=REPORT_FIX)
    except OSError as e:
        where = e.filename or out_dir
        raise RunDirError(f"cannot write the report to {out_dir} ({where}: {e.strerror or e}); give a directory "
                          "you can write to with --out") from None
    return [md_path, json_path, *plots]
