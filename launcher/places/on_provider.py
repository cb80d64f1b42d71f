"""What the places whose machines a `HostProvider` acquires and releases share: `up` is the executor's one sequence
(launcher/execute/up.py: acquire -> probe -> plan -> run -> release), and the day-2 commands are answered by the
executor's recorded-run object for the place (launcher/execute/day2/recorded.py's RecordedRun). The executor is imported
where it is used, so that the command line starts without it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.execute.day2.recorded import RecordedRun
    from launcher.execute.stacks import StacksTaken
    from launcher.places.option_words import Flags
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.providers.base import HostProvider
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec


class ProvidedPlace:
    """A place whose machines a HostProvider gives: subclasses name it, its options, its provider and its recorded
    run."""

    name = ""
    own_options: tuple[str, ...] = ()
    own_options_hint = ""  # how to choose this place, for the error that refuses its options elsewhere
    also_takes: tuple[str, ...] = ()  # other places' own options this place reads too
    unused_options: tuple[str, ...] = ()
    runs_here = False
    allocates_nodes = False
    hosts_per_node = False

    def add_commands(self, app: Any) -> None:
        """No commands of its own."""

    def check_hosts(self, hosts: tuple[Any, ...]) -> None:
        """Refuse hosts this place does not take (SpecError, one line)."""

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        """Refuse what this place cannot do with this runtime and these given flags (SpecError, one line)."""

    def requests(self, values: dict[str, Any]) -> dict[str, Any]:
        """What to rent or allocate, from the launch options' values: UpOptions fields (none by default)."""
        return {}

    def host_provider(self, options: UpOptions) -> HostProvider:
        raise NotImplementedError

    def recorded(self) -> RecordedRun:
        raise NotImplementedError

    def sweep_entry(self, options: UpOptions, nnodes: int, sweep_dir: Path) -> UpOptions:
        return options

    def up(self, spec: RunSpec, options: UpOptions) -> UpResult:
        from launcher.execute.up import run_on_provider

        return run_on_provider(self.host_provider(options), spec, options)

    def run_saved(self, plan: RunPlan, options: UpOptions) -> UpResult:
        from launcher.execute.up import run_on_provider

        return run_on_provider(self.host_provider(options), plan.spec, options, saved=plan)

    def run_saved_file(self, path: Path, options: UpOptions) -> UpResult | None:
        return None  # a plan of hosts: launcher/planning/plan_file.py reads it, run_saved runs it

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        return self.recorded().status_rows(run_dir, options)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        self.recorded().print_log(run_dir, node, lines, follow, options)

    def print_rank_log(self, run_dir: RunDir, rank: int, lines: int, follow: bool, options: UpOptions,
                       attempt: int | None) -> None:
        from launcher.execute.day2.rank_logs import print_rank_log

        print_rank_log(run_dir, rank, lines, follow, options, attempt)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        return self.recorded().pull(run_dir, options)

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        return self.recorded().down(run_dir, options, force)

    def take_stacks(self, run_dir: RunDir, options: UpOptions) -> StacksTaken:
        from launcher.execute.day2.stacks import take_recorded_stacks

        return take_recorded_stacks(run_dir, options)

    def print_held(self, runs_dir: Path, json_out: bool) -> None:
        """Nothing held: the machines are the user's (or this one)."""

    def held_note(self, runs_dir: Path) -> str | None:
        return None

    def not_pulled_after_down(self, run_id: str, record: dict[str, Any], after_down: bool) -> str:
        from launcher.execute.pull_record import down_on_hosts

        return down_on_hosts(run_id, after_down)
