"""What `up` is asked to do and what it answers: the request and result types every launch path shares.

A leaf module (no launcher imports at run time), so providers, the executor and the command layer can all use
them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.planning.plan import RunPlan
    from launcher.spec.hosts import HostSpec
    from launcher.spec.slurm_request import SlurmRequest
    from launcher.spec.vast_request import VastRequest


@dataclass(frozen=True)
class UpOptions:
    """Where and how to run a spec; everything `up` needs besides the spec itself."""

    runs_dir: Path = Path("runs")
    hosts: tuple[HostSpec, ...] = ()
    runtime: str = "native"
    show_progress: bool = True
    show_output: bool = True  # the live tail of rank 0's output under the progress display (--quiet: False)
    dry_run: bool = False
    probe: bool = True  # a dry run on hosts connects and probes them (read-only); False: plan from options alone
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
    provider: str = ""  # "local", "ssh", "vast" or "slurm"; empty: ssh when hosts are given, else local
    vast: VastRequest | None = None  # what to rent, with provider "vast"
    slurm: SlurmRequest | None = None  # what to allocate, with provider "slurm" (hosts: the login node)
    # Measure the network between the nodes before training and record it (`up --check-bandwidth`).
    check_bandwidth: bool = False
    # Fields the command layer adds to run.json: the resolved options (`options`) and `from_run` (`up --from`).
    record: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpResult:
    """Where a run's results are (None for a dry run), its exit code, its summary.json, and the plan it ran."""

    run_dir: Path | None
    exit_code: int
    summary: dict[str, Any] | None
    plan: RunPlan | None = None
    error: str | None = None  # a dry run whose hosts could not be probed: why (its plan has unknowns)
    scheduled_plan: dict[str, Any] | None = None  # a scheduler's dry run: the plan --save-plan writes
