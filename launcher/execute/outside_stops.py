"""What ends a followed run from outside it: `ddpctl down` from another terminal, or a node's workspace deleted on its
host. `up`'s follow loop (launcher/execute/on_hosts.py) asks on every poll and turns either into a stop request
with one line that names it (never "training failed ... SIGTERM", never "not started" for ever)."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.results.rundir import RunDir
from launcher.runtimes.native import NodeState

DOWN_EVENT = "down_requested"  # written by `ddpctl down` before it stops the nodes


def down_requested(run_dir: RunDir, states: Sequence[NodeState | None]) -> bool:
    """Whether `ddpctl down` stopped the run (asked once a node has ended: a stop ends them)."""
    if not any(s is not None and s.finished for s in states):
        return False
    return any(e.get("event") == DOWN_EVENT for e in run_dir.events())


def outside_stop(run_dir: RunDir, states: Sequence[NodeState | None], labels: Sequence[str]) -> tuple[str, str] | None:
    """(the line, the reason) of a stop from outside the run, or None."""
    gone = [i for i, s in enumerate(states) if s is not None and s.workspace_gone]
    if gone:
        nodes = ", ".join(f"node {i} ({labels[i]})" for i in gone)
        workspaces = ", ".join(f"~/.ddpctl/runs/{run_dir.run_id}" for _ in gone[:1])
        return (f"the workspace of {nodes} is gone from its host ({workspaces} deleted?): nothing more can be read "
                f"or pulled there, and a torchrun still running there cannot be found (its pid file went with it: "
                f"check `ps` on the host)", "workspace gone")
    if down_requested(run_dir, states):
        return f"run {run_dir.run_id} was stopped by `ddpctl down` (from another terminal)", "down"
    return None
