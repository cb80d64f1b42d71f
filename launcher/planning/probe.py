"""Probe a run's hosts, one round trip per host (launcher/planning/host_round.py: what the host is, its Docker
engine or MPI check, and node 0's rendezvous port, which the other nodes connect to), then decide everything the
plan needs from what was found: runtime `auto`, processes per node, addresses, the rendezvous port. Read-only,
but for node 0's port reservation in a run that is not a dry run (released if the probe refuses the run).
`plan_probed` and `plan_unprobed` are pure; the executor runs the plan they return."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import DdpctlError, SpecError
from launcher.planning.clock_offset import widest_skew
from launcher.planning.facts import HostFacts
from launcher.planning.host_round import probe_all
from launcher.planning.mpi_check import mpi_check_argv, mpi_problems
from launcher.planning.mpi_plan import mpi_nodes
from launcher.planning.plan import NodeHost, RunPlan, plan_remote
from launcher.planning.preflight import (
    REACH_TIMEOUT,
    Problem,
    check_public_rendezvous,
    check_requirements,
    reached_port,
)
from launcher.planning.rdzv_reservation import listen_request, release_reservation
from launcher.spec.strategies import check_gpus
from launcher.transport.parallel import raise_for_errors

if TYPE_CHECKING:
    from launcher.planning.plan import NodeRuntime
    from launcher.planning.request import UpOptions
    from launcher.spec.run_spec import RunSpec
    from launcher.transport.hostsession import HostSession



class RuntimeChoice(Protocol):
    """How the probe picks the run's runtime from the hosts (launcher.runtimes.choose.choose_runtime: planning
    knows runtimes only through this): what each host checks within its probe round trip, then the runtime, and
    for docker whether each host's engine has the NVIDIA runtime."""

    def host_checks(self, options: UpOptions) -> list[list[str]]: ...

    def choose(self, options: UpOptions, labels: Sequence[str], answers: Sequence[Any]
               ) -> tuple[NodeRuntime, tuple[bool, ...] | None]: ...


# Processes per node on CPU-only hosts when --gpus is not given: enough to exercise DDP.
CPU_PROCS = 2


@dataclass(frozen=True)
class HostProbe:
    """What the probe found: each host's facts, the runtime chosen from them, the rendezvous port node 0 has free,
    (docker) whether each host's engine has the NVIDIA runtime, and each host's listing of the folder it was asked
    to list (the code cache: its manifest's JSON data, which shipping reads; none unless asked)."""

    facts: tuple[HostFacts, ...]
    runtime: NodeRuntime
    rdzv_port: int
    engine_gpus: tuple[bool, ...] | None = None
    first_hostname: str = ""  # node 0's SSH hostname: the rendezvous address when no better one is known
    manifests: tuple[Any, ...] = ()


def procs_per_node(spec: RunSpec, options: UpOptions, facts: tuple[HostFacts, ...]) -> int:
    """--gpus, or without it one process per GPU of the host with the fewest (CPU-only hosts: up to CPU_PROCS)."""
    if not options.auto_gpus:
        return spec.nproc_per_node
    return min(f.gpus or min(CPU_PROCS, f.cpus) for f in facts)


def node_hosts(options: UpOptions, probe: HostProbe, provider_hosts: list[NodeHost] | None
               ) -> tuple[list[NodeHost], str]:
    """Each node's host as the plan needs it, and node 0's rendezvous address."""
    hosts = provider_hosts or [NodeHost(f.label, f.address, f.iface_of(f.address)) for f in probe.facts]
    if probe.engine_gpus is not None:
        hosts = [replace(h, gpus=g) for h, g in zip(hosts, probe.engine_gpus, strict=True)]
    return hosts, options.rdzv_addr or hosts[0].address or probe.first_hostname


def probe_hosts(session: HostSession, spec: RunSpec, options: UpOptions, choose_runtime: RuntimeChoice,
                provider_hosts: list[NodeHost] | None = None, manifest: str | None = None) -> HostProbe:
    """Probe every host in one round trip each (node 0 first when there are several: it listens on the rendezvous
    port the others then connect to) and refuse what cannot run: missing torch, too few GPUs, a public or
    unreachable rendezvous address; `choose_runtime` picks the runtime. Raises a DdpctlError naming every failing
    host. A run that is not a dry run reserves node 0's rendezvous port (launcher/planning/rdzv_reservation.py),
    and releases it when the probe refuses the run or is interrupted. `manifest`: a folder every host lists in
    the same round trip (the code cache that shipping then compares, HostProbe.manifests)."""
    count = len(session.targets)
    # Only torchrun runs in a container: another --launcher makes `auto` native (`docker` was refused).
    chosen = options if spec.launcher == "torchrun" else replace(options, runtime="native")
    runtime_checks = choose_runtime.host_checks(chosen)

    def checks(index: int) -> list[list[str]]:
        mpi = mpi_check_argv(spec, index, count)
        return runtime_checks + ([mpi] if mpi else [])

    run_id = None if options.dry_run else spec.run_id
    listen = None
    if count > 1:  # the address the plan will give node 0 (node_hosts), found by node 0 itself when not given
        given = options.rdzv_addr or (provider_hosts[0].address if provider_hosts else None)
        listen = listen_request(addr=given, own=not provider_hosts, hostname=session.targets[0].hostname,
                                port=spec.rdzv_port, expect=count - 1, seconds=REACH_TIMEOUT + 20,
                                any_free=options.auto_rdzv_port, allow_public=options.allow_public_rendezvous,
                                run_id=run_id)
    conns = [session.conn(i) for i in range(count)]
    try:  # an interruption while node 0 reserves may come after its reservation was made there: released too
        outcomes = probe_all(conns, session.labels, spec.python, checks=checks, listen=listen,
                             connect_timeout=REACH_TIMEOUT, manifest=manifest, timeout=options.connect_timeout + 90)
        return _judged(spec, options, choose_runtime, chosen, session, outcomes, provider_hosts)
    except BaseException:
        if listen is not None and run_id is not None:  # best effort: one left behind goes stale by rule
            with contextlib.suppress(Exception):
                release_reservation(conns[0], spec.python, run_id, wait=0)
        raise


