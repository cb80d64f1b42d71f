"""The live progress display and the final summary table (rich, on stderr so --json keeps stdout clean)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

console = Console(stderr=True)
# Stdout: what a command lists (status, doctor, the rented machines), so that `ddpctl status > f` keeps it.
listing = Console()


# The numeric fields of a progress record (contracts.md: progress.json) and the type each is read as.
_INT_FIELDS = ("epoch", "epochs", "step", "steps_per_epoch", "steps_total")
_FLOAT_FIELDS = ("samples_per_s", "loss")


def progress_record(record: object) -> dict[str, Any] | None:
    """A progress record as the display can use it, or None when it is not one. The file comes from a host, so
    it may be anything: only a JSON object counts, numeric fields that do not read as finite numbers are left
    out, and `state` is kept only as text."""
    if not isinstance(record, Mapping):
        return None
    clean: dict[str, Any] = {k: v for k, v in record.items() if isinstance(k, str)}
    for key in _INT_FIELDS + _FLOAT_FIELDS:
        if key not in clean:
            continue
        number = _finite(clean.pop(key))
        if number is not None:
            clean[key] = int(number) if key in _INT_FIELDS else number
    if not isinstance(clean.get("state", ""), str):
        del clean["state"]
    return clean


def finite_number(value: object) -> float | None:
    """`value` as a finite float (a number, or text that reads as one); None for anything else, an int too large
    for a float among them (a record from a host or a script may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


_finite = finite_number


class ProgressDisplay(Protocol):
    """What follows a run: RunProgress (a terminal) or launcher.execute.following.plain_progress.PlainProgress (a
    log)."""

    def show_output(self, title: str, lines: list[str], stream: list[str]) -> None: ...

    def update(self, node: int, record: object, state: str | None = None, extra: str = "") -> None: ...


class _ProgressWithOutput(Progress):
    """rich's Progress with a few lines of a worker's output under the bars (on a terminal)."""

    output_title = ""
    output_lines: list[str] = []

    def get_renderables(self) -> Iterable[RenderableType]:
        yield from super().get_renderables()
        if self.output_lines:
            yield Text(self.output_title, style="dim")
            for line in self.output_lines:
                yield Text("  " + line, no_wrap=True, overflow="ellipsis")


class RunProgress:
    """One progress row per node: epoch, step, samples/s and ETA, fed by the trainer's progress records (or a
    script's, launcher.results.script_progress), and under them the live tail of global rank 0's output."""

    def __init__(self, node_labels: list[str], enabled: bool = True) -> None:
        self.enabled = enabled
        self._progress = _ProgressWithOutput(
            TextColumn("{task.fields[label]}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._tasks: dict[int, TaskID] = {}
        self._first_seen: dict[int, tuple[float, int]] = {}  # per node: (time, steps done) of the first record
        for index, label in enumerate(node_labels):
            self._tasks[index] = self._progress.add_task(
                "", total=None, label=f"node {index} {label}", status="starting"
            )

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def show_output(self, title: str, lines: list[str], stream: list[str]) -> None:
        """Rank 0's newest output: on a terminal, `lines` under the bars, redrawn; elsewhere (a log file, a
        pipe), each line of `stream` once, as it comes."""
        if not self.enabled:
            return
        if console.is_terminal:
            self._progress.output_title, self._progress.output_lines = title, lines
        else:
            for line in stream:
                console.print(f"{title} {line}", markup=False, highlight=False, soft_wrap=True)

    def update(self, node: int, record: object, state: str | None = None,
               extra: str = "") -> None:
        """Show a node's latest progress record (contracts.md: progress.json) and/or its process state."""
        task = self._tasks[node]
        record = progress_record(record)
        if not record:
            self._progress.update(task, status=f"{state or 'starting'} {extra}".strip())
            return
        if record.get("source"):  # a script's record: only what it said (launcher.results.script_progress)
            status, position = script_status(record)
            if state and state != "running":
                status += f" [{state}]"
            total, done = position or (None, 0)
            self._progress.update(task, total=total, completed=done, status=f"{status} {extra}".strip())
            return
        epochs = max(1, record.get("epochs") or 1)
        steps = max(1, record.get("steps_per_epoch") or 1)
        epoch = max(1, record.get("epoch") or 1)
        step = max(0, record.get("step") or 0)
        done = (epoch - 1) * steps + min(step, steps)
        total = epochs * steps
        rate = float(record.get("samples_per_s") or 0.0)
        status = f"epoch {epoch}/{epochs} step {step}/{steps} {rate:,.0f} samples/s"
        first = self._first_seen.setdefault(node, (time.monotonic(), done))
        eta = _eta(first, done, total)
        if eta is not None:
            status += f" ETA {eta}"
        if state and state != "running":
            status += f" [{state}]"
        self._progress.update(task, total=total, completed=done, status=f"{status} {extra}".strip())


def script_status(record: Mapping[str, Any]) -> tuple[str, tuple[int, int] | None]:
    """A script's progress as text, and (total, done) for the bar when the record gives totals."""
    epoch, epochs, step = record.get("epoch"), record.get("epochs"), record.get("step")
    per_epoch, steps_total = record.get("steps_per_epoch"), record.get("steps_total")
    parts = []
    if epoch is not None:
        parts.append(f"epoch {epoch}" + (f"/{epochs}" if epochs else ""))
    if step is not None:
        parts.append(f"step {step}" + (f"/{steps_total or per_epoch}" if steps_total or per_epoch else ""))
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4g}")
    if record.get("samples_per_s"):
        parts.append(f"{record['samples_per_s']:,.0f} samples/s")
    position = None
    if epochs and epoch is not None:
        steps = per_epoch if per_epoch and step is not None else 1
        done = (max(1, epoch) - 1) * steps + (min(step, steps) if per_epoch and step is not None else 1)
        position = (epochs * steps, min(done, epochs * steps))
    elif steps_total and step is not None:
        position = (steps_total, min(step, steps_total))
    return " ".join(parts) or "running", position


STALL_HINT_SECONDS = 300.0


class FreshestProgress:
    """Which node's progress record to show. Global rank 0 writes it, and rank 0 sits on whichever node has the
    smallest rendezvous address, not always node 0, and can move after a restart; so the record shown is the one
    that changed last as seen from here (host clocks may disagree). It also tells how long nothing has moved."""

    def __init__(self, nodes: int) -> None:
        self._records: list[Mapping[str, Any] | None] = [None] * nodes
        self._changed: list[float] = [float("-inf")] * nodes

    def observe(self, node: int, record: object, now: float | None = None) -> None:
        """Note node's latest record (anything but a progress record counts as none)."""
        record = progress_record(record)
        if record is not None and record != self._records[node]:
            self._records[node] = record
            self._changed[node] = time.monotonic() if now is None else now

    def freshest(self) -> int | None:
        """The node whose record changed last, or None before any record."""
        best = max(range(len(self._records)), key=lambda i: self._changed[i], default=None)
        return None if best is None or self._records[best] is None else best

    def record(self, node: int) -> Mapping[str, Any] | None:
        return self._records[node] if node == self.freshest() else None

    def stalled_for(self, now: float | None = None, threshold: float = STALL_HINT_SECONDS) -> float | None:
        """Seconds since the record last moved while training or validating, once over `threshold`; else None."""
        node = self.freshest()
        if node is None or (self._records[node] or {}).get("state") == "done":
            return None
        idle = (time.monotonic() if now is None else now) - self._changed[node]
        return idle if idle > threshold else None


def stall_note(seconds: float | None) -> str:
    return "" if seconds is None else f"[no progress for {int(seconds // 60)} min: see `ddpctl logs`]"


def _eta(first: tuple[float, int], done: int, total: int) -> str | None:
    """Time left at the pace seen since the first record (start-up excluded)."""
    seen_at, seen_done = first
    elapsed = time.monotonic() - seen_at
    if done <= seen_done or total <= done or elapsed <= 0:
        return None
    remaining = elapsed / (done - seen_done) * (total - done)
    minutes, seconds = divmod(int(remaining), 60)
    return f"{minutes}:{seconds:02d}"


def summary_table(summary: Mapping[str, Any], title: str) -> Table:
    """The final figures of a run (summary.json) as a two-column table, at least as wide as its title (which
    names the run: an id broken across lines cannot be copied into `ddpctl status`)."""
    table = Table(title=title, show_header=False, min_width=len(title) + 4)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", no_wrap=True)
    unknown = "unknown" if summary.get("world_measured") is False else None  # a script run that showed no world
    rows = [
        ("world size", summary.get("world_size") if summary.get("world_size") is not None else unknown),
        *([("processes", summary.get("processes") or unknown)] if "world_measured" in summary else []),
        ("epochs", summary.get("epochs")),
        ("training time", _seconds(summary.get("train_seconds"))),
        ("wall time", _seconds(summary.get("wall_seconds"))),
        ("samples/s", _number(summary.get("samples_per_s"))),
        ("train accuracy", _percent(summary.get("final_train_acc"))),
        ("validation accuracy", _percent(summary.get("final_val_acc"))),
        ("restarts", summary.get("restarts")),
    ]
    if finite_number(summary.get("cost_usd")) is not None:
        rows.append(("cost", f"${finite_number(summary['cost_usd']):.4f}"))
    if isinstance(summary.get("cost_split"), dict):  # Vast.ai bills these three apart
        rows.append(("cost split", ", ".join(f"{part} ${finite_number(summary['cost_split'].get(key)) or 0:.4f}"
                                             for part, key in (("GPU", "gpu_usd"), ("storage", "storage_usd"),
                                                               ("bandwidth", "bandwidth_usd")))))
    if finite_number(summary.get("interruptions")):  # --interruptible: machines lost and replaced, one run still
        rows.append(("interruptions", f"{summary['interruptions']} (they cost "
                                      f"${finite_number(summary.get('interruptions_cost_usd')) or 0:.4f})"))
    for name, value in rows:  # a script's own summary.json may hold anything: shown short, never a traceback
        table.add_row(name, "-" if value is None else str(value)[:80])
    return table


def _seconds(value: Any) -> str | None:
    number = finite_number(value)
    return None if number is None else f"{number:.1f} s"


def _number(value: Any) -> str | None:
    number = finite_number(value)
    return None if number is None else f"{number:,.0f}"


def _percent(value: Any) -> str | None:
    number = finite_number(value)
    return None if number is None else f"{100 * number:.2f}%"
