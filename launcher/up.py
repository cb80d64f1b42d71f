"""`ddpctl up`: validate, plan, then run — locally, on SSH hosts, or on rented Vast.ai machines."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.datasets import check_local_data
from launcher.hosts import HostSpec
from launcher.local import check_local_gpus, check_local_programs, run_local
from launcher.local_checks import check_local_rendezvous
from launcher.plan import RunPlan, plan_local
from launcher.rundir import RunDir, read_json
from launcher.spec import RunSpec

if TYPE_CHECKING:
    from launcher.vast.rented_run import VastRequest


@dataclass(frozen=True)
class UpOptions:
    """Where and how to run a spec; everything `up` needs besides the spec itself."""

    runs_dir: Path = Path("runs")
    hosts: tuple[HostSpec, ...] = ()
    runtime: str = "native"
    show_progress: bool = True
    dry_run: bool = False
    detach: bool = False
    identity_file: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    rdzv_addr: str | None = None
    image: str | None = None
    registry: str | None = None  # hosts `docker pull` this reference instead of receiving our local image
    ssh_config: Path | None = None
    # No --gpus with hosts: one process per GPU of the hosts (the fewest any has), or 2 on CPU-only hosts.
    auto_gpus: bool = False
    # No --rdzv-port: when the default port is taken on node 0 (another run), use one the host picks.
    auto_rdzv_port: bool = False
    allow_public_rendezvous: bool = False
    # Hosts: stop every node and pull when training has not moved for this many seconds (0: only say so).
    stall_timeout: float = 0.0
    provider: str = ""  # "local", "ssh" or "vast"; empty: ssh when hosts are given, else local
    vast: VastRequest | None = None  # what to rent, with provider "vast"


@dataclass(frozen=True)
class UpResult:
    run_dir: Path | None
    exit_code: int
    summary: dict[str, Any] | None
    plan: RunPlan | None = None


def run_up(spec: RunSpec, options: UpOptions) -> UpResult:
    """Run one experiment to its end (or plan it, with dry_run) and return where its results are."""
    if options.provider == "vast":
        from launcher.vast.rented_run import run_vast_up

        return run_vast_up(spec, options)
    if options.hosts:
        from launcher.remote import run_remote_up

        return run_remote_up(spec, options)
    return _run_local_up(spec, options)


def check_local_run(spec: RunSpec, run_path: Path | None = None) -> RunPlan:
    """What a run on this machine needs before anything is written: the data set, enough GPUs, a python (and
    the `-- CMD` program) that can start. Returns the run's plan (for a run directory at run_path)."""
    if not spec.user_command:
        check_local_data(spec.dataset, spec.data_dir)
    check_local_gpus(spec.nproc_per_node)
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
    run_dir = RunDir.create(options.runs_dir, spec, {"hosts": [], "runtime": "native", "provider": "local"})
    code = run_local(plan, run_dir, show_progress=options.show_progress)
    return UpResult(run_dir.path, code, read_json(run_dir.path / "summary.json"), plan)