def _judged(spec: RunSpec, options: UpOptions, choose_runtime: RuntimeChoice, chosen: UpOptions,
            session: HostSession, outcomes: list[Any], provider_hosts: list[NodeHost] | None) -> HostProbe:
    """The probe's findings from every host's answer, or the first reason to refuse the run: a host that did not
    answer, requirements not met, a public rendezvous address, node 0's port taken, a node that cannot reach it."""
    answers = raise_for_errors(outcomes, "preflight")
    facts = tuple(a.facts for a in answers)
    runtime_count = len(choose_runtime.host_checks(chosen))
    runtime, engine_gpus = choose_runtime.choose(chosen, session.labels,
                                                 [a.checks[0] for a in answers] if runtime_count else [])
    procs = procs_per_node(spec, options, facts)
    # An MPI job's script may need no torch: what it needs is checked by mpi_problems.
    problems = check_requirements(list(facts), procs, spec=spec,
                                  runs_host_torch=runtime.runs_host_torch and spec.launcher != "mpirun")
    if spec.launcher == "mpirun":
        problems += mpi_problems(session.labels, [a.checks[runtime_count].stdout for a in answers])
    problems += strategy_problems(spec, procs, facts)
    skew = widest_skew(session.labels, [a.clock for a in answers])
    if skew is not None and skew.matters:
        problems.append(Problem(None, skew.problem()))
    if problems:
        raise DdpctlError("preflight failed:\n" + "\n".join(f"  {p}" for p in problems))
    probe = HostProbe(facts, runtime, spec.rdzv_port, engine_gpus, session.targets[0].hostname,
                      tuple(a.manifest for a in answers))
    if len(facts) < 2:
        return probe
    _hosts, addr0 = node_hosts(options, probe, provider_hosts)
    check_public_rendezvous(addr0, list(facts), options.allow_public_rendezvous)
    if answers[0].addr != addr0:
        raise AssertionError(f"node 0 listened on {answers[0].addr}, the plan gives it {addr0}")
    return replace(probe, rdzv_port=reached_port(outcomes, session.labels, addr0, spec.rdzv_port))


def strategy_problems(spec: RunSpec, procs: int, facts: tuple[HostFacts, ...]) -> list[Problem]:
    """Hosts with too few GPUs for the strategy (dp, mp, ddp-mp), found before anything starts on any host."""
    problems = []
    for f in facts:
        try:
            check_gpus(spec.strategy, spec.devices, procs, f.gpus, "the host")
        except SpecError as exc:
            problems.append(Problem(f.label, str(exc)))
    return problems


def plan_probed(spec: RunSpec, options: UpOptions, probe: HostProbe,
                provider_hosts: list[NodeHost] | None = None) -> RunPlan:
    """The plan that runs, decided from the probe alone (pure)."""
    spec = spec.with_layout(nnodes=len(probe.facts), nproc_per_node=procs_per_node(spec, options, probe.facts))
    spec = replace(spec, rdzv_port=probe.rdzv_port)
    hosts, addr0 = node_hosts(options, probe, provider_hosts)
    plan = plan_remote(spec, hosts, addr0, probe.runtime)
    if spec.launcher == "mpirun" and spec.nnodes > 1:
        plan = replace(plan, nodes=mpi_nodes(spec, plan.nodes, probe.facts))
    return replace(plan, pull_image=bool(options.registry and plan.image), node_facts=probe.facts)


def plan_unprobed(spec: RunSpec, options: UpOptions, runtime: NodeRuntime,
                  provider_hosts: list[NodeHost] | None = None) -> RunPlan:
    """The plan from the options alone, for a dry run that did not probe the hosts, its nodes run by `runtime`
    (launcher.runtimes.choose.runtime_unprobed): what only the hosts can tell is shown with a placeholder and
    named in `unknown` (pure)."""
    spec = spec.with_layout(nnodes=len(options.hosts) or spec.nnodes, nproc_per_node=spec.nproc_per_node)
    hosts = provider_hosts or [NodeHost(h.text, h.hostname) for h in options.hosts]
    if spec.nnodes > 1 and options.rdzv_addr:  # judged without connecting; the nodes' own when probed
        check_public_rendezvous(options.rdzv_addr, [], options.allow_public_rendezvous)
    unknown = []
    if options.runtime == "auto" and spec.launcher == "torchrun":
        unknown.append("runtime: auto is docker when every host has a working Docker engine, else native "
                       "(shown as native)")
    if options.auto_gpus:
        unknown.append(f"processes per node: one per GPU of the hosts, up to {CPU_PROCS} on CPU-only hosts "
                       f"(shown as {spec.nproc_per_node})")
    if spec.nnodes > 1:
        if options.auto_rdzv_port:
            unknown.append(f"rendezvous port: {spec.rdzv_port} unless taken on node 0, then one it has free")
        if not options.rdzv_addr:
            unknown.append("node addresses and network interfaces (shown as the names given)")
    plan = plan_remote(spec, hosts, options.rdzv_addr, runtime)
    if spec.launcher == "mpirun" and spec.nnodes > 1:
        plan = replace(plan, nodes=mpi_nodes(spec, plan.nodes, ()))
        unknown.append("the hosts' home folders, where mpirun starts each node's processes (shown as ~)")
    return replace(plan, pull_image=bool(options.registry and plan.image), unknown=tuple(unknown))
