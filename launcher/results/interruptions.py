"""A run's `interruptions` (run.json, summary.json: machines lost to a market and replaced, `--interruptible` on
Vast.ai) told in one line each, by `up` as it happens and by `status` after."""

from __future__ import annotations

from typing import Any


def interruption_line(entry: dict[str, Any]) -> str:
    """`interruption N: what was lost; how long until training again; from what; what it cost` (unknowns said)."""
    seconds = entry.get("seconds_to_training")
    again = (f"training again {float(seconds):.1f} s after the loss was seen" if seconds is not None
             else "not seen training again")
    cost = entry.get("cost_usd")
    costs = (f"it cost ${float(cost):.4f} (${float(entry.get('gap_usd') or 0):.4f} while nothing trained, "
             f"${float(entry.get('redone_usd') or 0):.4f} of work redone)" if cost is not None else "its cost: unknown")
    return (f"interruption {entry.get('index')}: {entry.get('lost_text')}; {again}, resumed "
            f"{entry.get('resumed_from') or 'from: unknown'}; {costs}")
