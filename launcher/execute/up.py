"""`ddpctl up`: one shape for every place whose machines a provider gives (this machine, SSH hosts, rented Vast.ai
machines; launcher/places/ picks the provider): the provider acquires hosts -> read-only probe -> pure plan -> the
executor runs exactly that plan and pulls -> the provider releases them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import RunStopRequested
from launcher.execute.failures.cause import local_failure, teardown_outcome
from launcher.execute.failures.restart_causes import finish_run_records
from launcher.execute.following.before_start import nothing_started_if_interrupted
from launcher.execute.saved_plan import same_plan
from launcher.execute.ship.contents import ship_source, with_shipment
from launcher.execute.this_machine.disk import full_disk_named, raise_if_disk_full
from launcher.execute.this_machine.outputs import LocalOutputs
from launcher.execute.this_machine.run import check_local_run, run_local
from launcher.planning.request import UpOptions, UpResult
from launcher.providers.base import ExecutorCalls
from launcher.results.planned_world import checked_exit_code
from launcher.results.rank_layout import PLAN_FILE
from launcher.results.rundir import RunDir, read_json, write_json_atomic
from launcher.spec.run_spec import RunSpec

if TYPE_CHECKING:
    from launcher.planning.plan import RunPlan
    from launcher.providers.base import AcquiredHosts, HostProvider


def executor_calls() -> ExecutorCalls:
    """What a provider may ask of the executor (it never imports it): the final pull, the interrupting signal."""
    from launcher.execute.following.interruption import last_cause
    from launcher.execute.hosts.run import pull_run

    return ExecutorCalls(pull_run=pull_run, stop_cause=last_cause,
                         nothing_started_if_interrupted=nothing_started_if_interrupted)


def run_on_provider(provider: HostProvider, spec: RunSpec, options: UpOptions, saved: RunPlan | None = None
                    ) -> UpResult:
    """Provider acquires hosts -> read-only probe -> pure plan -> the executor runs exactly that plan and pulls
    -> provider releases them (a dry run: the provider's plan, acquiring nothing it would have to give back).
    With `saved` (up --plan), the plan run is that one, once the hosts are found to give it still."""
    try:
        if options.dry_run:
            result = provider.dry_run(spec, options)
            if result.plan is None:
                return result
            return replace(result, plan=with_shipment(result.plan, Path.cwd(), dry_run=True))
        acquired = provider.acquire(spec, options)
        try:
            result = _run_on_hosts(acquired, saved) if acquired.session is not None else _run_here(acquired, saved)
            return provider.release(result)
        except BaseException as exc:
            provider.release_after_failure(exc)
            raise  # what release_after_failure did not replace with a message (an unexpected error)
    finally:
        provider.close()


def run_acquired(acquired: AcquiredHosts, saved: RunPlan | None = None) -> UpResult:
    """Probe, plan and run on the hosts a provider acquired: what run_on_provider does between acquire and release
    (launcher/places/vast/interruptible_chain.py runs an interruptible run's sets of machines so, one after the
    other)."""
    return _run_on_hosts(acquired, saved)


def _run_on_hosts(acquired: AcquiredHosts, saved: RunPlan | None) -> UpResult:
    """Probe the hosts (each also lists its code cache for what the run ships, in the same round trip), plan,
    then run the plan (launcher/execute/hosts/run.py)."""
    from launcher.execute.hosts.run import run_remote_up
    from launcher.execute.ship.to_hosts import code_cache
    from launcher.planning.probe import plan_probed, probe_hosts
    from launcher.planning.rdzv_reservation import reservation_released
    from launcher.runtimes.choose import choose_runtime

    assert acquired.session is not None
    shipped = (saved.ship.source if saved.ship else None) if saved is not None else ship_source(acquired.spec,
                                                                                                 Path.cwd())[0]
    with nothing_started_if_interrupted("probing the hosts", acquired.run_dir, keep_run_dir=True,
                                        kept_because="it records the machines the provider acquired"):
        probe = probe_hosts(acquired.session, acquired.spec, acquired.options, choose_runtime, acquired.hosts,
                            manifest=code_cache(shipped) if shipped is not None else None)
    with reservation_released(acquired.session, acquired.spec.python, acquired.spec.run_id):  # node 0's port
        plan = plan_probed(acquired.spec, acquired.options, probe, acquired.hosts)
        plan = with_shipment(plan, Path.cwd()) if saved is None else same_plan(saved, plan)
        listed = probe.manifests if plan.ship is not None and plan.ship.source == str(shipped) else None
        return run_remote_up(plan, acquired.options, acquired.session, record_extra=acquired.record,
                             run_dir=acquired.run_dir, watch=acquired.watch, listed=listed)


def _run_here(acquired: AcquiredHosts, saved: RunPlan | None) -> UpResult:
    """This machine: the local checks give the plan (or pass the saved one), then torchrun runs it here, writing
    into the run directory; the plan is kept there as plan.json. With --detach, a process of its own follows the
    run (launcher/execute/this_machine/detach.py) and `up` returns once torchrun has started."""
    spec, options = acquired.spec, acquired.options
    run_path = (options.runs_dir / spec.run_id).resolve()
    plan = check_local_run(spec, run_path)
    plan = plan if saved is None else saved
    with full_disk_named(run_path):  # a full --runs-dir disk: one line, not a traceback
        run_dir = RunDir.create(options.runs_dir, spec, {**acquired.record, **options.record})
        write_json_atomic(run_dir.path / PLAN_FILE, plan.to_json())
        if options.detach:
            from launcher.execute.this_machine.detach import run_detached
            from launcher.results.progress import console

            run_detached(run_dir, lambda: _follow_here(plan, run_dir, options, run_path))
            console.print(f"started run {spec.run_id} on this machine; it runs on without this terminal. Follow "
                          f"with `ddpctl status {spec.run_id}`, `ddpctl logs {spec.run_id} -f`; stop with "
                          f"`ddpctl down {spec.run_id}`. Its files are in {run_dir.path}.",
                          markup=False, highlight=False, soft_wrap=True)
            return UpResult(run_dir.path, 0, None, plan)
        code = _follow_here(plan, run_dir, options, run_path)
    return UpResult(run_dir.path, code, read_json(run_dir.path / "summary.json"), plan)


def _follow_here(plan: RunPlan, run_dir: RunDir, options: UpOptions, run_path: Path) -> int:
    """Run the plan here to its end and record how it ended; the run's exit status."""
    written = LocalOutputs.start(run_dir, plan.nodes[0].cwd) if plan.spec.user_command else None
    try:
        code = run_local(plan, run_dir, show_progress=options.show_progress, show_output=options.show_output,
                         stall_timeout=options.stall_timeout)
    except RunStopRequested:  # stopped by `ddpctl down` or --stall-timeout: what the script wrote is told still
        if written is not None:
            written.finish()
        raise
    if written is not None:
        written.finish()
    raise_if_disk_full(run_path, code)
    local_failure(run_dir, code, plan.spec.python)  # the first failure across ranks, in run.json and events.jsonl
    code = teardown_outcome(run_dir, code)
    return checked_exit_code(run_dir, finish_run_records(run_dir), code)  # the planned world?
