"""A recorded run, rebuilt from its typed run.json: what answers `ddpctl status`, `logs`, `pull` and `down` for it,
so the commands never branch on the record's fields (its runtime: launcher.runtimes.start.runtime_of).

This is the executor's reattach side: providers only hand hosts to the executor; a run on hosts is reached again
through launcher/execute/reattach.py, a rented one through launcher/execute/rented_run.py, which also gives its
machines back with the provider's own calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import DdpctlError, SpecError
from launcher.execute.reattach import (
    host_status_rows,
    local_status_rows,
    local_torchrun_running,
    print_host_log,
    print_local_log,
    pull_hosts,
    stop_and_pull_hosts,
)

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions
    from launcher.results.record import RunRecord
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


def recorded_run(record: RunRecord) -> RecordedRun:
    """What answers for the run: its rented machines when it rented some, its SSH hosts when it ran on hosts,
    else this machine (records written before `provider` was recorded read the same)."""
    provider = record.extra.get("provider", "local")
    if provider == "slurm":  # a job on a cluster, reached through its login node
        from launcher.execute.scheduled_reattach import SlurmRun

        return SlurmRun()
    if provider == "vast":
        from launcher.execute.rented_run import RentedRun

        return RentedRun()
    if record.extra.get("hosts"):
        return HostsRun()
    return LocalRun()


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
    """A run on this machine: its files were written straight into the run directory; nothing to fetch or stop."""

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """The run's one row, from its run directory."""
        return local_status_rows(run_dir)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """The end of the run's torchrun.out (node 0: a local run has no other)."""
        if node != 0:
            raise SpecError(f"--node {node}: run {run_dir.run_id} ran on this machine; it has node 0 only")
        print_local_log(run_dir, lines, follow)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Refused: the files are already here."""
        raise DdpctlError(f"run {run_dir.run_id} is a local run and `pull` is for runs on hosts: its files are "
                          f"already in {run_dir.path}")

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Nothing to do for a local run that ended; one still running is refused: it is stopped where `up` runs
        (its torchrun's pid is named only while that pid is still its torchrun)."""
        record = run_dir.record()
        ended = any(e.get("event") in ("exited", "stopped") for e in run_dir.events())
        if ended or not local_torchrun_running(record):
            return f"run {run_dir.run_id} ran on this machine and has ended: nothing to stop; its files are in " \
                   f"{run_dir.path}"
        raise DdpctlError(f"run {run_dir.run_id} is a local run and `down` is for runs on hosts: stop a local run "
                          f"with Ctrl-C where `ddpctl up` runs (or `kill {record['local_pid']}`, its torchrun); its "
                          f"files are in {run_dir.path}")
