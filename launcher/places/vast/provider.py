"""`ddpctl up --provider vast`: rent machines, run on them exactly as on SSH hosts, bring everything back, and
stop the bill.

Order: offers (nothing is rented for bad filters), run directory, provision (each instance id written to
run.json the moment it exists), SSH with trust on first use for these instances only, overlay addresses,
then the hosts go to the executor (launcher.execute.up) with a cost watch; teardown with --down, on --max-cost,
and on any failure.

Host keys: Vast.ai's API does not report an instance's SSH host key, so the first key an instance shows is
trusted, and only for instances this `up` has just created through the authenticated API (we asked for this
instance, the API told us where it listens, and we connect within seconds). That key is recorded in the run's
own known_hosts file (runs/<id>/known_hosts); every later connection (reconnects, status, pull, down) requires
the same key and refuses a changed one. A key already in ~/.ssh/known_hosts for that address must match too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from launcher.errors import AuthenticationFailed, DdpctlError, HostsFailed, Interrupted, RunStopRequested, SpecError
from launcher.execute.following.stall_watch import STALL_REASON
from launcher.places.vast.apikey import vast_client
from launcher.places.vast.autostop import arm_autostop
from launcher.places.vast.image_labels import ImageNeeds, image_needs_for
from launcher.places.vast.ledger import Ledger, destroy_all, live, open_intents, say, write_summary_cost
from launcher.places.vast.market import chosen_summary, find_offers, first_machines, offer_note, pull_reserve_usd
from launcher.places.vast.models import Offer, RentedInstance
from launcher.places.vast.overlay import overlay_hosts
from launcher.places.vast.provision import provision
from launcher.places.vast.registry_login import registry_login
from launcher.places.vast.sshkey import ensure_vast_ssh_key
from launcher.planning.plan import NodeHost, plan_remote
from launcher.providers.base import AcquiredHosts, ExecutorCalls
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec
from launcher.spec.vast_request import VastRequest
from launcher.transport.hostsession import HostSession
from launcher.transport.ssh import SSHTarget

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient
    from launcher.planning.request import UpOptions, UpResult

AUTH_WAIT_S = 90.0  # a key attached to an instance may take a little while to reach its authorized_keys


class CostWatch:
    """Called on every poll of a running run: the live cost for the display; stops the run before the spend
    would pass --max-cost (keeping `reserve_s` seconds of spend for the final pull and teardown)."""

    def __init__(self, ledger: Ledger, max_cost: float | None, reserve_s: float, reserve_usd: float = 0.0) -> None:
        self.ledger, self.max_cost, self.reserve_s = ledger, max_cost, reserve_s
        self.reserve_usd = reserve_usd  # bandwidth the final pull will cost (market.pull_reserve_usd)

    def __call__(self) -> str:
        cost, rate = self.ledger.cost(), self.ledger.hourly_rate()
        if self.max_cost is not None and cost + rate * self.reserve_s / 3600 + self.reserve_usd >= self.max_cost:
            self.ledger.run_dir.event("vast.max_cost_reached", cost_usd=cost, max_cost=self.max_cost,
                                      reserve_s=self.reserve_s)
            # kept in run.json and, by write_summary_cost, in summary.json: the run ended on the budget
            self.ledger.run_dir.update_record(max_cost_reached={"cost_usd": round(cost, 6),
                                                                "max_cost": self.max_cost})
            raise RunStopRequested(f"--max-cost ${self.max_cost:g} reached: ${cost:.4f} spent, and stopping, "
                                   f"pulling and destroying take about {self.reserve_s:g} s more at "
                                   f"${rate:.2f}/hour", "max-cost")
        return f"${cost:.4f} (${rate:.2f}/h)"


class VastProvider:
    """Rents `nodes` machines and hands them to the executor (native runtime: our image is the machine); destroys
    them with --down, at --max-cost, or on any failure (see launcher.providers.base.HostProvider)."""

    def __init__(self, options: UpOptions, calls: ExecutorCalls) -> None:
        self.calls = calls
        self.req: VastRequest = options.vast or VastRequest()
        if not options.image:
            raise SpecError("--provider vast needs --image REF: the image Vast.ai starts on each machine (a registry "
                            "reference such as docker.io/you/ddpctl:1, pushed with `ddpctl image push`)")
        if self.req.autostop_minutes is not None and not options.detach:
            raise SpecError("--autostop acts on detached runs (--detach): a followed run ends with `up`, or with "
                            "--down destroys its machines")
        if options.detach and (self.req.down or self.req.max_cost is not None):
            raise SpecError("--down and --max-cost act while `up` follows the run: drop --detach (a detached run's "
                            "machines bill until `ddpctl down`)")
        self.options = options
        self._client: VastClient | None = None
        self._session: HostSession | None = None
        self._ledger: Ledger | None = None
        self.image_needs: ImageNeeds | None = None  # read from the image once, before the offers are searched
        self.bid_for: Callable[[Offer], float] | None = None  # interruptible: the bid on each offer (interruptible.py)

    def _offers(self, spec: RunSpec) -> tuple[RunSpec, list[Offer]]:
        req = self.req
        spec = spec.with_layout(nnodes=req.nodes, nproc_per_node=spec.nproc_per_node)
        self._client = self._client or vast_client()
        self.image_needs = self.image_needs or image_needs_for(str(self.options.image), req.registry_login)
        offers = find_offers(self._client, spec, req, None if self.options.auto_gpus else spec.nproc_per_node,
                             self.image_needs)
        say(self.image_needs.note)
        return spec, offers

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan on the offers that would be rented (nothing is rented)."""
        spec, offers = self._offers(spec)
        return _dry_run(spec, offers, self.req, options.auto_gpus)

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """Rent, connect (first host key of each new instance trusted), find overlay addresses; a failure after
        renting destroys what was rented before it propagates."""
        req = self.req
        spec, offers = self._offers(spec)
        client = self._client
        assert client is not None
        login = registry_login(str(options.image)) if req.registry_login else None  # bad input: before renting
        key_path, public_key = ensure_vast_ssh_key()
        run_dir = RunDir.create(options.runs_dir, spec, {"provider": "vast", "runtime": "native", "instances": [],
                                                         "vast": {"label": spec.run_id, "image": options.image,
                                                                  "disk": req.disk, "max_cost": req.max_cost,
                                                                  "image_needs": self.image_needs.to_json()
                                                                  if self.image_needs else None}})
        ledger = self._ledger = Ledger(run_dir)
        rented = _provision(client, offers, spec, options, req, ledger, public_key, login,  # cleans up after itself
                             self.calls.stop_cause, bid_for=self.bid_for)
        try:  # from here on, whatever goes wrong destroys what this `up` rented (or says why it cannot)
            _report_rented(ledger, rented)
            targets = [SSHTarget(label=f"vast:{r.instance_id}", hostname=r.ssh_host, port=r.ssh_port,
                                 user=r.ssh_user, identity_files=(str(key_path),)) for r in rented]
            self._session = HostSession(targets, replace(options, accept_new_host_keys=True),
                                        settings={"known_hosts_file": str(run_dir.path / "known_hosts")})
            return _reach(spec, options, req, self._session, rented, ledger)
        except BaseException as exc:
            self.release_after_failure(exc)
            raise

    def release(self, result: UpResult) -> UpResult:
        """With --down, destroy the machines (the results are pulled and verified); else say they keep billing."""
        assert self._client is not None and self._ledger is not None
        if self.options.detach and self._session is not None:
            arm_autostop(self._client, self._session, self._ledger, self.req.autostop_minutes)
        return _finish(self._client, self.options, self.req, self._ledger, result)

    def release_after_failure(self, error: BaseException) -> None:
        """Destroy exactly what this `up` rented, unless it holds results that could not be pulled."""
        if self._client is None or self._ledger is None:
            return  # nothing was rented
        _after_failure(self._client, self._session, self._ledger, error, self.calls)

    def close(self) -> None:
        """Close the SSH connections and the API client."""
        if self._session is not None:
            self._session.close()
        if self._client is not None:
            self._client.close()


