"""The report's PNG plots, drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no
global state), imported only when a report is written."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.results.run_figures import Row, RunFigures

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
    # Written beside, then renamed: a report directory never holds half a PNG.
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=DPI)
    tmp.replace(path)
    return path


def _labels(rows: list[Row]) -> list[str]:
    return [f"{r.world_size}\n({r.layout})" for r in rows]


def plot_scaling(rows: list[Row], path: Path) -> Path:
    """Training time per world size (bars) and speed-up against the ideal line."""
    fig, (ax_time, ax_speed) = _figure(2)
    x = list(range(len(rows)))
    ax_time.bar(x, [r.train_seconds for r in rows], color="tab:blue", label="training time")
    ax_time.set_xticks(x, _labels(rows))
    ax_time.set_title("Training time")
    ax_time.set_xlabel("world size (processes)")
    ax_time.set_ylabel("training time (s)")
    ax_time.legend()
    sizes = [r.world_size for r in rows]
    base = sizes[0]
    ax_speed.plot(sizes, [ws / base for ws in sizes], "--", color="gray", label="ideal (linear)")
    ax_speed.plot(sizes, [r.speedup for r in rows], "o-", color="tab:orange", label="measured")
    ax_speed.set_xticks(sorted(set(sizes)))
    ax_speed.set_title(f"Speed-up over world size {base}")
    ax_speed.set_xlabel("world size (processes)")
    ax_speed.set_ylabel("speed-up (x)")
    ax_speed.legend()
    fig.suptitle("Scaling: time and speed-up")
    return _save(fig, path)


def plot_accuracy(rows: list[Row], path: Path) -> Path:
    """Final train and validation accuracy per world size."""
    fig, ax = _figure()
    sizes = [r.world_size for r in rows]
    for attr, label, style in (("train_acc", "train", "o-"), ("val_acc", "validation", "s-")):
        points = [(ws, 100 * getattr(r, attr)) for ws, r in zip(sizes, rows, strict=True)
                  if getattr(r, attr) is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    ax.set_xticks(sorted(set(sizes)))
    ax.set_title("Final accuracy by world size")
    ax.set_xlabel("world size (processes)")
    ax.set_ylabel("accuracy (%)")
    ax.legend()
    return _save(fig, path)


def plot_curves(runs: list[RunFigures], path: Path) -> Path:
    """Per-epoch loss (left) and validation accuracy (right), one line per run."""
    fig, (ax_loss, ax_acc) = _figure(2)
    for run in sorted(runs, key=lambda r: (r.world_size, r.nnodes)):
        epochs = [r["epoch"] for r in run.records]
        label = f"world size {run.world_size} ({run.nnodes} node{'s' if run.nnodes > 1 else ''})"
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
    ax_loss.legend(fontsize="small")
    ax_acc.set_title("Accuracy (solid: train, dashed: validation)", fontsize="medium")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy (%)")
    ax_acc.legend(fontsize="small")
    fig.suptitle("Training curves by world size")
    return _save(fig, path)


def write_plots(rows: list[Row], runs: list[RunFigures], out_dir: Path) -> list[Path]:
    """Write the three PNGs into out_dir and return their paths (curves only for the runs in the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shown = {row.run_id for row in rows}
    return [
        plot_scaling(rows, out_dir / PLOT_FILES[0]),
        plot_accuracy(rows, out_dir / PLOT_FILES[1]),
        plot_curves([r for r in runs if r.run_id in shown], out_dir / PLOT_FILES[2]),
    ]
