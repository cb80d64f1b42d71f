"""`ddpctl up --host ...`: preflight, plan, ship, start detached, follow, pull — one torchrun node per host."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, Interrupted, RunStopRequested
from launcher.execute.failures.cause import cause_exit_code, report_failure, shown_state, teardown_outcome
from launcher.execute.failures.restart_causes import finish_run_records
from launcher.execute.following import interruption
from launcher.execute.following.before_start import nothing_started_if_interrupted
from launcher.execute.following.hang_watch import RunWatch
from launcher.execute.following.live_output import LiveOutput
from launcher.execute.following.lost_contact import ContactWatch, Movement, end_following, lost_contact_limit
from launcher.execute.following.outside_stops import outside_stop
from launcher.execute.following.plain_progress import run_progress
from launcher.execute.following.stall_watch import StallWatch
from launcher.execute.hosts import bandwidth
from launcher.execute.hosts.mpi_access import MpiAccess
from launcher.execute.hosts.node_stops import (
    node_workspaces,
    run_dir_deleted,
    stop_all,
    stop_and_report,
    stop_facts,
    stop_nodes,
    stop_nodes_of,
)
from launcher.execute.pull_record import pull_lock, write_pull_record
from launcher.execute.ship.to_hosts import code_cache, ship_code, ship_image, workspace_before_start
from launcher.execute.stacks import stall_verdict
from launcher.planning.plan import RunPlan
from launcher.results.planned_world import checked_exit_code
from launcher.results.progress import FreshestProgress, console, stall_note
from launcher.results.rundir import (
    RUN_FILE,
    RunDir,
    primary_node_out,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)
from launcher.runtimes.native import NodeState, OutputRequest, read_state
from launcher.runtimes.served_polls import ServedPolls
from launcher.runtimes.start import start_node
from launcher.transport import outputs
from launcher.transport.hostsession import HostSession, target_from_json, target_to_json
from launcher.transport.parallel import raise_for_errors, run_on_hosts
from launcher.transport.pull import CHANGED, pull_tree

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions, UpResult

POLL_SECONDS = 1.0
# Files copied from node 0 to the top of the run directory, so every run reads the same way.
TOP_LEVEL_FILES = ("timing.jsonl", "summary.json", "progress.json")
PULL_ATTEMPTS = 3
# The plan a run carried out, in its run directory: what `up --dry-run --json` printed for it.
PLAN_FILE = "plan.json"
# What comes back from a node's workspace (gitignore patterns): everything but the shipped code.
PULLED = ("/out/", "/logs/", "/torchrun.out", "/exit_code", "/pid")


def run_remote_up(plan: RunPlan, options: UpOptions, session: HostSession, record_extra: dict[str, Any] | None = None,
                  run_dir: RunDir | None = None, watch: Callable[[], str] | None = None,
                  listed: Sequence[object] | None = None) -> UpResult:
    """Carry out `plan` on the session's hosts (node k on host k) and pull the results; nothing is re-decided.

    A provider may pass the run directory it already made (it records rented machines before they are
    reachable) and `watch`, called on every poll: its text joins the progress display; it may raise
    RunStopRequested. `listed`: each host's code cache as the probe listed it (ship_code). The executed plan is
    kept in the run directory as plan.json."""
    from launcher.planning.request import UpResult

    if plan.unknown:
        raise ValueError("a plan with unknown facts cannot run: " + "; ".join(plan.unknown))
    spec = plan.spec
    if options.check_bandwidth:  # before anything is written: a network that cannot be measured starts nothing
        record_extra = {**(record_extra or {}), "bandwidth": bandwidth.before_run(session, plan)}
    fields = {
        "provider": "ssh", "runtime": plan.runtime,
        "hosts": [target_to_json(t) for t in session.targets],
        "nodes": [{"index": n.index, "label": n.host.label, "address": n.host.address,
                   "workspace": n.workspace, "runtime": n.runtime} for n in plan.nodes],
        "node_facts": [f.to_json() for f in plan.node_facts],
        "ssh": session.settings_json(), **options.record, **(record_extra or {}),
    }  # fmt: skip
    made_here = run_dir is None  # a provider's run directory records what it acquired: kept if interrupted now
    if run_dir is None:
        run_dir = RunDir.create(options.runs_dir, spec, fields)
    else:
        run_dir.update_record(spec=spec.to_json(), **fields)
    write_json_atomic(run_dir.path / PLAN_FILE, plan.to_json())
    run_dir.event("planned", nodes=[n.shell_line() for n in plan.nodes])
    shipping = "shipping the image and the code to the hosts" if plan.image else "shipping the code to the hosts"
    with nothing_started_if_interrupted(shipping, run_dir, keep_run_dir=not made_here, failures_too=True,
                                        kept_because="it records the machines the provider acquired"):
        ship_image(session, plan, run_dir, options.show_progress)
        ship_code(session, plan, run_dir, listed)
    interruption.defer_signals()  # nodes are never left half-started: an interruption waits for the start
    access = MpiAccess(session, plan, run_dir) if workspace_before_start(plan) else None
    try:  # node 0's SSH access to the others (an MPI job): for the run only, removed however it ends
        if access is not None:
            access.set_up()
        start_nodes(session, plan, run_dir)
        if options.detach:
            console.print(f"started run {spec.run_id} on {len(plan.nodes)} node(s); it runs on without this "
                          f"terminal. Follow with `ddpctl status {spec.run_id}`, `ddpctl logs {spec.run_id} -f`; "
                          f"fetch with `ddpctl pull {spec.run_id}`; stop with `ddpctl down {spec.run_id}`.")
            return UpResult(run_dir.path, 0, None, plan)
        try:
            interruption.act_on_deferred()
            code = follow(session, run_dir, show_progress=options.show_progress, watch=watch,
                          stall_timeout=options.stall_timeout, show_output=options.show_output)
        except BaseException as stop:
            # Ctrl-C, SIGTERM, SIGHUP mean stop (a run to keep going without this terminal is what --detach is for),
            # and so does a RunStopRequested; launcher/execute/following/interruption.py says how it ended, in one line.
            requested = stop if isinstance(stop, RunStopRequested) else None
            if requested is None and not interruption.interrupted_by(stop):
                raise
            if requested is not None:
                run_dir.event("stop_requested", reason=str(stop))
            lost = requested.lost_nodes if requested is not None else ()
            outcome = interruption.stop_and_pull(run_dir, lambda: _stop_all_but(session, run_dir, lost),
                                                 lambda: pull_run(session, run_dir),
                                                 cause=str(requested) if requested else None)
            if requested is not None:
                done = outcome.stopped and outcome.pulled
                stopped = f"every node was stopped and what it wrote pulled to {run_dir.path}"
                raise RunStopRequested(f"{stop}; " + (stopped if done else outcome.text), requested.reason) from None
            raise Interrupted(outcome.text) from None
        interruption.pull_after_run(run_dir, lambda: pull_run(session, run_dir))
        code = teardown_outcome(run_dir, code, len(plan.nodes))
        code = checked_exit_code(run_dir, finish_run_records(run_dir), code)  # the planned world?
        summary = read_json(run_dir.path / "summary.json")
        return UpResult(run_dir.path, code, summary, plan)
    finally:
        if access is not None:
            access.remove()


def start_nodes(session: HostSession, plan: RunPlan, run_dir: RunDir) -> None:
    """Start every node (its code copied from the host's code cache into its workspace by the same round trip,
    unless ship_code did it: workspace_before_start)."""
    code = None
    if plan.ship is not None and not workspace_before_start(plan):
        code = (code_cache(plan.ship.source), plan.ship.dest)
    outcomes = run_on_hosts(list(range(len(plan.nodes))),
                            lambda i: start_node(session.conn(i), plan.nodes[i], session.labels[i], plan.spec.python,
                                                 code),
                            timeout=60, label=session.label_of)
    for index, outcome in enumerate(outcomes):
        if outcome.error is None:
            run_dir.event("started", node=index, pid=outcome.value)
    if any(o.error for o in outcomes):
        # Nothing must keep running half-started: stop the nodes that did start.
        stop_all(session, run_dir)
        raise_for_errors(outcomes, "start")


def poll_states(session: HostSession, run_dir: RunDir, outputs: list[OutputRequest | None] | None = None,
                key_changes: dict[int, str] | None = None, errors: dict[int, str] | None = None,
                served: ServedPolls | None = None) -> list[NodeState | None]:
    """Every node's state (with `outputs`, a worker's new output too); None for a node that cannot be reached.
    `key_changes` gets, by node, the refusal of a host whose key is not the one pinned (HOST KEY CHANGED);
    `errors` why each node that gave no state could not be asked (one line). With `served` (a followed run's
    polls), each node is asked by the node program kept running there, else by a node program of its own."""
    workspaces, python = node_workspaces(run_dir), run_dir.spec().python
    wanted = outputs or [None] * len(workspaces)

    def ask(i: int) -> NodeState:
        if served is not None:
            return served.read_state(i, session.conn(i), workspaces[i], wanted[i])
        return read_state(session.conn(i), workspaces[i], wanted[i], python)

    outcomes = run_on_hosts(list(range(len(workspaces))), ask, timeout=45, label=session.label_of)
    states: list[NodeState | None] = []
    for index, outcome in enumerate(outcomes):
        if outcome.error is not None:
            session.drop(index)  # reconnect on the next poll
            if key_changes is not None and host_key_refused(outcome.error):
                key_changes[index] = " ".join(str(outcome.error).split())
            if errors is not None:
                errors[index] = " ".join(str(outcome.error).split())
        states.append(outcome.value if outcome.error is None else None)
    return states


def host_key_refused(error: BaseException) -> bool:
    """Whether a host was refused for the key it presented (changed, of another type, revoked)."""
    return isinstance(error, DdpctlError) and any(
        words in str(error) for words in ("HOST KEY CHANGED", "HOST KEY TYPE CHANGED", "REVOKED HOST KEY"))


def follow(session: HostSession, run_dir: RunDir, show_progress: bool = True,
           lost_contact_seconds: float | None = None, watch: Callable[[], str] | None = None,
           stall_timeout: float = 0.0, show_output: bool = True) -> int:
    """Show progress until every node has ended; return 0, or the first failing node's exit code. With a
    `stall_timeout`, raise RunStopRequested once training has not moved for that many seconds."""
    labels = session.labels
    latest: list[NodeState | None] = [None] * len(labels)  # the exit time comes with the poll (no round trip)
    contact = ContactWatch(run_dir, labels, lost_contact_seconds or lost_contact_limit(), run_dir.spec().launcher,
                           lambda i: getattr(latest[i], "exit_time", None))
    failed_reported = False
    cause: dict[str, Any] | None = None
    explained = False  # the current hang's stacks were taken and told
    freshest = FreshestProgress(len(labels))
    stall = StallWatch(run_dir, freshest, stall_timeout,
                       lambda: stall_verdict(run_dir, session, node_workspaces(run_dir)))
    node_watch = RunWatch.for_run(labels, run_dir)  # hangs, low disk, the first rank failure: told unasked
    served = ServedPolls(run_dir.spec().python)  # one node program per host for all the polls
    with contextlib.closing(served), run_progress(labels, enabled=show_progress) as progress:
        live = LiveOutput(run_dir, progress, show_output)  # rank 0's output, a script's progress, restarts
        facts = stop_facts(run_dir)  # what stops the nodes, should the run directory go
        while True:
            key_changes: dict[int, str] = {}
            try:
                if not (run_dir.path / RUN_FILE).is_file():
                    raise DdpctlError(f"{run_dir.path / RUN_FILE}: missing")
                states = live.observe(poll_states(session, run_dir, live.requests(len(labels)), key_changes,
                                                  served=served))
            except DdpctlError:
                if (run_dir.path / RUN_FILE).is_file():
                    raise
                raise DdpctlError(run_dir_deleted(session, run_dir, facts)) from None
            for index, refusal in key_changes.items():  # every retry would meet the same key: said at once
                progress.update(index, None, "HOST KEY CHANGED")
                run_dir.event("host_key_refused", node=index, error=refusal)
                raise DdpctlError(f"{refusal}; ddpctl no longer talks to node {index}, so the run goes on there "
                                  f"unseen: check the host, then `ddpctl status {run_dir.run_id}`, "
                                  f"`ddpctl down {run_dir.run_id}`; "
                                  + others_stopped(session, run_dir, [i for i in range(len(labels))
                                                                       if i not in key_changes]))
            stopped_outside = outside_stop(  # `ddpctl down`; a deleted workspace, its node stopped by its marks
                run_dir, states, labels, lambda gone: [o.value if o.error is None else o.error
                                                       for o in stop_nodes(session, facts, gone)])
            if stopped_outside is not None:
                raise RunStopRequested(*stopped_outside)
            extra = watch() if watch else ""  # e.g. the live cost of rented machines, on node 0's line
            now = time.monotonic()
            for index, state in enumerate(states):
                if state is not None:
                    freshest.observe(index, state.progress, now)
            node_watch.poll(states, now)
            if node_watch.hang_told and not explained:  # a hang just told: where each rank is, in one line more
                console.print(f"where each rank is: {stall_verdict(run_dir, session, node_workspaces(run_dir))}",
                              markup=False, highlight=False, soft_wrap=True)
            explained = node_watch.hang_told
            rule = node_watch.rule  # how training moves, for what a silent node leaves the others doing
            moving = Movement(rule.last_move, rule.slowest, rule.last_move is not None and rule.hung(now))
            latest[:] = states
            contact.observe(states, now, moving)
            # past --stall-timeout: RunStopRequested (launcher/execute/following/stall_watch.py)
            stalled = stall.check(now)
            for index, state in enumerate(states):
                if state is None:
                    progress.update(index, None, "unreachable")
                    continue
                record = freshest.record(index)
                notes = " ".join(n for n in (stall_note(stalled) if record else "", extra if index == 0 else "") if n)
                progress.update(index, record, shown_state(cause, index, state.label), notes)
            known = [s for s in states if s is not None]
            failed = [(i, s) for i, s in enumerate(states) if s is not None and s.finished and s.exit_code != 0]
            if failed and not failed_reported:
                failed_reported = True
                index, state = failed[0]
                run_dir.event("node_failed", node=index, exit_code=state.exit_code)
                cause = report_failure(session, run_dir, states, stop_and_report)  # stops the others, names the first
                continue  # poll again at once: the display then shows each node's outcome ("stopped", ...)
            silent = contact.past_limit(now)
            if silent is not None:  # never a silent wait: nodes that can only wait for it are stopped
                end_following(contact, contact.give_up(silent, states, moving, now), lambda nodes: stop_nodes_of(
                    session, run_dir, nodes), lambda: pull_run(session, run_dir))
            if len(known) == len(states) and all(s.finished for s in known):
                break
            time.sleep(POLL_SECONDS)
    codes = [s.exit_code if s and s.exit_code is not None else 1 for s in states]
    run_dir.event("finished", exit_codes=codes)
    return cause_exit_code(cause, codes)


def others_stopped(session: HostSession, run_dir: RunDir, reachable: list[int]) -> str:
    """Stop the nodes ddpctl still talks to when it must leave one (its host key changed): what was done, in words
    (a healthy node left training for a run that has lost its watcher is a node nobody stops)."""
    if not reachable:
        return "no other node runs"
    errors = stop_nodes_of(session, run_dir, reachable)
    stopped = [session.label_of(i) for i in reachable if i not in errors]
    said = [f"stopped the other node(s) ({', '.join(stopped)}); `ddpctl pull {run_dir.run_id}` fetches what they "
            "wrote"] if stopped else []
    said += [f"could not stop node {i} ({session.label_of(i)}: {why}): it may still run" for i, why in errors.items()]
    return "; ".join(said)


def pull_run(session: HostSession, run_dir: RunDir) -> list[dict[str, Any]]:
    """Pull every node's outputs into nodes/<k>/ (verified, file by file: what cannot be pulled is named in the
    run directory's pull record, launcher/execute/pull_record.py), then copy rank 0's node's records to the top.
    One pull of a run at a time (a lock in its run directory); a node whose whole pull failed raises."""
    workspaces, python = node_workspaces(run_dir), run_dir.spec().python
    shipped, patterns = outputs.load_shipped(run_dir.path), outputs.recorded_outputs(run_dir.record())

    def pull(index: int) -> dict[str, Any]:
        # A running node rewrites progress.json and snapshots; a file caught mid-change is fetched again
        # (what was already verified is not), a few times, then named.
        for attempt in range(PULL_ATTEMPTS):
            stats = pull_tree(session.conn(index), workspaces[index], run_dir.path / "nodes" / str(index),
                              include=PULLED, missing_ok=True, python=python)
            merged = asdict(stats)
            if shipped is not None:
                written = outputs.pull_workdir(session.conn(index), workspaces[index],
                                               run_dir.path / "nodes" / str(index), shipped, patterns, python)
                merged = outputs.merged_stats(stats, written)
            if attempt == PULL_ATTEMPTS - 1 or all(why != CHANGED for _path, why in merged["not_pulled"]):
                return merged
        raise AssertionError("unreachable")

    with pull_lock(run_dir.path, run_dir.run_id):
        outcomes = run_on_hosts(list(range(len(workspaces))), pull, timeout=1800, label=session.label_of)
        for index, outcome in enumerate(outcomes):
            if outcome.value is not None:
                run_dir.event("pulled", node=index, **outcome.value)
                if outcome.value["skipped_links"]:
                    links = ", ".join(outcome.value["skipped_links"])
                    console.print(f"node {index}: symbolic links are not pulled (never followed): {links}",
                                  markup=False, highlight=False)
            else:
                run_dir.event("pull_failed", node=index, error=str(outcome.error))
        write_pull_record(run_dir.path, [session.label_of(i) for i in range(len(workspaces))],
                          [o.value for o in outcomes], [None if o.error is None else str(o.error) for o in outcomes])
        primary = primary_node_out(run_dir.path, len(workspaces))
        for name in TOP_LEVEL_FILES:
            if primary and (primary / name).is_file():
                write_bytes_atomic(run_dir.path / name, (primary / name).read_bytes())
        if shipped is not None:
            outputs.mirror_rank0(run_dir.path, outputs.rank0_node(run_dir.record(), primary))
    return raise_for_errors(outcomes, "pull")


def reattach(run_dir: RunDir, options: UpOptions) -> HostSession:
    """Connections to a run's hosts from its run directory alone."""
    record = run_dir.record()
    if record.get("released_at"):  # a destroyed machine's address may belong to someone else now
        raise DdpctlError(f"the rented machines of run {run_dir.run_id} were destroyed; what was pulled is in "
                          f"{run_dir.path}")
    targets = [target_from_json(t) for t in record.get("hosts", [])]
    if not targets:
        raise DdpctlError(f"run {run_dir.run_id} ran locally: it has no hosts to reach")
    return HostSession(targets, options, settings=record.get("ssh", {}))


def _stop_all_but(session: HostSession, run_dir: RunDir, lost: tuple[int, ...]) -> None:
    """Stop every node but those whose machine is gone (an outbid Vast machine): there is nothing to stop there,
    and naming them "left running" would send the user to reattach to a machine that the run replaces."""
    if not lost:
        stop_all(session, run_dir)
        return
    stop_nodes_of(session, run_dir, [i for i in range(len(run_dir.record()["nodes"])) if i not in lost])
