"""A TCP connection that another thread can cut short while it is still being made: Ctrl-C while connecting to an
unreachable host must not wait out the connect timeout. `socket.create_connection` keeps its socket to itself;
here each socket is handed to `opening` before its connect starts, and `abort` ends that connect at once (on
Linux, shutdown() of a socket still in SYN-SENT disconnects it and wakes the thread blocked in connect(); close()
alone would not)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable


def connect_tcp(host: str, port: int, timeout: float, opening: Callable[[socket.socket], None]) -> socket.socket:
    """A connected socket to host:port, each address of the name tried in turn as create_connection does;
    `opening(sock)` is called with each socket before its connect starts. Raises the last address's OSError."""
    last: OSError | None = None
    for family, kind, proto, _name, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        opening(sock)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last or OSError(f"{host} has no address")


def abort(sock: object) -> None:
    """End a connection being made or used, from any thread: shut down first (wakes a blocked connect or recv),
    then close. Anything else with a close() (a ProxyCommand, an SSH channel) is closed."""
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    close = getattr(sock, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()
