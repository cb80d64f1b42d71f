"""Stopping a run's nodes on their hosts, each in one round trip (launcher/runtimes/native.py's stop: the node
program, launcher/remote/node_stop.py): all of them, some of them (a deleted workspace), all of them with each
one's report of how it ended (a failure), or all of them because the run directory went while `up` followed."""

from __future__ import annotations

from typing import Any

from launcher.results.record import RecordError
from launcher.results.rundir import RUN_FILE, RunDir
from launcher.runtimes.native import NodeState, ask_node, stop_node
from launcher.runtimes.start import runtime_of
from launcher.transport.hostsession import HostSession
from launcher.transport.parallel import run_on_hosts


def node_workspaces(run_dir: RunDir) -> list[str]:
    """Each node's workspace as run.json records it, checked as a plan's are: a hand-edited `../..` would have
    `pull`, `status` or `down` work on a host's whole file system (RecordError, one line)."""
    workspaces = [str(n["workspace"]) for n in run_dir.record()["nodes"]]
    for index, workspace in enumerate(workspaces):
        if not recorded_workspace_ok(workspace):
            raise RecordError(f"{run_dir.path / RUN_FILE}: node {index}'s workspace {workspace!r} is not a run's "
                              f"workspace (ddpctl writes ~/.ddpctl/runs/{run_dir.run_id}): the record was edited; "
                              "restore it, or reach the host yourself")
    return workspaces


def recorded_workspace_ok(workspace: str) -> bool:
    """A folder below the login's home or an absolute one, never climbing (`..`), never `/`, `~` or the home itself."""
    parts = workspace.split("/")
    return (bool(workspace.strip("/. ")) and ".." not in parts and not workspace.startswith("~")
            and not any(c in workspace for c in "\0\n\r"))


def stop_all(session: HostSession, run_dir: RunDir) -> None:
    """Stop every node (those that could not be stopped are named in the `stopped` event)."""
    stop_every_node(session, run_dir)


def stop_every_node(session: HostSession, run_dir: RunDir) -> dict[str, str]:
    """Stop every node; the error of each that could not be stopped, by host label (also in the `stopped` event)."""
    outcomes = stop_nodes(session, stop_facts(run_dir))
    errors = {o.label: str(o.error) for o in outcomes if o.error}
    run_dir.event("stopped", errors=errors)
    return errors


def stop_nodes_of(session: HostSession, run_dir: RunDir, nodes: list[int]) -> dict[int, str]:
    """Stop these nodes only; the error of each that could not be stopped, by node."""
    outcomes = stop_nodes(session, stop_facts(run_dir), nodes)
    errors = {i: " ".join(str(o.error).split())[:200] for i, o in zip(nodes, outcomes, strict=True) if o.error}
    run_dir.event("stopped", nodes=nodes, errors={session.label_of(i): why for i, why in errors.items()})
    return errors


def stop_and_report(session: HostSession, run_dir: RunDir, stop: bool) -> list[NodeState | None]:
    """Every node's report of how it ended, each stopped first (with `stop`) in the same round trip (one per
    node); None for a node that could not be asked."""
    facts = stop_facts(run_dir)
    if stop:
        outcomes = stop_nodes(session, facts, report=True)
        run_dir.event("stopped", errors={o.label: str(o.error) for o in outcomes if o.error})
    else:
        workspaces, python, _ = facts
        outcomes = run_on_hosts(list(range(len(workspaces))),
                                lambda i: ask_node(session.conn(i), workspaces[i], python, report=True),
                                timeout=90, label=session.label_of)
    return [o.value if o.error is None else None for o in outcomes]


def stop_facts(run_dir: RunDir) -> tuple[list[str], str, float]:
    """The nodes' workspaces, the hosts' python, and the stop grace for nodes that recorded none."""
    return node_workspaces(run_dir), run_dir.spec().python, runtime_of(run_dir.typed_record()).stop_grace_seconds


def stop_nodes(session: HostSession, facts: tuple[list[str], str, float], nodes: list[int] | None = None,
               report: bool = False) -> list[Any]:
    """Stop `nodes` (every node by default), one round trip each; each outcome's value is the node's state after."""
    workspaces, python, fallback = facts
    return run_on_hosts(list(range(len(workspaces))) if nodes is None else nodes,
                        lambda i: stop_node(session.conn(i), workspaces[i], python, None, fallback, report),
                        timeout=90 + (30 if report else 0), label=session.label_of)


def run_dir_deleted(session: HostSession, run_dir: RunDir, facts: tuple[list[str], str, float]) -> str:
    """The run directory went while `up` followed: stop every node (nothing can be recorded or pulled now) and
    return the line that says so."""
    failed = [f"{o.label} ({' '.join(str(o.error).split())[:200]})" for o in stop_nodes(session, facts) if o.error]
    stopped = f"could not stop {'; '.join(failed)}" if failed else "every node was stopped"
    return (f"the run directory {run_dir.path} was deleted while `up` followed the run: {stopped}; nothing was "
            f"pulled (there is nowhere to put it): what the nodes wrote stays on the hosts, in "
            f"~/.ddpctl/runs/{run_dir.run_id}/")
