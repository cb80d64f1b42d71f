"""`ddpctl up --host ...`: preflight, plan, ship, start detached, follow, pull — one torchrun node per host."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, Interrupted
from launcher.execute import failure_log
from launcher.execute.failure_log import without_control_chars
from launcher.planning.plan import NodeHost, RunPlan, plan_remote
from launcher.planning.preflight import (
    HostFacts,
    Runner,
    check_public_rendezvous,
    check_rendezvous_reachable,
    check_requirements,
    probe_host,
)
from launcher.results.progress import FreshestProgress, RunProgress, console, stall_note
from launcher.results.rundir import RunDir, primary_node_out, read_json, write_bytes_atomic
from launcher.runtimes.docker import DEFAULT_IMAGE, DockerRuntime
from launcher.runtimes.docker_hosts import ensure_image, host_docker_info, require_engine
from launcher.runtimes.native import NativeRuntime, NodeState, log_tail, read_state, start_node, stop_node
from launcher.spec.run_spec import RunSpec
from launcher.transport.hostsession import HostSession, target_from_json, target_to_json
from launcher.transport.parallel import raise_for_errors, run_on_hosts
from launcher.transport.sync import TransferChangedError, pull_tree, ship_tree

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions, UpResult
    from launcher.runtimes.base import NodeRuntime

POLL_SECONDS = 1.0
# Files copied from node 0 to the top of the run directory, so every run reads the same way.
TOP_LEVEL_FILES = ("timing.jsonl", "summary.json", "progress.json")
CODE_CACHE = ".ddpctl/code"
PULL_ATTEMPTS = 3
# What comes back from a node's workspace (gitignore patterns): everything but the shipped code.
PULLED = ("/out/", "/logs/", "/torchrun.out", "/exit_code", "/pid")


def trainer_source_dir() -> Path:
    """Where the trainer package lives locally (found without importing it: it imports torch)."""
    found = importlib.util.find_spec("trainer")
    if found is None or not found.submodule_search_locations:
        raise DdpctlError("the trainer package is not installed here: run `pip install .` in the ddpctl checkout")
    return Path(next(iter(found.submodule_search_locations)))


class RunStopRequested(DdpctlError):
    """Raised by a provider's `watch` hook (e.g. --max-cost) or by `follow` (--stall-timeout): every node is stopped
    and pulled, then it propagates. `reason` names the trigger in events and teardown records."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def run_remote_up(spec: RunSpec, options: UpOptions, session: HostSession | None = None,
                  provider_hosts: list[NodeHost] | None = None, record_extra: dict[str, Any] | None = None,
                  run_dir: RunDir | None = None, watch: Callable[[], str] | None = None) -> UpResult:
    """Run on SSH hosts (or hosts a provider rented: pass its session and NodeHosts) and pull the results.

    A provider may pass the run directory it already made (it records rented machines before they are
    reachable) and `watch`, called on every poll: its text joins the progress display; it may raise
    RunStopRequested."""
    from launcher.execute.request import UpResult

    if options.dry_run:
        spec = spec.with_layout(nnodes=len(options.hosts), nproc_per_node=spec.nproc_per_node)
        hosts = provider_hosts or [NodeHost(h.text, h.hostname) for h in options.hosts]
        # auto is decided by looking at hosts
        runtime = DockerRuntime(image_name(options)) if options.runtime == "docker" else NativeRuntime()
        if spec.nnodes > 1 and options.rdzv_addr:  # judged without connecting; the nodes' own at launch
            check_public_rendezvous(options.rdzv_addr, [], options.allow_public_rendezvous)
        plan = plan_remote(spec, hosts, options.rdzv_addr, runtime)
        if options.auto_gpus:
            console.print("note: without --gpus each host runs one process per GPU (CPU-only: up to 2), counted "
                          f"at launch; shown here as {spec.nproc_per_node}", markup=False, highlight=False,
                          soft_wrap=True)
        return UpResult(None, 0, None, plan)
    own_session = session is None
    session = session or HostSession.open(options)
    try:
        spec, plan = prepare(spec, options, session, provider_hosts)
        fields = {
            "provider": "ssh", "runtime": options.runtime,
            "hosts": [target_to_json(t) for t in session.targets],
            "nodes": [{"index": n.index, "label": n.host.label, "address": n.host.address,
                       "workspace": n.workspace, "runtime": n.runtime} for n in plan.nodes],
            "ssh": session.settings_json(), **options.record, **(record_extra or {}),
        }  # fmt: skip
        if run_dir is None:
            run_dir = RunDir.create(options.runs_dir, spec, fields)
        else:
            run_dir.update_record(spec=spec.to_json(), **fields)
        run_dir.event("planned", nodes=[n.shell_line() for n in plan.nodes])
        ship_image(session, plan, run_dir, options)
        ship_code(session, plan, run_dir)
        start_nodes(session, plan, run_dir)
        if options.detach:
            console.print(f"started run {spec.run_id} on {len(plan.nodes)} node(s); it runs on without this "
                          f"terminal. Follow with `ddpctl status {spec.run_id}`, `ddpctl logs {spec.run_id} -f`; "
                          f"fetch with `ddpctl pull {spec.run_id}`; stop with `ddpctl down {spec.run_id}`.")
            return UpResult(run_dir.path, 0, None, plan)
        try:
            code = follow(session, run_dir, show_progress=options.show_progress, watch=watch,
                          stall_timeout=options.stall_timeout)
        except (KeyboardInterrupt, RunStopRequested) as stop:
            # Ctrl-C means stop: a run to keep going without this terminal is what --detach is for.
            run_dir.event("interrupted" if isinstance(stop, KeyboardInterrupt) else "stop_requested", reason=str(stop))
            stop_all(session, run_dir)
            pull_run(session, run_dir)
            if isinstance(stop, RunStopRequested):
                raise RunStopRequested(f"{stop}; every node was stopped and what it wrote pulled to {run_dir.path}",
                                       stop.reason) from None
            raise Interrupted(f"stopped by Ctrl-C on every node; what they wrote is in {run_dir.path}") from None
        pull_run(session, run_dir)
        summary = read_json(run_dir.path / "summary.json")
        return UpResult(run_dir.path, code, summary, plan)
    finally:
        if own_session:
            session.close()


