"""One exception family for every error a user can cause or fix; the CLI turns it into one line."""

from __future__ import annotations


class DdpctlError(Exception):
    """An error with a message meant for the user: what was wrong and what to do."""

    exit_code = 1


class Interrupted(DdpctlError):
    """The user stopped the run (Ctrl-C); what exists was kept."""

    exit_code = 130


class SpecError(DdpctlError):
    """The run specification is invalid (bad option value, unknown model, ...)."""


class HostError(DdpctlError):
    """A host could not be reached, authenticated, or failed a step; the message names the host."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message


class AuthenticationFailed(HostError):
    """The host answered but refused every key we offered (a new machine may not have our key yet)."""


class HostsFailed(DdpctlError):
    """A step failed on some hosts: one line per failing host; `errors` keeps each host's exception by type."""

    def __init__(self, message: str, errors: tuple[BaseException, ...]) -> None:
        super().__init__(message)
        self.errors = errors


class RunDirError(DdpctlError):
    """A run directory is missing, unwritable or not a ddpctl run."""


class PlanError(DdpctlError):
    """A saved plan (`up --plan FILE`) cannot be used: missing, malformed, made by a newer ddpctl, or unfit to run."""


class RunStopRequested(DdpctlError):
    """Raised by a provider's `watch` hook (e.g. --max-cost) or by `follow` (--stall-timeout): every node is stopped
    and pulled, then it propagates. `reason` names the trigger in events and teardown records."""

    def __init__(self, message: str, reason: str, lost_nodes: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.reason = reason
        self.lost_nodes = lost_nodes  # nodes whose machine is gone (outbid): not stopped, nothing to stop there
