"""The report's PNG plots, drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no
global state), imported only when a report is written."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.results.run_figures import Row, RunFigures
from launcher.results.user_files import REPORT_FILE, REPORT_FIX, write_user_file
from launcher.spec.presets import ReferenceFigures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Every plot is 8 x 5 inches at 100 dpi: 800 x 500 pixels.
FIG_SIZE_IN = (8.0, 5.0)
DPI = 100
PLOT_FILES = ("scaling.png", "accuracy.png", "curves.png")


def _figure(ncols: int = 1) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIG_SIZE_IN, dpi=DPI)
    axes = fig.subplots(1, ncols)
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    # Drawn into memory, then written beside and renamed: a report directory never holds half a PNG; what is
    # there must be a regular file, or nothing (launcher/spec/user_paths.py).
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    write_user_file(path, buffer.getvalue(), REPORT_FILE, fix=REPORT_FIX)
    return path


def _legend(ax: Any) -> None:
    """The legend, when something was drawn (a script run without epoch records draws no curve)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _by_strategy(rows: list[Row]) -> dict[str, list[Row]]:
    lines: dict[str, list[Row]] = {}
    for row in rows:
        lines.setdefault(row.strategy_label, []).append(row)
    return lines


def plot_scaling(rows: list[Row], path: Path, references: tuple[ReferenceFigures, ...] = ()) -> Path:
    """Training time (left) and speed-up (right) against process count, one line per strategy; rows that are
    not comparable are hollow markers, left out of the speed-up; the write-up's minutes on a second axis."""
    fig, (ax_time, ax_speed) = _figure(2)
    sizes = sorted({r.world_size for r in rows})
    colors: dict[str, str] = {}
    for strategy, line in _by_strategy(rows).items():
        drawn = ax_time.plot([r.world_size for r in line], [r.train_seconds for r in line], "o-", label=strategy)
        color = colors[strategy] = drawn[0].get_color()
        flagged = [r for r in line if r.not_comparable]
        if flagged:
            ax_time.plot([r.world_size for r in flagged], [r.train_seconds for r in flagged], "o", color=color,
                         markerfacecolor="white", markersize=9)
        kept = [r for r in line if not r.not_comparable]
        ax_speed.plot([r.world_size for r in kept], [r.speedup for r in kept], "o-", color=color, label=strategy)
    minutes = [ref for ref in references if ref.train_minutes]
    if minutes:
        ax_ref = ax_time.twinx()
        for ref in minutes:
            points = sorted(ref.train_minutes.items())
            ax_ref.plot([p[0] for p in points], [p[1] for p in points], "x:", color=colors.get(ref.strategy, "gray"),
                        markersize=10, label=f"write-up {ref.strategy} (min)")
        ax_ref.set_ylabel("write-up's training time (min, crosses)")
        ax_ref.legend(loc="lower left", fontsize="small")
    base = min(sizes)
    ax_speed.plot(sizes, [ws / base for ws in sizes], "--", color="gray", label="ideal (linear)")
    for ax in (ax_time, ax_speed):
        ax.set_xticks(sizes)
        ax.set_xlabel("processes (world size)")
    ax_time.set_title("Training time (hollow: not comparable)", fontsize="medium")
    ax_time.set_ylabel("training time (s)")
    ax_time.legend(loc="upper left", fontsize="small")
    ax_speed.set_title("Speed-up over each strategy's smallest run", fontsize="medium")
    ax_speed.set_ylabel("speed-up (x)")
    _legend(ax_speed)
    fig.suptitle("Time against process count, one line per strategy")
    return _save(fig, path)


def plot_accuracy(rows: list[Row], path: Path, references: tuple[ReferenceFigures, ...] = ()) -> Path:
    """Final validation (solid) and train (dashed) accuracy against process count, one line per strategy, with
    the write-up's accuracies as crosses."""
    fig, ax = _figure()
    for strategy, line in _by_strategy(rows).items():
        color = None
        for attr, label, style in (("val_acc", "validation", "o-"), ("train_acc", "train", "s--")):
            points = [(r.world_size, 100 * getattr(r, attr)) for r in line if getattr(r, attr) is not None]
            if points:
                drawn = ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color,
                                label=f"{strategy} {label}")
                color = drawn[0].get_color()
    for ref in references:
        for figures, label in ((ref.val_acc, "validation"), (ref.train_acc, "train")):
            if figures:
                points = sorted(figures.items())
                ax.plot([p[0] for p in points], [100 * p[1] for p in points], "x", color="gray", markersize=10,
                        label=f"write-up {ref.strategy} {label}")
    ax.set_xticks(sorted({r.world_size for r in rows}))
    ax.set_title("Final accuracy against process count")
    ax.set_xlabel("processes (world size)")
    ax.set_ylabel("accuracy (%)")
    _legend(ax)
    return _save(fig, path)


def plot_curves(runs: list[RunFigures], path: Path) -> Path:
    """Per-epoch loss (left) and validation accuracy (right), one line per run."""
    fig, (ax_loss, ax_acc) = _figure(2)
    for run in sorted(runs, key=lambda r: (r.strategy, r.world_size, r.nnodes)):
        epochs = [r["epoch"] for r in run.records]
        label = f"{run.strategy}, world size {run.world_size} ({run.nnodes} node{'s' if run.nnodes > 1 else ''})"
        line = ax_loss.plot(epochs, [r.get("train_loss") for r in run.records], "o-", label=label)
        color = line[0].get_color()
        ax_loss.plot(epochs, [r.get("val_loss") for r in run.records], "s--", color=color)
        ax_acc.plot(epochs, [100 * (r.get("train_acc") or 0.0) for r in run.records], "o-", color=color,
                    label=label)
        ax_acc.plot(epochs, [100 * (r.get("val_acc") or 0.0) for r in run.records], "s--", color=color)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_loss.set_title("Loss (solid: train, dashed: validation)", fontsize="medium")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss (cross-entropy)")
    _legend(ax_loss)
    ax_acc.set_title("Accuracy (solid: train, dashed: validation)", fontsize="medium")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy (%)")
    _legend(ax_acc)
    fig.suptitle("Training curves by world size")
    return _save(fig, path)


def write_plots(rows: list[Row], runs: list[RunFigures], out_dir: Path,
                references: tuple[ReferenceFigures, ...] = ()) -> list[Path]:
    """Write the three PNGs into out_dir and return their paths (curves only for the runs in the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shown = {row.run_id for row in rows}
    return [
        plot_scaling(rows, out_dir / PLOT_FILES[0], references),
        plot_accuracy(rows, out_dir / PLOT_FILES[1], references),
        plot_curves([r for r in runs if r.run_id in shown and r.records], out_dir / PLOT_FILES[2]),
    ]
