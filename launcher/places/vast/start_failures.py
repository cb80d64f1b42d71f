"""Why a Vast.ai instance did not start, read from its `status_msg` and states: an image that cannot be pulled
(the same on every machine, so renting another one only burns money) or a fault of this machine (try the next).

The texts are Docker's and Vast's own: Vast copies the Docker daemon's error into `status_msg`, e.g.
"Error response from daemon: manifest for docker.io/x/y:1 not found: manifest unknown: manifest unknown",
"Error response from daemon: pull access denied for x/y, repository does not exist or may require 'docker
login': denied: requested access to the resource is denied", "... unauthorized: authentication required",
"... failed to create task for container: ... OCI runtime create failed: ...", "write /var/lib/docker/tmp/...:
no space left on device", "could not select device driver \"\" with capabilities: [[gpu]]".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The image itself: its name, tag or credentials are wrong. Any machine would fail the same way.
IMAGE_PATTERNS = (
    "manifest unknown", "not found: manifest", "manifest for", "pull access denied",
    "repository does not exist", "may require 'docker login'", "requested access to the resource is denied",
    "unauthorized", "authentication required", "no basic auth credentials", "invalid reference format",
    "failed to resolve reference", "no matching manifest for", "denied:", "name unknown",
)
# This machine: its disk, driver, runtime or network. Another machine may well start the image.
MACHINE_PATTERNS = (
    "no space left on device", "disk quota exceeded", "oci runtime", "runc create failed",
    "nvidia-container-cli", "could not select device driver", "failed to register layer", "i/o timeout",
    "tls handshake timeout", "connection reset by peer", "unexpected eof", "error pulling image configuration",
    "error response from daemon",
)
# actual_status values that never become running: exited, offline, and unknown ("no recent heartbeat from the host").
# Vast's docs: "If actual_status becomes exited, unknown or offline, it will never reach running ... Destroy the
# instance and retry with a different offer" (Hello World, https://docs.vast.ai/api-reference/hello-world): the
# next machine is tried at once.
# The states the docs call transitional (null "being provisioned", loading, rebooting) are waited for.
FAILED_STATES = frozenset({"exited", "offline", "unknown"})
TRANSIENT_STATES = frozenset({None})  # not reported yet: waited for a bounded time (provision's transient_grace)


@dataclass(frozen=True)
class StartFailure:
    """An instance that will not start: `image` when the image is at fault (fatal for the run), `reason` one line."""

    reason: str
    image: bool = False


def _short(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def classify_status_msg(status_msg: str) -> StartFailure | None:
    """The failure `status_msg` reports, or None when it reports none (e.g. "pulling image", "success, running")."""
    text = status_msg.lower()
    if not text or text.startswith("success"):
        return None
    if any(p in text for p in IMAGE_PATTERNS) and "no space left" not in text:
        return StartFailure(_short(status_msg), image=True)
    if any(p in text for p in MACHINE_PATTERNS) or re.search(r"\berror\b", text):
        return StartFailure(f"container failed to start: {_short(status_msg)}")
    return None


def image_error_line(image: str, failure: StartFailure) -> str:
    """The one line `up` ends with when the image cannot be started."""
    hint = ("check the image reference (`docker pull` it yourself) and, for a private registry, add "
            "--registry-login")
    return f"Vast.ai could not start image {image}: {failure.reason}; nothing more was rented: {hint}"
