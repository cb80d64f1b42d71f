"""The SSH hosts provider: hosts the user named with --hosts; acquiring them is connecting, releasing is nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.errors import HostError, HostsFailed
from launcher.execute.before_start import nothing_started_if_interrupted
from launcher.execute.reattach import host_status_rows, print_host_log, pull_hosts, stop_and_pull_hosts
from launcher.planning.probe import plan_probed, plan_unprobed, probe_hosts
from launcher.providers.base import AcquiredHosts
from launcher.transport.hostsession import HostSession

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions, UpResult
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec


class SshHosts:
    """Hosts the user owns (see launcher.providers.base.HostProvider)."""

    def __init__(self) -> None:
        self._session: HostSession | None = None

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan that would run, from a read-only probe of the hosts (host keys verified as a run would, nothing
        recorded). Hosts that cannot be reached give the plan from the options with its unknowns named, and the
        reason as the result's error; with `probe` off, that plan and no error."""
        from launcher.execute.request import UpResult

        if not options.probe:
            return UpResult(None, 0, None, plan_unprobed(spec, options))
        try:
            self._session = HostSession.open(options)
        except (HostError, HostsFailed) as unreachable:
            return UpResult(None, 1, None, plan_unprobed(spec, options), error=str(unreachable))
        plan = plan_probed(spec, options, probe_hosts(self._session, spec, options))
        return UpResult(None, 0, None, plan)

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """A session to the named hosts (connections open lazily, host keys verified)."""
        with nothing_started_if_interrupted("connecting to the hosts"):
            self._session = HostSession.open(options)
        return AcquiredHosts(spec, options, self._session)

    def release(self, result: UpResult) -> UpResult:
        """Nothing to give back: the hosts are the user's."""
        return result

    def release_after_failure(self, error: BaseException) -> None:
        """Nothing to give back; the error propagates as it is."""

    def close(self) -> None:
        """Close the SSH connections."""
        if self._session is not None:
            self._session.close()

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Each node's state and progress, asked of its host (see launcher.providers.base.RunProvider)."""
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