def _dry_run(spec: RunSpec, offers: list[Offer], req: VastRequest, auto_gpus: bool) -> UpResult:
    """The plan on the offers that fit now, what only renting tells named in its `unknown` (so it never runs)."""
    from launcher.planning.request import UpResult

    picked = first_machines(offers, req.nodes)
    hosts = [NodeHost(f"vast offer {o.id} ({o.num_gpus}x {o.gpu_name}, ${o.hourly_price(req.disk):.3f}/h"
                      f"{offer_note(o)})", f"NODE{k}_OVERLAY_ADDR" if req.nodes > 1 else None)
             for k, o in enumerate(picked)]
    say(chosen_summary(picked, req))
    unknown = ["machines: the offers shown fit now; `up` rents those still free then (shown as the offers)"]
    if req.nodes > 1:
        unknown.append("node addresses: each machine's overlay network address, given once it is rented (shown as "
                       "NODE<k>_OVERLAY_ADDR)")
    if auto_gpus:
        unknown.append(f"processes per node: one per GPU of the machines rented (the offers shown have "
                       f"{min(o.num_gpus for o in picked)}; shown as {spec.nproc_per_node})")
    plan = plan_remote(spec, hosts, hosts[0].address or "127.0.0.1")
    return UpResult(None, 0, None, replace(plan, unknown=tuple(unknown)))


