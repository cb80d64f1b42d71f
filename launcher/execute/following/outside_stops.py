"""What ends a followed run from outside it: `ddpctl down` from another terminal, or a node's workspace deleted on its
host. `up`'s follow loop (launcher/execute/hosts/run.py) asks on every poll and turns either into a stop request
with one line that names it (never "training failed ... SIGTERM", never "not started" for ever)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from launcher.results.rundir import RunDir
from launcher.runtimes.native import NodeState

DOWN_EVENT = "down_requested"  # written by `ddpctl down` before it stops the nodes


def down_requested(run_dir: RunDir, states: Sequence[NodeState | None]) -> bool:
    """Whether `ddpctl down` stopped the run (asked once a node has ended: a stop ends them)."""
    if not any(s is not None and s.finished for s in states):
        return False
    return any(e.get("event") == DOWN_EVENT for e in run_dir.events())


def outside_stop(run_dir: RunDir, states: Sequence[NodeState | None], labels: Sequence[str],
                 stop_nodes: Callable[[list[int]], list[NodeState | BaseException]]) -> tuple[str, str] | None:
    """(the line, the reason) of a stop from outside the run, or None. A node whose workspace is gone is stopped
    here (`stop_nodes`: by the run's marks, its pid file having gone with the workspace), so the line can say
    what became of its processes."""
    gone = [i for i, s in enumerate(states) if s is not None and s.workspace_gone]
    if gone:
        run_dir.event("workspace_gone", nodes=gone)
        results = stop_nodes(gone)
        run_dir.event("stopped_gone", nodes={str(i): r.stopped if isinstance(r, NodeState) else str(r)
                                             for i, r in zip(gone, results, strict=True)})
        told = [f"node {i} ({labels[i]}): {gone_node_outcome(r)}" for i, r in zip(gone, results, strict=True)]
        return (f"the workspace of {', '.join(f'node {i} ({labels[i]})' for i in gone)} was deleted from its host "
                f"(~/.ddpctl/runs/{run_dir.run_id}): nothing more can be read or pulled there; "
                + "; ".join(told), "workspace gone")
    if down_requested(run_dir, states):
        return f"run {run_dir.run_id} was stopped by `ddpctl down` (from another terminal)", "down"
    return None


def gone_node_outcome(result: NodeState | BaseException) -> str:
    """What the stop of a node whose workspace is gone found and did."""
    if isinstance(result, BaseException):
        return ("its processes could not be looked for (" + " ".join(str(result).split())[:200] + "): check `ps` "
                "on the host")
    signalled = (result.stopped or {}).get("signalled") or []
    if signalled:
        return (f"its {len(signalled)} process(es) of the run, found by the run's marks (command line and "
                "environment), were stopped")
    return "no process of the run was found running there (nothing of it is left running)"

