"""A Slurm cluster as a place, all in this folder: the scheduler starts the nodes itself. up.py submits the batch
script (batch_script.py, job_files.py) through the login node (scheduler.py, cluster.py) and follows the job;
recorded_job.py answers the day-2 commands through the login node."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, SpecError
from launcher.places.option_words import it, listed, they_are

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.execute.stacks import StacksTaken
    from launcher.places.option_words import Flags
    from launcher.places.slurm.recorded_job import SlurmRun
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.providers.base import HostProvider
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

SLURM_ONLY = ("partition", "time", "account", "qos", "constraint", "workdir", "sbatch_option", "prelude", "requeue",
              "max_requeues")
# What the scheduler decides on a Slurm cluster (the job's nodes, its rendezvous, how it is followed), and what
# only a rented machine has.
NOT_SLURM = ("runtime", "image", "registry", "rdzv_addr", "rdzv_port", "allow_public_rendezvous", "outputs")


def _job() -> SlurmRun:
    """The executor's answer to the day-2 commands of a Slurm run (imported when asked)."""
    from launcher.places.slurm.recorded_job import SlurmRun

    return SlurmRun()


class SlurmPlace:
    """--provider slurm --host LOGIN_NODE: a batch job; Slurm picks the compute nodes (--nodes)."""

    name = "slurm"
    own_options: tuple[str, ...] = SLURM_ONLY
    own_options_hint = "add --provider slurm --host LOGIN_NODE"
    also_takes: tuple[str, ...] = ("nodes",)
    runs_here = False
    allocates_nodes = True
    hosts_per_node = False

    def __init__(self, rented_options: tuple[str, ...] = ()) -> None:
        """`rented_options`: the options of a place that rents machines (the registry lends them); those Slurm does
        not read itself (--nodes it does) have no effect on a job."""
        self.rented_only = tuple(name for name in rented_options if name not in self.also_takes)
        self.unused_options: tuple[str, ...] = NOT_SLURM + self.rented_only

    def add_commands(self, app: Any) -> None:
        """No commands of its own: `up --provider slurm` and the day-2 commands reach the cluster."""

    def check_hosts(self, hosts: tuple[object, ...]) -> None:
        if len(hosts) != 1:
            raise SpecError("--provider slurm needs one --host: the cluster's login node (Slurm picks the compute "
                            "nodes; ask for them with --nodes)")

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        not_here = [flag for flag in given if flag in flags(self.unused_options)]
        if not_here:
            places = ("--provider vast" if set(not_here) <= flags(self.rented_only)
                      else "runs on --host or --provider vast")
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
        login = None
        if options.probe or not options.dry_run:  # the login node is asked: its handshake begins now
            from launcher.places.slurm.login_session import LoginSession

            login = LoginSession(options)
        try:
            from launcher.places.slurm.up import run_scheduled

            return run_scheduled(spec, options, login=login)
        finally:
            if login is not None:  # closes it only where run_scheduled never took it (an error before)
                login.abandon()

    def run_saved(self, plan: RunPlan, options: UpOptions) -> UpResult:
        raise SpecError("a Slurm job's saved plan is its batch script: run it with `ddpctl up --plan FILE`")

    def run_saved_file(self, path: Path, options: UpOptions) -> UpResult | None:
        """A Slurm job's saved plan: the login node asked again, the same batch script submitted."""
        from launcher.places.slurm.saved_plan import is_scheduled_plan, load_json

        saved = load_json(path)
        if not is_scheduled_plan(saved):
            return None
        from launcher.places.slurm.saved_plan import read_scheduled_plan
        from launcher.places.slurm.up import run_scheduled
        from launcher.spec.hosts import parse_hosts

        spec, request, login, script = read_scheduled_plan(path, saved)
        if (options.runs_dir / spec.run_id).exists():
            raise SpecError(f"--plan {path}: its run {spec.run_id} has run already ({options.runs_dir / spec.run_id}): "
                            "a plan runs once; make a new one with `ddpctl up --dry-run --save-plan FILE`")
        options = replace(options, hosts=tuple(parse_hosts([login])), provider=self.name, slurm=request)
        return run_scheduled(spec, options, saved_script=script)

    def host_provider(self, options: UpOptions) -> HostProvider:
        raise SpecError("on a Slurm cluster the scheduler finds the nodes itself")

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        return _job().status_rows(run_dir, options)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        _job().print_log(run_dir, node, lines, follow, options)

    def print_rank_log(self, run_dir: RunDir, rank: int, lines: int, follow: bool, options: UpOptions,
                       attempt: int | None) -> None:
        _job().print_rank_log(run_dir, rank, lines, follow, options, attempt)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        return _job().pull(run_dir, options)

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        return _job().down(run_dir, options, force)

    def print_held(self, runs_dir: Path, json_out: bool) -> None:
        """Nothing listed: a job's allocation ends with the job (`ddpctl down` cancels one that runs)."""

    def held_note(self, runs_dir: Path) -> str | None:
        return None

    def not_pulled_after_down(self, run_id: str, record: dict[str, Any], after_down: bool) -> str:
        """The job's folder on the shared file system (not the hosts' ~/.ddpctl/runs/) keeps what was not pulled."""
        folder = (record.get("slurm") or {}).get("remote_dir") or f"the job's folder of run {run_id} on the cluster"
        if after_down:
            return f"what was not pulled stays on the cluster, in {folder}/"
        return (f"`ddpctl pull {run_id}` once the job has ended (or `ddpctl down {run_id}`) pulls it again; until "
                f"then it stays on the cluster, in {folder}/")