def _provision(client: VastClient, offers: list[Offer], spec: RunSpec, options: UpOptions, req: VastRequest,
               ledger: Ledger, public_key: str, login: str | None, stop_cause: Callable[[], str],
               label: str | None = None, bid_for: Callable[[Offer], float] | None = None) -> list[RentedInstance]:
    run_dir = ledger.run_dir
    run_dir.event("vast.provisioning", nodes=req.nodes, image=options.image, candidates=[o.id for o in offers[:20]])
    say(f"renting {req.nodes} Vast.ai machine(s) for run {spec.run_id} (image {options.image})")
    try:
        rented = provision(client, offers, nodes=req.nodes, image=str(options.image), disk=req.disk,
                           label=label or spec.run_id, ssh_public_key=public_key, ready_timeout=req.ready_timeout,
                           poll_interval=req.poll_interval, on_event=ledger.on_provision_event,
                           image_login=login, bid_for=bid_for)
    except BaseException as exc:
        # provision destroyed what it created (each destruction is in events.jsonl and run.json)
        left = [i["instance_id"] for i in live(ledger.instances)]
        unsure = [i["offer_id"] for i in open_intents(ledger.intents)]
        run_dir.event("vast.provision_ended", error=str(exc) or type(exc).__name__, still_rented=left,
                      unresolved_creates=unsure)
        note = (f"; instance(s) {left} could not be verified destroyed: check https://console.vast.ai" if left
                else f"; the {len(ledger.instances)} instance(s) it created were destroyed" if ledger.instances
                else "" if unsure else "; nothing was rented")
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted(f"stopped by {stop_cause()} while renting{note}") from None
        if isinstance(exc, DdpctlError):
            raise DdpctlError(f"{exc}{note}") from None
        raise
    return rented


def _report_rented(ledger: Ledger, rented: list[RentedInstance]) -> None:
    ledger.rented(rented)
    for r in rented:
        say(f"  vast:{r.instance_id}: {r.offer.num_gpus}x {r.offer.gpu_name} at {r.ssh_host}:{r.ssh_port}, "
            f"${r.dph:.4f}/hour")


def _reach(spec: RunSpec, options: UpOptions, req: VastRequest, session: HostSession, rented: list[RentedInstance],
           ledger: Ledger) -> AcquiredHosts:
    """Reach the new instances and find their overlay addresses: the hosts the executor runs on."""
    _connect_new_instances(session)
    hosts = None
    if len(rented) > 1:
        hosts = overlay_hosts(session, rented, spec.python)
        ledger.set_overlay_ips({r.instance_id: h.address for r, h in zip(rented, hosts, strict=True) if h.address})
    watch = CostWatch(ledger, req.max_cost, req.max_cost_reserve_s, pull_reserve_usd(rented))
    watch()  # the budget may not even cover starting
    record: dict[str, Any] = {"provider": "vast", "instances": ledger.instances}
    return AcquiredHosts(spec, replace(options, runtime="native", accept_new_host_keys=False), session, hosts=hosts,
                         record=record, run_dir=ledger.run_dir, watch=watch)


def _connect_new_instances(session: HostSession) -> None:
    """Connect to every just-created instance, trusting and recording each one's first host key (see the module
    docstring); retry while our key is still on its way to the instance."""
    deadline = time.monotonic() + AUTH_WAIT_S
    while True:
        try:
            session.connect_all()
            break
        except DdpctlError as exc:
            if not _refused_our_key(exc) or time.monotonic() > deadline:
                raise
            time.sleep(3.0)
        finally:
            for index in range(len(session.targets)):
                conn = session.conn(index)  # once a key is recorded, only that key is accepted
                if conn.known_hosts.lookup(conn.target.key_name):
                    conn.accept_new_host_keys = False
    for index in range(len(session.targets)):
        session.conn(index).accept_new_host_keys = False
    session.options = replace(cast("UpOptions", session.options), accept_new_host_keys=False)


def _refused_our_key(exc: DdpctlError) -> bool:
    """Whether connecting failed because a host refused our key (still on its way there), not for another reason."""
    errors = exc.errors if isinstance(exc, HostsFailed) else (exc,)
    return any(isinstance(error, AuthenticationFailed) for error in errors)


