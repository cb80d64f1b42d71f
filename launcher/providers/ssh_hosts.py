"""The SSH hosts provider: hosts the user named with --hosts; acquiring them is connecting, releasing is nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.providers.base import AcquiredHosts
from launcher.transport.hostsession import HostSession

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions, UpResult
    from launcher.spec.run_spec import RunSpec


class SshHosts:
    """Hosts the user owns (see launcher.providers.base.HostProvider)."""

    def __init__(self) -> None:
        self._session: HostSession | None = None

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan from the hosts as typed (the executor's dry run)."""
        from launcher.execute.on_hosts import run_remote_up

        return run_remote_up(spec, options)

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """A session to the named hosts (connections open lazily, host keys verified)."""
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
