"""The local provider: this machine. Acquiring it is nothing to do, releasing it is nothing to do; a run here has
one node, its files are written straight into the run directory, and `pull`/`down` have nothing to fetch or stop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, SpecError
from launcher.execute.reattach import local_status_rows, print_local_log

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions
    from launcher.results.rundir import RunDir


class LocalMachine:
    """This machine as a run's provider (see launcher.providers.base.RunProvider)."""

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
        """Refused: a local run is stopped where `up` runs."""
        pid = run_dir.record().get("local_pid")
        raise DdpctlError(f"run {run_dir.run_id} is a local run and `down` is for runs on hosts: stop a local run "
                          "with Ctrl-C where `ddpctl up` runs" + (f" (or `kill {pid}`, its torchrun)" if pid else "")
                          + f"; its files are in {run_dir.path}")
