"""Errors of the Vast.ai client: one line each, never holding the API key."""

from __future__ import annotations

from launcher.errors import DdpctlError


class VastError(DdpctlError):
    """The Vast.ai API refused or failed a request; `status` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the server put in msg
        self.status = status
        self.code = code


class VastAuthError(VastError):
    """The API key was rejected (401, or search's 404 "Invalid user key")."""


class VastNotFound(VastError):
    """404: the offer or instance does not exist (offers vanish between search and rent)."""


class VastGone(VastNotFound):
    """410: the offer is no longer available."""


class VastRateLimited(VastError):
    """429 persisted after every retry."""


class VastUnavailable(VastError):
    """5xx or no connection, after every retry."""


class ApiKeyMissing(DdpctlError):
    """No Vast.ai API key was found in the environment or the key files."""


class ProvisionError(DdpctlError):
    """Provisioning could not rent and start the machines asked for; nothing it created is left running."""
