"""The `Place` interface: what a place a run can go to owns, so that the commands above it never ask which place
a run is in (torchx's `Scheduler` + registry, SkyPilot's `sky/provision/<cloud>/`).

A place names the launch options that are its own and those it has no use for (the option errors are made from
them), runs `up` (acquire machines, run the plan on them, release them, through the executor's existing code) and
answers the day-2 commands on a recorded run: its state rows (`status`), its logs, `pull` and `down`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.execute.stacks import StacksTaken
    from launcher.places.option_words import Flags
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.providers.base import HostProvider
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec


class Place(Protocol):
    """One place a run can go to (`--provider NAME`), from `up` to `down`."""

    name: str  # what --provider and run.json's `provider` call it
    own_options: tuple[str, ...]  # launch options (their names in options.py) only this place reads: refused
    own_options_hint: str  # elsewhere, with this hint ("add --provider vast to rent machines")
    also_takes: tuple[str, ...]  # another place's own options this one reads too (Slurm: --nodes)
    unused_options: tuple[str, ...]  # launch options that would have no effect here: refused by check_options
    runs_here: bool  # the run's processes are this machine's (its Python, its files written in place)
    allocates_nodes: bool  # the place finds the run's nodes itself (no --host per node)
    hosts_per_node: bool  # the user names one --host per node (the network between them can be measured)

    def add_commands(self, app: Any) -> None:
        """Add this place's own commands to the ddpctl typer app (Vast.ai: `offers`, `vast login`); most have none."""
        ...

    def check_hosts(self, hosts: tuple[Any, ...]) -> None:
        """Refuse (SpecError, one line) hosts this place does not take (the run's --host options)."""
        ...

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        """Refuse (SpecError, one line) what this place cannot do with this runtime and these given flags; `flags`
        spells option names as the command line does."""
        ...

    def requests(self, values: dict[str, Any]) -> dict[str, Any]:
        """What to rent or allocate, built from the launch options' values: UpOptions fields ({} for none)."""
        ...

    def sweep_entry(self, options: UpOptions, nnodes: int, sweep_dir: Path) -> UpOptions:
        """The options of one sweep entry of `nnodes` nodes: what to rent or allocate for it (the sweep's `options`
        ask for its largest)."""
        ...

    def up(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """Run one experiment here to its end (or plan it, with options.dry_run): acquire, run, release."""
        ...

    def run_saved(self, plan: RunPlan, options: UpOptions) -> UpResult:
        """`up --plan FILE`: run exactly the saved plan here."""
        ...

    def run_saved_file(self, path: Path, options: UpOptions) -> UpResult | None:
        """`up --plan FILE` when FILE holds this place's own kind of plan (`options`: how to connect and follow);
        None when it does not (a plan of hosts is run_saved's)."""
        ...

    def host_provider(self, options: UpOptions) -> HostProvider:
        """What acquires and releases the run's machines here (SpecError where a scheduler does it itself)."""
        ...

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """One row per node: host, state, exit code, progress (`status`)."""
        ...

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """The end of node `node`'s torchrun output; with `follow`, what is added until the node ends (`logs`)."""
        ...

    def print_rank_log(self, run_dir: RunDir, rank: int, lines: int, follow: bool, options: UpOptions,
                       attempt: int | None) -> None:
        """Global rank `rank`'s own output (`logs --rank`)."""
        ...

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Fetch every node's outputs into the run directory, verified; one stats dict per node (`pull`)."""
        ...

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Stop every node, pull what it wrote, give back what the run holds; what to tell the user (`down`)."""
        ...

    def print_held(self, runs_dir: Path, json_out: bool) -> None:
        """List what this place still holds (and bills) for the runs under `runs_dir` (`status --rented`)."""
        ...

    def held_note(self, runs_dir: Path) -> str | None:
        """One line after `status` when this place still holds machines for runs under `runs_dir`; else None."""
        ...

    def take_stacks(self, run_dir: RunDir, options: UpOptions) -> StacksTaken:
        """Every rank's stack of the live recorded run, kept in its run directory; the verdict (`stacks`)."""
        ...

    def not_pulled_after_down(self, run_id: str, record: dict[str, Any], after_down: bool) -> str:
        """What `down` does (`after_down`: did) with files a pull could not bring back."""
        ...