def prepare(spec: RunSpec, options: UpOptions, session: HostSession,
            provider_hosts: list[NodeHost] | None) -> tuple[RunSpec, RunPlan]:
    """Preflight every host, fix the process layout and addresses, check rendezvous, and plan."""
    outcomes = run_on_hosts(list(range(len(session.targets))),
                            lambda i: probe_host(session.conn(i), spec.python, session.labels[i]),
                            timeout=options.connect_timeout + 90, label=session.label_of)
    facts: list[HostFacts] = raise_for_errors(outcomes, "preflight")
    runtime, docker_infos = choose_runtime(options, session)
    gpus = spec.nproc_per_node
    if options.auto_gpus:
        gpus = min(int(f.info.get("gpus") or 0) or min(2, int(f.info.get("cpus") or 1)) for f in facts)
    spec = spec.with_layout(nnodes=len(facts), nproc_per_node=gpus)
    problems = check_requirements(facts, gpus, runs_host_torch=runtime.runs_host_torch)
    if problems:
        raise DdpctlError("preflight failed:\n" + "\n".join(f"  {p}" for p in problems))
    hosts = provider_hosts or [NodeHost(f.label, f.address, f.iface_of(f.address)) for f in facts]
    if docker_infos:
        hosts = [replace(h, gpus=info.nvidia_runtime) for h, info in zip(hosts, docker_infos, strict=True)]
    addr0 = options.rdzv_addr or hosts[0].address or session.targets[0].hostname
    if spec.nnodes > 1:
        check_public_rendezvous(addr0, facts, options.allow_public_rendezvous)
        port = check_rendezvous_reachable([session.conn(i) for i in range(len(hosts))], session.labels, spec.python,
                                          addr0, spec.rdzv_port, any_free_port=options.auto_rdzv_port)
        spec = replace(spec, rdzv_port=port)
    return spec, plan_remote(spec, hosts, addr0, runtime)


def image_name(options: UpOptions) -> str:
    """The image docker nodes run: --registry's reference, else --image, else ddpctl's default."""
    return options.registry or options.image or DEFAULT_IMAGE


def choose_runtime(options: UpOptions, session: HostSession) -> tuple[NodeRuntime, list[Any] | None]:
    """native, or docker with each host's engine facts. `auto` takes docker when every host has a working
    engine (one runtime per run: the nodes then share the image's python and torch), native otherwise."""
    if options.runtime == "native":
        return NativeRuntime(), None
    image = image_name(options)
    outcomes = run_on_hosts(list(range(len(session.targets))),
                            lambda i: host_docker_info(session.conn(i), image), timeout=90, label=session.label_of)
    infos = raise_for_errors(outcomes, "docker check")
    if options.runtime == "auto":
        return (DockerRuntime(image), infos) if all(i.has_engine for i in infos) else (NativeRuntime(), None)
    outcomes = run_on_hosts(list(range(len(infos))), lambda i: require_engine(infos[i], session.label_of(i)),
                            timeout=10, label=session.label_of)
    return DockerRuntime(image), raise_for_errors(outcomes, "docker runtime")