def _after_failure(client: VastClient, session: HostSession | None, ledger: Ledger, exc: BaseException,
                   calls: ExecutorCalls) -> None:
    """A failure after provisioning: destroy exactly what this `up` created, and say what happened. Results
    that training wrote but that could not be pulled and verified keep their machines (they hold the only copy)."""
    run_dir = ledger.run_dir
    stopped = isinstance(exc, RunStopRequested)
    interrupted = isinstance(exc, KeyboardInterrupt | Interrupted)
    reason = exc.reason if isinstance(exc, RunStopRequested) else "interrupted" if interrupted else "up failed"
    run_dir.event("vast.up_failed", reason=reason, error=str(exc) or type(exc).__name__)
    started = any(e.get("event") == "started" for e in run_dir.events())
    if session is not None and started and not (stopped or interrupted):  # those two pulled before raising
        problem = _final_pull(calls, session, run_dir)
        if problem:
            run_dir.event("vast.kept_for_results", error=problem)
            raise DdpctlError(f"{exc}\nthe results could not be pulled and verified ({problem}), so the "
                              f"{len(live(ledger.instances))} machine(s) are kept and KEEP BILLING: retry with "
                              f"`ddpctl down {run_dir.run_id}` (add --force to destroy them anyway)") from None
    if (stopped or interrupted) and not_pulled_after_stop(run_dir):
        # The stop's pull was interrupted or failed: the machines hold the only copy of what was not pulled.
        run_dir.event("vast.kept_for_results", error="the pull after the stop did not finish")
        kept = (f"{exc}\nthe {len(live(ledger.instances))} rented machine(s) hold what was not pulled, so they are "
                f"kept and KEEP BILLING: `ddpctl down {run_dir.run_id}` pulls, verifies and destroys them (add "
                "--force to destroy them anyway)")
        raise (Interrupted(kept) if interrupted else DdpctlError(kept)) from None
    cost = destroy_all(client, ledger, reason)
    done = f"the rented machines were destroyed (verified); the run cost ${cost:.4f}"
    if stopped:
        # --stall-timeout's line is worded as on every other place (stall_watch.stall_line); the stops Vast alone
        # makes (--max-cost, a lost machine) say that they stopped the run.
        said = str(exc) if isinstance(exc, RunStopRequested) and exc.reason == STALL_REASON else f"stopped: {exc}"
        raise DdpctlError(f"{said}{'' if started else ' (before training started)'}; {done}") from None
    if interrupted:
        before_start = isinstance(exc, Interrupted) and not started  # its line says nothing ran (before_start.py)
        said = (str(exc) if before_start
                else f"stopped by {calls.stop_cause()}; what the nodes wrote is in {run_dir.path}")
        raise Interrupted(f"{said}; {done}") from None
    if isinstance(exc, DdpctlError):
        raise DdpctlError(f"{exc}\n{done}") from None


def not_pulled_after_stop(run_dir: RunDir) -> bool:
    """Whether the last stop of an interrupted or stopped run ended without its pull (its `outcome` event)."""
    outcomes = [e for e in run_dir.events() if e.get("event") == "outcome"]
    return bool(outcomes) and outcomes[-1].get("pulled") is False


def _final_pull(calls: ExecutorCalls, session: HostSession, run_dir: RunDir) -> str | None:
    try:
        calls.pull_run(session, run_dir)
    except DdpctlError as exc:
        return str(exc).splitlines()[0]
    except KeyboardInterrupt:
        return None  # Ctrl-C while we pull means: stop paying now
    return None


def _finish(client: VastClient, options: UpOptions, req: VastRequest, ledger: Ledger, result: UpResult) -> UpResult:
    """With --down: destroy the machines now that the results are pulled and verified. Otherwise say loudly
    that they keep billing. Either way the cost goes into run.json, summary.json and the summary table."""
    run_id = ledger.run_dir.run_id
    if req.down and not options.detach:
        cost = destroy_all(client, ledger, "up --down")
        say(f"destroyed the {len(ledger.instances)} Vast.ai instance(s) of run {run_id} (verified); "
            f"the run cost ${cost:.4f}")
    else:
        ledger.save()
        cost = ledger.cost()
        write_summary_cost(ledger.run_dir, cost)  # so far: `ddpctl down` writes the final figure
        rate = ledger.hourly_rate()
        unwatched = " (--max-cost is no longer watched)" if req.max_cost is not None else ""
        say(f"the {len(live(ledger.instances))} Vast.ai machine(s) of run {run_id} KEEP BILLING "
            f"(${rate:.4f}/hour; ${cost:.4f} so far) until you run `ddpctl down {run_id}`{unwatched}",
            style="bold yellow")
    summary = dict(result.summary) if result.summary else None
    if summary is not None:
        summary["cost_usd"] = round(cost, 6)
        summary["cost_split"] = ledger.run_dir.record().get("cost_split")
    return replace(result, summary=summary)
