"""A recorded run, rebuilt from its typed run.json: what answers `ddpctl status`, `logs`, `pull` and `down` for it,
so the commands never branch on the record's fields (its runtime: launcher.runtimes.start.runtime_of; its place,
whose RecordedRun this is: launcher/places/registry.py's place_of_record).

This is the executor's reattach side: providers only hand hosts to the executor; a run on hosts is reached again
through launcher/execute/day2/reattach.py, a rented one through launcher/places/vast/rented_run.py, which also gives its
machines back with the provider's own calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import DdpctlError, SpecError
from launcher.execute.day2.reattach import (
    host_status_rows,
    print_host_log,
    print_local_log,
    pull_hosts,
    stop_and_pull_hosts,
)
from launcher.execute.this_machine.state import local_run_processes, local_status_rows, local_torchrun_running

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions
    from launcher.results.rundir import RunDir


class RecordedRun(Protocol):
    """What `ddpctl status`, `logs`, `pull` and `down` ask of a recorded run."""

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """One row per node: host, process state, exit code, progress."""
        ...

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """The end of node `node`'s torchrun output; with `follow`, what is added until the node ends."""
        ...

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Fetch every node's outputs into the run directory (verified); one stats dict per node."""
        ...

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Stop every node, pull what it wrote, give back what the run holds; what to tell the user."""
        ...


class HostsRun:
    """A run on the user's SSH hosts: asked of the hosts; nothing to give back."""

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Each node's state and progress, asked of its host."""
        return host_status_rows(run_dir, options)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """A node's torchrun output, read on its host."""
        print_host_log(run_dir, node, lines, follow, options)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Every node's outputs, fetched and verified."""
        return pull_hosts(run_dir, options)

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Stop every node, then pull; the hosts are the user's, so nothing is given back."""
        stop_and_pull_hosts(run_dir, options)
        return f"stopped run {run_dir.run_id}; results in {run_dir.path}"


class LocalRun:
    """A run on this machine: its files were written straight into the run directory (nothing to fetch); its
    state is measured from its processes here, and `down` stops them as a host node's are stopped."""

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """The run's one row: its measured state and its progress, from its run directory."""
        return local_status_rows(run_dir)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """Rank 0's output (node 0: a local run has no other); torchrun's own before the workers start."""
        if node != 0:
            raise SpecError(f"--node {node}: run {run_dir.run_id} ran on this machine; it has node 0 only")
        print_local_log(run_dir, lines, follow, options)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Refused: the files are already here."""
        raise DdpctlError(f"run {run_dir.run_id} is a local run and `pull` is for runs on hosts: its files are "
                          f"already in {run_dir.path}")

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Stop the run's processes here (launcher/execute/this_machine/state.py: its torchrun's tree and every process
        with the run's mark, SIGKILL after the grace period); an `up` following it then says it was stopped by
        `down`. Its files are already in its run directory: nothing is pulled."""
        from launcher.execute.failures.restart_causes import finish_run_records
        from launcher.execute.following.outside_stops import DOWN_EVENT
        from launcher.execute.this_machine.run import STOP_GRACE_SECONDS
        from launcher.execute.this_machine.state import stop_local_run

        if not local_torchrun_running(run_dir.record()) and not local_run_processes(run_dir):
            return f"run {run_dir.run_id} ran on this machine and has ended: nothing to stop; its files are in " \
                   f"{run_dir.path}"
        run_dir.event(DOWN_EVENT)  # an `up` following the run says it was stopped by down, not that it failed
        signalled = stop_local_run(run_dir, STOP_GRACE_SECONDS)
        left = local_run_processes(run_dir)
        if left:
            raise DdpctlError(f"run {run_dir.run_id}: {len(left)} process(es) of the run could not be stopped "
                              f"(pids {', '.join(map(str, sorted(left)))}); `ddpctl down {run_dir.run_id}` again "
                              "tries once more")
        finish_run_records(run_dir)
        run_dir.event("stopped", node=0, by="down", signalled=len(signalled))
        return (f"stopped run {run_dir.run_id} on this machine ({len(signalled)} process(es) stopped, none left); "
                f"its files are already here, nothing to pull: {run_dir.path}")