def ship_image(session: HostSession, plan: RunPlan, run_dir: RunDir, options: UpOptions) -> None:
    """Put our image on every docker node: streamed from the local engine where missing or different (a second
    run ships nothing), or pulled from --registry."""
    if not any(n.runtime == "docker" for n in plan.nodes):
        return
    from launcher.runtimes.image import docker_client

    image = image_name(options)
    engine = None if options.registry else docker_client()
    outcomes = ensure_image([session.conn(n.index) for n in plan.nodes], image, engine,
                            pull=bool(options.registry), show_progress=options.show_progress)
    for node, result in zip(plan.nodes, raise_for_errors(outcomes, "image"), strict=True):
        run_dir.event("image", node=node.index, image=image, bytes_sent=result.bytes_sent, skipped=result.skipped,
                      replaced=result.replaced, pulled=result.pulled)


def _cache_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


def ship_code(session: HostSession, plan: RunPlan, run_dir: RunDir) -> None:
    """Send the trainer (or the user's directory) to a per-host cache incrementally, then copy it into the
    run's workspace, so a relaunch moves only changed files and each run keeps the code it ran."""
    if plan.spec.user_command:
        source, dest = Path(os.getcwd()), ""
    else:
        source, dest = trainer_source_dir(), "/trainer"
    cache = f"{CODE_CACHE}/{_cache_key(source)}"

    def ship(index: int) -> dict[str, Any]:
        conn = session.conn(index)
        stats = ship_tree(conn, source, cache, python=plan.spec.python)
        workspace = plan.nodes[index].workspace
        result = conn.run(["sh", "-c", 'mkdir -p "$1/code$3" && rm -rf "$1/code$3" && cp -R "$2" "$1/code$3"',
                           "ddpctl-copy", workspace, cache, dest], timeout=120)
        if result.exit_code != 0:
            raise DdpctlError(f"could not prepare the workspace: {result.stderr.strip()[:200]}")
        return asdict(stats)

    outcomes = run_on_hosts(list(range(len(plan.nodes))), ship, timeout=600, label=session.label_of)
    for index, stats in enumerate(raise_for_errors(outcomes, "ship")):
        run_dir.event("shipped", node=index, **stats)


def start_nodes(session: HostSession, plan: RunPlan, run_dir: RunDir) -> None:
    outcomes = run_on_hosts(list(range(len(plan.nodes))),
                            lambda i: start_node(session.conn(i), plan.nodes[i], session.labels[i]),
                            timeout=60, label=session.label_of)
    for index, outcome in enumerate(outcomes):
        if outcome.error is None:
            run_dir.event("started", node=index, pid=outcome.value)
    if any(o.error for o in outcomes):
        # Nothing must keep running half-started: stop the nodes that did start.
        stop_all(session, run_dir)
        raise_for_errors(outcomes, "start")


def node_workspaces(run_dir: RunDir) -> list[str]:
    return [n["workspace"] for n in run_dir.record()["nodes"]]


def poll_states(session: HostSession, run_dir: RunDir) -> list[NodeState | None]:
    """Every node's state; None for a node that cannot be reached right now."""
    workspaces = node_workspaces(run_dir)
    outcomes = run_on_hosts(list(range(len(workspaces))), lambda i: read_state(session.conn(i), workspaces[i]),
                            timeout=45, label=session.label_of)
    states: list[NodeState | None] = []
    for index, outcome in enumerate(outcomes):
        if outcome.error is not None:
            session.drop(index)  # reconnect on the next poll
        states.append(outcome.value if outcome.error is None else None)
    return states


