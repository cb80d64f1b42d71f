"""`ddpctl up`: validate, plan, then run — locally, on SSH hosts, or on rented Vast.ai machines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.execute.local import check_local_gpus, check_local_programs, local_gpu_count, run_local
from launcher.execute.local_checks import check_local_rendezvous
from launcher.execute.request import UpOptions, UpResult
from launcher.planning.plan import RunPlan, plan_local
from launcher.results.rundir import RunDir, read_json
from launcher.spec.datasets import check_local_data
from launcher.spec.run_spec import RunSpec
from launcher.spec.strategies import check_gpus

if TYPE_CHECKING:
    from launcher.providers.base import HostProvider


def run_up(spec: RunSpec, options: UpOptions) -> UpResult:
    """Run one experiment to its end (or plan it, with dry_run) and return where its results are."""
    if options.provider == "vast":
        from launcher.providers.vast.provider import VastProvider

        return run_on_provider(VastProvider(options), spec, options)
    if options.hosts:
        from launcher.providers.ssh_hosts import SshHosts

        return run_on_provider(SshHosts(), spec, options)
    return _run_local_up(spec, options)


def run_on_provider(provider: HostProvider, spec: RunSpec, options: UpOptions) -> UpResult:
    """Provider acquires hosts -> read-only probe -> pure plan -> the executor runs exactly that plan and pulls
    -> provider releases them (a dry run: the provider's plan, acquiring nothing it would have to give back)."""
    from launcher.execute.on_hosts import run_remote_up
    from launcher.planning.probe import plan_probed, probe_hosts

    try:
        if options.dry_run:
            return provider.dry_run(spec, options)
        acquired = provider.acquire(spec, options)
        try:
            probe = probe_hosts(acquired.session, acquired.spec, acquired.options, acquired.hosts)
            plan = plan_probed(acquired.spec, acquired.options, probe, acquired.hosts)
            result = run_remote_up(plan, acquired.options, acquired.session, record_extra=acquired.record,
                                   run_dir=acquired.run_dir, watch=acquired.watch)
            return provider.release(result)
        except BaseException as exc:
            provider.release_after_failure(exc)
            raise  # what release_after_failure did not replace with a message (an unexpected error)
    finally:
        provider.close()


def check_local_run(spec: RunSpec, run_path: Path | None = None) -> RunPlan:
    """What a run on this machine needs before anything is written: the data set, enough GPUs, a python (and
    the `-- CMD` program) that can start. Returns the run's plan (for a run directory at run_path)."""
    if not spec.user_command:
        check_local_data(spec.dataset, spec.data_dir)
    check_local_gpus(spec.nproc_per_node)
    check_gpus(spec.strategy, spec.devices, spec.nproc_per_node, local_gpu_count(), "this machine")
    check_local_rendezvous()
    plan = plan_local(spec, str(run_path or Path(spec.run_id).resolve()), cwd=os.getcwd())
    check_local_programs(plan)
    return plan


def _run_local_up(spec: RunSpec, options: UpOptions) -> UpResult:
    if spec.nnodes != 1:
        raise ValueError("a local run has one node")
    run_path = (options.runs_dir / spec.run_id).resolve()
    plan = check_local_run(spec, run_path)
    if options.dry_run:
        return UpResult(None, 0, None, plan)
    run_dir = RunDir.create(options.runs_dir, spec, {"hosts": [], "runtime": "native", "provider": "local",
                                                       **options.record})
    code = run_local(plan, run_dir, show_progress=options.show_progress)
    return UpResult(run_dir.path, code, read_json(run_dir.path / "summary.json"), plan)
