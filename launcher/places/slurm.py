"""A Slurm cluster as a place: the scheduler starts the nodes itself (launcher/execute/scheduled.py submits the
batch script through launcher/schedulers/slurm/), launcher/execute/scheduled_reattach.py answers the day-2
commands through the login node."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, SpecError
from launcher.places.option_words import it, listed, they_are
from launcher.places.vast import VAST_ONLY

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.execute.scheduled_reattach import SlurmRun
    from launcher.execute.stacks import StacksTaken
    from launcher.places.option_words import Flags
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.providers.base import HostProvider
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

SLURM_ONLY = ("partition", "time", "account", "qos", "constraint", "workdir", "sbatch_option", "prelude", "requeue",
              "max_requeues")
# What the scheduler decides on a Slurm cluster (the job's nodes, its rendezvous, how it is followed), and what
# only a rented machine has.
NOT_SLURM = ("runtime", "image", "registry", "rdzv_addr", "rdzv_port", "allow_public_rendezvous", "stall_timeout",
             "outputs")
RENTED_ONLY = tuple(name for name in VAST_ONLY if name != "nodes")  # Slurm reads --nodes too


def _job() -> SlurmRun:
    """The executor's answer to the day-2 commands of a Slurm run (imported when asked)."""
    from launcher.execute.scheduled_reattach import SlurmRun

    return SlurmRun()


class SlurmPlace:
    """--provider slurm --host LOGIN_NODE: a batch job; Slurm picks the compute nodes (--nodes)."""

    name = "slurm"
    own_options: tuple[str, ...] = SLURM_ONLY
    own_options_hint = "add --provider slurm --host LOGIN_NODE"
    also_takes: tuple[str, ...] = ("nodes",)
    unused_options: tuple[str, ...] = NOT_SLURM + RENTED_ONLY
    runs_here = False
    allocates_nodes = True
    hosts_per_node = False

    def check_hosts(self, hosts: tuple[object, ...]) -> None:
        if len(hosts) != 1:
            raise SpecError("--provider slurm needs one --host: the cluster's login node (Slurm picks the compute "
                            "nodes; ask for them with --nodes)")

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        not_here = [flag for flag in given if flag in flags(self.unused_options)]
        if not_here:
            places = "--provider vast" if set(not_here) <= flags(VAST_ONLY) else "runs on --host or --provider vast"
            raise SpecError(f"{listed(not_here, 'has', 'have')} no effect on a Slurm job (the batch script "
                            f"decides): {they_are(not_here)} for {places}; drop {it(not_here)}")

    def requests(self, values: dict[str, Any]) -> dict[str, Any]:
        """The SlurmRequest (what to allocate) of the options' values."""
        from launcher.spec.slurm_request import SlurmRequest, max_requeues_asked

        return {"slurm": SlurmRequest(
            nodes=values.get("nodes", 1), partition=values.get("partition"), time=values.get("time"),
            account=values.get("account"), qos=values.get("qos"), constraint=values.get("constraint"),
            workdir=values.get("workdir"), sbatch_options=tuple(values.get("sbatch_option") or ()),
            prelude=tuple(values.get("prelude") or ()),
            max_requeues=max_requeues_asked(values.get("requeue"), values.get("max_requeues")),
            gpus_given=values.get("gpus") is not None)}

    def sweep_entry(self, options: UpOptions, nnodes: int, sweep_dir: Path) -> UpOptions:
        """One job per entry, with its own nodes."""
        return replace(options, slurm=replace(options.slurm, nodes=nnodes)) if options.slurm else options

    def take_stacks(self, run_dir: RunDir, options: UpOptions) -> StacksTaken:
        raise DdpctlError(f"run {run_dir.run_id} is a Slurm job: `ddpctl stacks` reaches runs on this machine and "
                          "on SSH hosts; on the cluster, `scancel --signal=...` its job steps instead")

    def up(self, spec: RunSpec, options: UpOptions) -> UpResult:
        from launcher.execute.scheduled import run_scheduled

        return run_scheduled(spec, options)

    def run_saved(self, plan: RunPlan, options: UpOptions) -> UpResult:
        raise SpecError("a Slurm job's saved plan is its batch script: run it with `ddpctl up --plan FILE`")

    def host_provider(self, options: UpOptions) -> HostProvider:
        raise SpecError("on a Slurm cluster the scheduler finds the nodes itself")

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        return _job().status_rows(run_dir, options)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        _job().print_log(run_dir, node, lines, follow, options)

    def print_rank_log(self, run_dir: RunDir, rank: int, lines: int, follow: bool, options: UpOptions,
                       attempt: int | None) -> None:
        from launcher.execute.rank_logs import print_pulled_rank_log

        print_pulled_rank_log(run_dir, rank, lines, follow, attempt)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        return _job().pull(run_dir, options)

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        return _job().down(run_dir, options, force)

    def print_held(self, runs_dir: Path, json_out: bool) -> None:
        """Nothing listed: a job's allocation ends with the job (`ddpctl down` cancels one that runs)."""

    def held_note(self, runs_dir: Path) -> str | None:
        return None

    def not_pulled_after_down(self, run_id: str, record: dict[str, Any], after_down: bool) -> str:
        from launcher.execute.pull_record import down_on_hosts

        return down_on_hosts(run_id, after_down)