def follow(session: HostSession, run_dir: RunDir, show_progress: bool = True,
           lost_contact_seconds: float = 180.0, watch: Callable[[], str] | None = None,
           stall_timeout: float = 0.0) -> int:
    """Show progress until every node has ended; return 0, or the first failing node's exit code. With a
    `stall_timeout`, raise RunStopRequested once training has not moved for that many seconds."""
    labels = session.labels
    last_seen = [time.monotonic()] * len(labels)
    failed_reported = False
    stall_reported = False
    freshest = FreshestProgress(len(labels))
    with RunProgress(labels, enabled=show_progress) as progress:
        while True:
            states = poll_states(session, run_dir)
            extra = watch() if watch else ""  # e.g. the live cost of rented machines, on node 0's line
            now = time.monotonic()
            for index, state in enumerate(states):
                if state is not None:
                    freshest.observe(index, state.progress, now)
            stalled = freshest.stalled_for(now)
            if stalled is not None and not stall_reported:
                run_dir.event("stalled", seconds=round(stalled))
            stall_reported = stalled is not None  # once per stall
            if stall_timeout and freshest.stalled_for(now, stall_timeout) is not None:
                raise RunStopRequested(f"--stall-timeout: no training step for {stall_timeout:g} s (a hung "
                                       f"collective or data loader); see `ddpctl logs {run_dir.run_id}`", "stalled")
            for index, state in enumerate(states):
                if state is None:
                    progress.update(index, None, "unreachable")
                    if now - last_seen[index] > lost_contact_seconds:
                        raise DdpctlError(
                            f"lost contact with node {index} ({labels[index]}) for {lost_contact_seconds:.0f} s; the "
                            f"run goes on there: see `ddpctl status {run_dir.run_id}`, `ddpctl pull {run_dir.run_id}`")
                    continue
                last_seen[index] = now
                record = freshest.record(index)
                notes = " ".join(n for n in (stall_note(stalled) if record else "", extra if index == 0 else "") if n)
                progress.update(index, record, state.label, notes)
            known = [s for s in states if s is not None]
            failed = [(i, s) for i, s in enumerate(states) if s is not None and s.finished and s.exit_code != 0]
            if failed and not failed_reported:
                failed_reported = True
                index, state = failed[0]
                run_dir.event("node_failed", node=index, exit_code=state.exit_code)
                tail = failed_worker_log(session.conn(index), node_workspaces(run_dir)[index], run_dir.spec().python)
                console.print(f"node {index} ({labels[index]}) {state.label}; its log ends with:\n"
                              + without_control_chars(tail), markup=False, highlight=False)
                stop_all(session, run_dir)
            if len(known) == len(states) and all(s.finished for s in known):
                break
            time.sleep(POLL_SECONDS)
    codes = [s.exit_code if s and s.exit_code is not None else 1 for s in states]
    run_dir.event("finished", exit_codes=codes)
    return next((c for c in codes if c != 0), 0)


# launcher/execute/failure_log.py's source runs on the host as it is: `PYTHON -c SCRIPT WORKSPACE LINES`.
FAILURE_LOG_SCRIPT = Path(failure_log.__file__).read_text()


def failed_worker_log(conn: Runner, workspace: str, python: str, lines: int = 20) -> str:
    """The end of the failing worker's log on a node (launcher/execute/failure_log.py), else of torchrun's output."""
    result = conn.run([python, "-c", FAILURE_LOG_SCRIPT, workspace, str(lines)], timeout=30)
    return str(result.stdout if result.exit_code == 0 else log_tail(conn, workspace, lines))


def stop_all(session: HostSession, run_dir: RunDir) -> None:
    workspaces, python = node_workspaces(run_dir), run_dir.spec().python
    outcomes = run_on_hosts(list(range(len(workspaces))),
                            lambda i: stop_node(session.conn(i), workspaces[i], python),
                            timeout=90, label=session.label_of)
    run_dir.event("stopped", errors={o.label: str(o.error) for o in outcomes if o.error})


def pull_run(session: HostSession, run_dir: RunDir) -> list[dict[str, Any]]:
    """Pull every node's outputs into nodes/<k>/ (verified), then copy rank 0's node's records to the top."""
    workspaces, python = node_workspaces(run_dir), run_dir.spec().python

    def pull(index: int) -> dict[str, Any]:
        # A running node rewrites progress.json and snapshots; a file caught mid-change is fetched again
        # (what was already verified is not), a few times.
        for attempt in range(PULL_ATTEMPTS):
            try:
                stats = pull_tree(session.conn(index), workspaces[index], run_dir.path / "nodes" / str(index),
                                  include=PULLED, missing_ok=True, python=python)
                return asdict(stats)
            except TransferChangedError:
                if attempt == PULL_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

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
    primary = primary_node_out(run_dir.path, len(workspaces))
    for name in TOP_LEVEL_FILES:
        if primary and (primary / name).is_file():
            write_bytes_atomic(run_dir.path / name, (primary / name).read_bytes())
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

