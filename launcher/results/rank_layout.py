"""Which node and local rank hold a global rank, from the run's plan.

c10d rendezvous ranks the nodes itself (it ignores --node-rank): by their rendezvous address, `--local-addr`
(compared as text), then by torchrun's pid. Our plans give every node of a multi-node run its own --local-addr,
so node k holds group rank g where g is k's place in the sorted addresses; global rank R is then local rank
R mod P on the node of group rank R div P (P workers per node). Without distinct addresses the plan's node order
is taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import SpecError
from launcher.results.rundir import RunDir, read_json
from launcher.spec.strategies import torchrun_workers

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class RankLayout:
    """Global ranks laid out on nodes: `node_of_group[g]` is the node holding group rank g."""

    workers_per_node: int
    node_of_group: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return self.workers_per_node * len(self.node_of_group)

    def locate(self, global_rank: int) -> tuple[int, int]:
        """(node, local rank) of a global rank; SpecError naming the run's ranks when out of range."""
        if not 0 <= global_rank < self.world_size:
            raise SpecError(f"--rank {global_rank}: the run has ranks 0-{self.world_size - 1}")
        group, local = divmod(global_rank, self.workers_per_node)
        return self.node_of_group[group], local

    def global_rank(self, node: int, local_rank: int) -> int:
        """The global rank of local rank `local_rank` on node `node`."""
        return self.node_of_group.index(node) * self.workers_per_node + local_rank


def _option(command: list[str], name: str) -> str | None:
    for index, word in enumerate(command[:-1]):
        if word == name:
            return command[index + 1]
    return None


def order_by_address(addresses: list[str | None]) -> tuple[int, ...]:
    """Node indexes in group-rank order: by address as text when every node has its own, else as planned."""
    named = [a for a in addresses if a]
    if len(named) != len(addresses) or len(set(named)) != len(named):
        return tuple(range(len(addresses)))
    return tuple(sorted(range(len(addresses)), key=lambda k: str(addresses[k])))


def rank_layout(run_dir: RunDir) -> RankLayout:
    """The layout of a run's ranks: from plan.json's node commands on hosts, else from the spec (one node)."""
    plan = read_json(run_dir.path / PLAN_FILE)
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    if isinstance(nodes, list) and nodes and all(isinstance(n, dict) for n in nodes):
        commands = [[str(w) for w in n.get("command", [])] for n in nodes]
        workers = _option(commands[0], "--nproc-per-node")
        if workers and workers.isdigit():
            return RankLayout(int(workers), order_by_address([_option(c, "--local-addr") for c in commands]))
    spec = run_dir.spec()
    if spec.launcher != "torchrun":  # the script runs once per node: its output is that node's one "worker"
        return RankLayout(1, tuple(range(spec.nnodes)))
    return RankLayout(torchrun_workers(spec.strategy, spec.nproc_per_node), tuple(range(spec.nnodes)))
