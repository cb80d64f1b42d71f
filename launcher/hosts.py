"""Where to run: host specifications as the user types them (`[user@]host[:port]` or an ssh-config alias)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.errors import SpecError

_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
    r"(?::(?P<port>\d+))?$"
)


@dataclass(frozen=True)
class HostSpec:
    """One `--host` value. `user`/`port` are None when not given (the ssh config or defaults decide)."""

    text: str
    hostname: str
    user: str | None = None
    port: int | None = None

    @property
    def label(self) -> str:
        return self.text


def parse_host(text: str) -> HostSpec:
    """Parse `[user@]host[:port]`; raise SpecError with the expected form otherwise."""
    m = _HOST_RE.match(text.strip())
    if not m or text.startswith("-"):
        raise SpecError(f"--host {text!r} is not of the form [user@]host[:port] or an ssh config alias")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise SpecError(f"--host {text!r}: port {port} is out of range 1-65535")
    return HostSpec(text=text, hostname=m["host"].strip("[]"), user=m["user"], port=port)
