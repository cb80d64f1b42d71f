"""The SSH hosts provider: hosts the user named with --hosts; acquiring them is connecting, releasing is nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import HostError, HostsFailed
from launcher.planning.probe import plan_probed, plan_unprobed, probe_hosts
from launcher.providers.base import AcquiredHosts, ExecutorCalls
from launcher.runtimes.choose import choose_runtime, runtime_unprobed
from launcher.transport.hostsession import HostSession

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions, UpResult
    from launcher.spec.run_spec import RunSpec


class SshHosts:
    """Hosts the user owns (see launcher.providers.base.HostProvider)."""

    def __init__(self, calls: ExecutorCalls) -> None:
        self._calls = calls
        self._session: HostSession | None = None

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan that would run, from a read-only probe of the hosts (host keys verified as a run would, nothing
        recorded). Hosts that cannot be reached give the plan from the options with its unknowns named, and the
        reason as the result's error; with `probe` off, that plan and no error."""
        from launcher.planning.request import UpResult

        if not options.probe:
            return UpResult(None, 0, None, plan_unprobed(spec, options, runtime_unprobed(options)))
        try:
            self._session = HostSession.open(options)
        except (HostError, HostsFailed) as unreachable:
            return UpResult(None, 1, None, plan_unprobed(spec, options, runtime_unprobed(options)),
                            error=str(unreachable))
        plan = plan_probed(spec, options, probe_hosts(self._session, spec, options, choose_runtime))
        return UpResult(None, 0, None, plan)

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """A session to the named hosts (connections open lazily, host keys verified)."""
        with self._calls.nothing_started_if_interrupted("connecting to the hosts"):
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
