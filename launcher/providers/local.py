"""The local provider: this machine. Acquiring it gives this machine (no SSH session), releasing it does nothing; a
run here has one node, its files are written straight into the run directory, and `pull`/`down` have nothing to
fetch or stop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, SpecError
from launcher.execute.reattach import local_status_rows, local_torchrun_running, print_local_log
from launcher.providers.base import AcquiredHosts

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions, UpResult
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec


class LocalMachine:
    """This machine as a run's provider (see launcher.providers.base.HostProvider and RunProvider)."""

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan a run here would carry out, after the checks it would pass; nothing written."""
        from launcher.execute.local import check_local_run
        from launcher.execute.request import UpResult

        _one_node(spec)
        return UpResult(None, 0, None, check_local_run(spec, (options.runs_dir / spec.run_id).resolve()))

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """This machine: no session (the executor starts the run here), and the fields run.json records for it."""
        _one_node(spec)
        return AcquiredHosts(spec, options, None, record={"hosts": [], "runtime": "native", "provider": "local"})

    def release(self, result: UpResult) -> UpResult:
        """Nothing to give back."""
        return result

    def release_after_failure(self, error: BaseException) -> None:
        """Nothing to give back; the error propagates as it is."""

    def close(self) -> None:
        """Nothing to close."""

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


def _one_node(spec: RunSpec) -> None:
    if spec.nnodes != 1:
        raise ValueError("a local run has one node")
