"""What the launcher needs of a connection to one host, declared once: every module that runs commands or copies
files on a host takes a `HostConnection`. `launcher.transport.ssh.Connection` is the real one; tests hand in
stand-ins that run commands on this machine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol


class HostConnection(Protocol):
    """A host's connection: run a quoted argv and wait for it, start one and stream it, copy files over SFTP."""

    @property
    def label(self) -> str:
        """The host's name as the user gave it (what messages name)."""
        ...

    def run(self, argv: Sequence[str], *, timeout: float | None = None,
            stdin: bytes | Iterable[bytes] | None = None) -> Any:
        """Run argv on the host and wait for it (a `CommandResult`: exit_code, stdout, stderr); `stdin` in parts
        is sent a part at a time, each as it comes (a part may wait for another host's answer)."""
        ...

    def open_channel_command(self, argv: Sequence[str]) -> Any:
        """Start argv and return its channel for streaming (sendall/shutdown_write, recv, recv_exit_status)."""
        ...

    @property
    def sftp(self) -> Any:
        """The host's SFTP client."""
        ...
