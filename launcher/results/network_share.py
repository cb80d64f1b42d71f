"""Whether the network is why a layout scales as it does: the report's "Where a step's time goes" section.

From what was measured, never assumed: the trainer's exposed communication share and its step time without
gradient sync (summary.json: `exposed_comm_fraction`, `step_ms_no_sync`), and, where the run was started with
`up --check-bandwidth`, the all-reduce of the model's gradient timed on the run's own hosts before it started
(run.json's `bandwidth`). The efficiency that link allows is then predicted as a step's computation over
computation plus that all-reduce (no overlap: DDP hides little of a small model's single bucket), and set beside
the efficiency measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from launcher.results.progress import finite_number

LIMITS = 0.5  # exposed share from which the network is what limits a layout
HIDDEN = 0.2  # below this, it is not what limits it


@dataclass(frozen=True)
class NetworkFigures:
    """One run's measured network figures (None: not measured)."""

    exposed_comm_fraction: float | None = None
    step_ms_no_sync: float | None = None
    busbw_gbit_s: float | None = None  # run.json's bandwidth, measured before the run
    allreduce_ms: float | None = None  # that measurement's time for the largest message (the gradient)

    @property
    def predicted_efficiency(self) -> float | None:
        """Computation / (computation + the gradient's measured all-reduce), where both were measured."""
        if self.step_ms_no_sync is None or self.allreduce_ms is None or self.step_ms_no_sync <= 0:
            return None
        return self.step_ms_no_sync / (self.step_ms_no_sync + self.allreduce_ms)


def network_figures(run: dict[str, Any], summary: dict[str, Any]) -> NetworkFigures:
    """The figures from a run's run.json and summary.json; what is missing or not a finite number stays None."""
    found = run.get("bandwidth")
    measured: dict[str, Any] = found if isinstance(found, dict) else {}
    sizes = measured.get("sizes") if isinstance(measured.get("sizes"), list) else []
    last = sizes[-1] if sizes and isinstance(sizes[-1], dict) else {}
    return NetworkFigures(_number(summary.get("exposed_comm_fraction")), _number(summary.get("step_ms_no_sync")),
                          _number(measured.get("busbw_gbit_s")), _number(last.get("time_ms")))


def _number(value: Any) -> float | None:
    return finite_number(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def verdict(exposed: float) -> str:
    if exposed >= LIMITS:
        return "the network limits this layout's scaling"
    if exposed < HIDDEN:
        return "the network is not what limits it"
    return "the network takes a part of each step"


class LayoutRow(Protocol):
    """What of a report row (run_figures.Row, which imports this module) the section reads."""

    @property
    def strategy(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def efficiency(self) -> float: ...
    @property
    def exposed_comm_fraction(self) -> float | None: ...
    @property
    def busbw_gbit_s(self) -> float | None: ...
    @property
    def predicted_efficiency(self) -> float | None: ...


def network_section(rows: Sequence[LayoutRow]) -> list[str]:
    """Markdown lines, one per layout whose exposed share was measured; [] when none was."""
    lines = []
    for row in rows:
        if row.exposed_comm_fraction is None:
            continue
        text = (f"- {row.strategy} {row.layout} (`{row.run_id}`): {100 * row.exposed_comm_fraction:.0f}% of a step "
                "waited on communication that computation did not hide")
        if row.busbw_gbit_s is not None:
            text += f"; bus bandwidth {row.busbw_gbit_s:.3g} Gbit/s, measured before the run"
        if row.predicted_efficiency is not None:
            text += (f"; the efficiency it allows {100 * row.predicted_efficiency:.0f}%, measured "
                     f"{100 * row.efficiency:.0f}%")
        lines.append(f"{text}: {verdict(row.exposed_comm_fraction)}.")
    if not lines:
        return []
    return ["## Where a step's time goes", "",
            "Exposed communication: the trainer timed steps with and without DDP's gradient sync after training. "
            "The efficiency a link allows: a step's computation over computation plus the gradient's all-reduce "
            "as `up --check-bandwidth` timed it on the run's hosts.", "", *lines]
