"""The worlds a `-- CMD` run really formed, measured from the join records its processes wrote
(launcher/runtimes/join_hook.py: one JSON file per process that joined a torch.distributed process group or an MPI
world, in each node's logs/joined/), and how that compares with the plan.

The summary's world size and process count come from here, or are "unknown" (no process recorded a join): never
the planned numbers. Several processes claiming the same rank mean several independent worlds (a script that
hard-codes localhost on each node, or starts its own processes under torchrun): the run did not train as one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.spec.launchers import JOINED_DIR


@dataclass(frozen=True)
class JoinRecord:
    kind: str  # "torch" or "mpi"
    rank: int
    world_size: int
    node: int | None
    host: str
    attempt: int
    where: str | None


@dataclass(frozen=True)
class MeasuredWorlds:
    """What the newest attempt's processes joined: one world (world_size) or several (world_size None)."""

    records: tuple[JoinRecord, ...]

    @property
    def processes(self) -> int:
        return len(self.records)

    @property
    def worlds(self) -> int:
        """Independent worlds: the most processes claiming any one rank (each world has one of each rank)."""
        counts: dict[tuple[str, int], int] = {}
        for r in self.records:
            counts[(r.kind, r.rank)] = counts.get((r.kind, r.rank), 0) + 1
        return max(counts.values(), default=0)

    @property
    def world_sizes(self) -> list[int]:
        return sorted({r.world_size for r in self.records})

    @property
    def world_size(self) -> int | None:
        """The world size when the processes formed exactly one complete world, else None."""
        sizes = self.world_sizes
        if self.worlds != 1 or len(sizes) != 1 or sizes[0] != self.processes:
            return None
        return sizes[0]

    @property
    def nodes(self) -> list[int]:
        return sorted({r.node for r in self.records if r.node is not None})

    def describe(self) -> str:
        """`2 processes in one world of 2 on node 0` / `4 processes in 2 separate worlds (sizes 2)...`."""
        on = ", ".join(str(n) for n in self.nodes) or "unknown"
        place = f"on node{'s' if len(self.nodes) > 1 else ''} {on}"
        if self.worlds <= 1 and self.world_size is not None:
            return f"{self.processes} process(es) in one world of {self.world_size} {place}"
        wheres = sorted({r.where for r in self.records if r.where})
        at = f", each meeting at {', '.join(wheres)}" if wheres else ""
        sizes = ", ".join(str(s) for s in self.world_sizes)
        return (f"{self.processes} process(es) in {self.worlds} separate worlds (world size {sizes}) {place}{at}")


def read_joins(logs_dirs: list[Path]) -> list[JoinRecord]:
    """Every join record under the nodes' logs folders (node: the folder's position when the record has none)."""
    records = []
    for index, logs in enumerate(logs_dirs):
        for path in sorted((logs / JOINED_DIR).glob("*.json")):
            try:
                data = json.loads(path.read_text())
                node = data.get("node")
                records.append(JoinRecord(
                    kind=str(data["kind"]), rank=int(data["rank"]), world_size=int(data["world_size"]),
                    node=int(node) if node not in (None, "") else index, host=str(data.get("host") or ""),
                    attempt=int(data.get("attempt") or 0), where=data.get("where") or None))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a record half-written when the node was stopped
    return records


def measure(logs_dirs: list[Path]) -> MeasuredWorlds | None:
    """The newest attempt's joins, or None when no process recorded one."""
    records = read_joins(logs_dirs)
    if not records:
        return None
    newest = max(r.attempt for r in records)
    return MeasuredWorlds(tuple(r for r in records if r.attempt == newest))


def world_verdict(measured: MeasuredWorlds | None, planned_nodes: int, planned_world: int | None
                  ) -> tuple[dict[str, Any], str | None, bool]:
    """summary.json's measured fields, a warning line when what ran is not what was planned, and whether the run
    must fail (it did not train as one world across its nodes)."""
    if measured is None:
        return {"world_size": None, "processes": None, "world_measured": False}, None, False
    fields: dict[str, Any] = {"world_size": measured.world_size, "processes": measured.processes,
                              "worlds": measured.worlds, "world_measured": True}
    if measured.worlds > 1:
        return fields, (f"the run did not train as one world: {measured.describe()}. Each world trained alone; "
                        "with several nodes the script must take node 0's address and the global ranks from "
                        "ddpctl (--launcher spawn: $DDPCTL_MASTER_ADDR, $DDPCTL_NODE_RANK; or torchrun's "
                        "RANK/WORLD_SIZE)"), True
    if measured.world_size is None:
        return fields, f"the processes that ran do not form one complete world: {measured.describe()}", True
    if planned_nodes > 1 and len(measured.nodes) < planned_nodes:
        return fields, (f"the world spans {len(measured.nodes)} of the run's {planned_nodes} nodes: "
                        f"{measured.describe()}"), True
    if planned_world is not None and measured.world_size < planned_world:  # processes of the plan trained without
        return fields, (f"the world that ran has {measured.world_size} processes, fewer than the planned "
                        f"{planned_world}: {measured.describe()}; the results are not those of the planned run"), True
    if planned_world is not None and measured.world_size > planned_world:  # the script started processes of its own
        return fields, (f"the world that ran has {measured.world_size} processes, more than the planned "
                        f"{planned_world}: {measured.describe()}; the results are not those of the planned run (a "
                        "script that starts its own processes: run it with `--launcher spawn`)"), True
    return fields, None, False
