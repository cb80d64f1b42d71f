"""What a `-- CMD` script logged for its own tools, found among the files that came back: TensorBoard event files
(read with TensorBoard's own EventAccumulator, when the `tensorboard` package is installed) and W&B offline run
folders. A report row takes from them when the script's steps were seen (the scalars' first and last wall times)
and the last value of each scalar; the run's outcome names them."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

EVENT_FILE_GLOB = "events.out.tfevents.*"
WANDB_OFFLINE_GLOB = "offline-run-*"
# Folders of a run directory where a script's files come back (launcher/transport/outputs.py): its output folder
# and its working directory's new files, at the top (rank 0's node) and per node.
_OUTPUT_FOLDERS = ("out", "workdir")


@dataclass(frozen=True)
class ScriptScalars:
    """A script's TensorBoard scalars: when the first and the last was logged (unix time), and each tag's last
    value."""

    first_time: float
    last_time: float
    last_values: tuple[tuple[str, float], ...]


def _roots(run_path: Path) -> list[Path]:
    """Where to look: the output folders in the run directory, and for a run on this machine the working
    directory the script wrote in (workdir.json names it and the files it wrote)."""
    roots = [run_path / name for name in _OUTPUT_FOLDERS]
    roots += [node / name for node in sorted((run_path / "nodes").glob("*")) for name in _OUTPUT_FOLDERS]
    try:
        record = json.loads((run_path / "workdir.json").read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and isinstance(record.get("workdir"), str):
        workdir = Path(record["workdir"])
        files = record.get("files")
        files = files if isinstance(files, list) else []
        paths = [f.get("path") if isinstance(f, dict) else f for f in files]  # {"path", "sha256", "size"}
        roots += [workdir / p for p in paths if isinstance(p, str) and not Path(p).is_absolute() and ".." not in p]
    return [root for root in roots if root.exists()]


def _found(run_path: Path, pattern: str, dirs: bool) -> list[Path]:
    found: set[Path] = set()
    for root in _roots(run_path):
        candidates = [root] if root.match(pattern) else list(root.rglob(pattern)) if root.is_dir() else []
        found.update(p for p in candidates if (p.is_dir() if dirs else p.is_file()))
    return sorted(found)


def event_files(run_path: Path) -> list[Path]:
    """Every TensorBoard event file among the run's outputs."""
    return _found(run_path, EVENT_FILE_GLOB, dirs=False)


def wandb_offline_runs(run_path: Path) -> list[Path]:
    """Every W&B offline run folder (`wandb/offline-run-*`, for `wandb sync`) among the run's outputs."""
    return [p for p in _found(run_path, WANDB_OFFLINE_GLOB, dirs=True) if p.parent.name == "wandb"]


def read_scalars(files: list[Path]) -> ScriptScalars | None:
    """The scalars in these event files, or None when there are none (or TensorBoard is not installed: then one
    line on stderr says the figures are unknown and why)."""
    if not files:
        return None
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415
    except ImportError:
        print("warning: the script logged TensorBoard event files but the tensorboard package is not installed "
              "here: its scalars are left out (pip install tensorboard)", file=sys.stderr)
        return None
    times: list[float] = []
    last: dict[str, tuple[float, float]] = {}  # tag -> (wall time, value)
    for folder in sorted({f.parent for f in files}):
        accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
        try:
            accumulator.Reload()
        except Exception as exc:  # a truncated file from a killed script: what was read so far counts
            print(f"warning: {folder}: event files could not be read whole ({exc})", file=sys.stderr)
        for tag in accumulator.Tags().get("scalars", []):
            for event in accumulator.Scalars(tag):
                times.append(event.wall_time)
                if tag not in last or event.wall_time >= last[tag][0]:
                    last[tag] = (event.wall_time, event.value)
    if not times:
        return None
    return ScriptScalars(min(times), max(times), tuple(sorted((tag, value) for tag, (_, value) in last.items())))


def script_logs_line(run_path: Path) -> str | None:
    """The outcome's line naming what a script logged for its own tools (None when it logged nothing found)."""
    folders = sorted({str(f.parent) for f in event_files(run_path)})
    wandb = [str(p) for p in wandb_offline_runs(run_path)]
    parts = []
    if folders:
        parts.append(f"TensorBoard event files in {', '.join(folders)} (`tensorboard --logdir DIR` shows them)")
    if wandb:
        parts.append(f"W&B offline runs {', '.join(wandb)} (`wandb sync DIR` uploads them)")
    return "your script's own logs: " + "; ".join(parts) if parts else None
