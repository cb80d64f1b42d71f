"""The stand-in's instances when a test needs no real SSH host: BannerHost, a TCP port that greets like sshd; and
how the stand-in installs an SSH key on an instance, the way Vast does. Used by infra/vast_standin.py. Not shipped."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any


class BannerHost:
    """The least an instance can be: a TCP port on 127.0.0.1 that greets like sshd and closes."""

    def __init__(self, instance_id: int) -> None:
        self.instance_id = instance_id
        self.user = "root"
        self.address = "127.0.0.1"
        self._sock = socket.create_server((self.address, 0))
        self.port = self._sock.getsockname()[1]
        self.authorized: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-VastStandIn\r\n")

    def authorize_key(self, public_key: str) -> None:
        self.authorized.append(public_key)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not, on Linux)
        self._sock.close()


def install_key(host: Any, public_key: str) -> None:
    """Install a key the way Vast does: into the login user's authorized_keys."""
    if hasattr(host, "authorize_key"):
        host.authorize_key(public_key)
    elif getattr(host, "home", None):
        keys = Path(host.home) / ".ssh" / "authorized_keys"
        with keys.open("a") as fh:
            fh.write(public_key.strip() + "\n")
