"""Reattaching to a run from its local run directory alone: what `status` and `logs` show of its nodes."""

from __future__ import annotations

import codecs
import sys
import time
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.execute.failures.cause import failure_from_pulled
from launcher.execute.failures.restart_causes import finish_run_records
from launcher.execute.following.outside_stops import DOWN_EVENT
from launcher.execute.this_machine.state import local_run_ended
from launcher.results.progress import progress_record
from launcher.results.restarts import newest_attempt_dir
from launcher.results.run_records import node_restarts
from launcher.results.rundir import RunDir
from launcher.results.script_progress import SCRIPT_TAIL_BYTES, script_record

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions
    from launcher.runtimes.native import OutputRequest

FOLLOW_POLL_SECONDS = 1.0
ALL_LINES = 1 << 30  # a rank's output from its first line (as much as `logs` reads of a file's end)


def host_status_rows(run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
    """One row per node of a run on hosts: its process state and progress, asked of its host."""
    from launcher.execute.hosts.run import poll_states, reattach

    key_changes: dict[int, str] = {}
    errors: dict[int, str] = {}
    with reattach(run_dir, options) as session:
        states = poll_states(session, run_dir, _rank0_tail(run_dir, len(session.labels)), key_changes=key_changes,
                             errors=errors)
    rows = []
    pulled = node_restarts(run_dir)  # for a node that cannot be asked: what its pulled logs say
    for index, state in enumerate(states):
        progress = (progress_record(state.progress) or progress_record(
            script_record(state.output, state.output_from == 0) if state.output else None) or {}) if state else {}
        rows.append({"node": index, "host": session.labels[index],
                     "state": state.label if state else ("HOST KEY CHANGED" if index in key_changes
                                                         else "unreachable"),
                     "exit_code": state.exit_code if state else None,
                     "epoch": progress.get("epoch"), "epochs": progress.get("epochs"),
                     "loss": progress.get("loss"),
                     "restarts": pulled[index] if state is None or state.attempt is None else state.attempt,
                     **({"error": unanswered(run_dir.run_id, errors[index], index in key_changes)}
                        if index in errors else {})})
    return rows


def _rank0_tail(run_dir: RunDir, nodes: int) -> list[OutputRequest | None] | None:
    """For a script (nothing writes its progress.json): the end of rank 0's output, asked of its node with its
    state in the same round trip, for the progress lines in it."""
    from launcher.results.rank_layout import rank_layout
    from launcher.runtimes.native import OutputRequest

    if not run_dir.spec().user_command:
        return None
    try:
        node, local_rank = rank_layout(run_dir).locate(0)
    except DdpctlError:
        return None
    return [OutputRequest(local_rank, max_bytes=SCRIPT_TAIL_BYTES) if k == node else None for k in range(nodes)]


def unanswered(run_id: str, error: str, key_refused: bool) -> str:
    """Why a node gave no state, and what that leaves unknown (a host refused for its key: what to do)."""
    if key_refused:
        return (f"{error}. Until then ddpctl does not talk to it: the node's state is unknown and `ddpctl down "
                f"{run_id}` cannot stop it")
    return f"{error}; the node's state is unknown: ask again with `ddpctl status {run_id}`"


def pull_hosts(run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
    """Fetch every host node's outputs into the run directory (verified)."""
    from launcher.execute.hosts.run import pull_run, reattach

    with reattach(run_dir, options) as session:
        stats = pull_run(session, run_dir)
    finish_run_records(run_dir)  # restarts, and a script's summary, from what was pulled
    failure_from_pulled(run_dir)  # a detached run that failed: its cause, as `up` would have named it
    return stats


def stop_and_pull_hosts(run_dir: RunDir, options: UpOptions) -> None:
    """Stop every host node, then pull what it wrote (verified). A node that could not be stopped (unreachable,
    its host key changed) is named with why and what to do, after the others were stopped and pulled."""
    from launcher.execute.hosts.node_stops import stop_every_node
    from launcher.execute.hosts.run import pull_run, reattach
    from launcher.planning.rdzv_reservation import release_on_node0

    pull_error = None
    with reattach(run_dir, options) as session:
        run_dir.event(DOWN_EVENT)  # an `up` following the run says it was stopped by down, not that it failed
        not_stopped = stop_every_node(session, run_dir)
        release_on_node0(session, run_dir.spec().python, run_dir.run_id)  # a detached run's rendezvous port
        try:
            pull_run(session, run_dir)
        except DdpctlError as e:
            if not not_stopped:
                raise
            pull_error = e
        labels = session.labels
    finish_run_records(run_dir)
    if not_stopped:
        nodes = [(labels.index(label), why) for label, why in not_stopped.items()]
        named = "; ".join(f"node {i}: {' '.join(why.split())}" for i, why in sorted(nodes))
        others = len(labels) - len(nodes)
        pulled = f"what the other node(s) wrote is pulled to {run_dir.path}" if others else \
            f"nothing could be pulled from it: `ddpctl pull {run_dir.run_id}` fetches it later"
        if pull_error is not None and others:
            pulled = f"the pull failed too ({' '.join(str(pull_error).split())[:300]})"
        raise DdpctlError(f"could not stop {len(nodes)} of {len(labels)} node(s) of run {run_dir.run_id}: {named}; "
                          f"such a node may still run: `ddpctl down {run_dir.run_id}` again stops it once it can be "
                          f"reached{'; the others were stopped' if others else ''}; {pulled}")


def print_host_log(run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
    """The end of a host node's torchrun output, then (with `follow`) what is added until the node ends."""
    from launcher.execute.hosts.run import node_workspaces, reattach
    from launcher.runtimes.native import read_state

    workspaces = node_workspaces(run_dir)
    if not 0 <= node < len(workspaces):
        raise DdpctlError(f"--node {node}: run {run_dir.run_id} has nodes 0-{len(workspaces) - 1}")
    with reattach(run_dir, options) as session:
        conn = session.conn(node)
        log = f"{workspaces[node]}/torchrun.out"
        # No output yet is how every run starts (and how one that never started stays): a note, not an error,
        # so that `logs` in a loop or a script right after `up --detach` does not fail.
        if not conn.run(["test", "-f", log], timeout=30).ok:
            _no_output_yet(node, follow)
            offset = 0
        else:
            result = conn.run(["tail", "-n", str(lines), log], timeout=30)
            print(result.stdout, end="")
            size = conn.run(["wc", "-c", log], timeout=30).stdout.split() if follow else []
            offset = int(size[0]) if size and size[0].isdigit() else 0
        while follow:
            state = read_state(conn, workspaces[node], python=run_dir.spec().python)
            chunk = conn.run(["tail", "-c", f"+{offset + 1}", log], timeout=30).stdout
            offset += len(chunk.encode())
            print(chunk, end="", flush=True)
            if state.finished or state.workspace_gone:  # nothing more can come
                break
            time.sleep(FOLLOW_POLL_SECONDS)


def _no_output_yet(node: int, follow: bool) -> None:
    waiting = "; waiting for it (Ctrl-C to stop)" if follow else " (the run is starting, or it never started)"
    print(f"node {node} has no output yet{waiting}", file=sys.stderr, flush=True)


def print_local_log(run_dir: RunDir, lines: int, follow: bool, options: UpOptions) -> None:
    """A run on this machine: global rank 0's own output (what `logs --rank 0` shows, as `up` showed it under its
    progress) once rank 0 has written any; before that, torchrun's own output (torchrun.out: how a run that never
    started its workers ended), and with `follow`, rank 0's output from its first line once it comes, until the
    run ends."""
    from launcher.execute.day2.rank_logs import print_rank_log

    logs = run_dir.path / "logs"
    if newest_attempt_dir(logs) is not None:
        print_rank_log(run_dir, 0, lines, follow, options)
        return
    path = run_dir.path / "torchrun.out"
    offset = 0
    if path.exists():
        data = path.read_bytes()
        offset = len(data)
        text = data.decode(errors="replace")
        print("".join(text.splitlines(keepends=True)[-lines:]), end="", flush=True)
    else:
        _no_output_yet(0, follow and not local_run_ended(run_dir))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while follow:
        ended = local_run_ended(run_dir)  # before reading: what it wrote before it ended is still shown
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            print(decoder.decode(chunk), end="", flush=True)
        if newest_attempt_dir(logs) is not None:  # the workers started: rank 0's lines from here on
            print_rank_log(run_dir, 0, ALL_LINES, True, options)
            return
        if ended:
            break
        time.sleep(FOLLOW_POLL_SECONDS)
