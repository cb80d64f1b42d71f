"""What torch's flight recorder says of a stalled run, in one clause: the newest collective each rank entered, by
its number in the process group (the same on every rank), so that the ranks that never entered the one the others
wait in are named. Read from the ranks' summaries (launcher/remote/flight_records.py), taken with their stacks; it
stands beside the stacks' verdict (launcher/results/stack_verdict.py), which says where each rank's Python is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _op(said: Mapping[str, Any]) -> str:
    backend, _, name = str(said.get("op") or "?").partition(":")
    return f"{name} ({backend})" if name else backend


def _ranks(numbers: Sequence[int]) -> str:
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(str(n) for n in sorted(numbers))


def _last(summary: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The newest collective the rank entered in process group `name`."""
    for group in summary.get("groups") or []:
        if isinstance(group, Mapping) and group.get("group") == name and isinstance(group.get("last_entered"),
                                                                                     Mapping):
            return group["last_entered"]
    return None


def flight_verdict(summaries: Sequence[Mapping[str, Any]]) -> str:
    """'' where no rank left a flight record; else e.g. "flight recorder: rank 0 entered all_reduce (gloo) #3
    (train.py:9); rank 1 entered up to #2 and never #3: collective #3 waits for the ranks that never entered it"."""
    readable = sorted((s for s in summaries if not s.get("error") and s.get("groups")),
                      key=lambda s: int(s.get("rank") or 0))
    errors = [f"rank {s.get('rank')}'s record unreadable ({s['error']})" for s in summaries if s.get("error")]
    names = sorted({str(g.get("group")) for s in readable for g in s["groups"] if isinstance(g, Mapping)})
    if not names:
        return "flight recorder: " + "; ".join(errors) if errors else ""
    name = "0" if "0" in names else names[0]  # the default process group, where DDP's collectives are
    newest: dict[int, list[int]] = {}
    ops: dict[tuple[int, str, str], list[int]] = {}
    for summary in readable:
        last = _last(summary, name)
        seq = int(last["seq"]) if last else 0
        newest.setdefault(seq, []).append(int(summary.get("rank") or 0))
        if last:
            ops.setdefault((seq, _op(last), str(last.get("at") or "")), []).append(int(summary.get("rank") or 0))
    top = max(newest)
    parts = [f"{_ranks(members)} entered {op} #{seq}" + (f" ({at})" if at else "")
             for (seq, op, at), members in sorted(ops.items()) if seq == top]
    parts += [f"{_ranks(members)} entered " + (f"up to #{seq} and never #{top}" if seq else "no collective")
              for seq, members in sorted(newest.items()) if seq < top]
    return "flight recorder: " + "; ".join(parts + errors) + _meaning(top, newest, ops)


def _meaning(top: int, newest: Mapping[int, list[int]], ops: Mapping[tuple[int, str, str], list[int]]) -> str:
    if len(newest) > 1:
        return f": collective #{top} waits for the ranks that never entered it"
    if len({op for seq, op, _ in ops if seq == top}) > 1:
        return f": the ranks called different collectives as #{top}"
    return ""
