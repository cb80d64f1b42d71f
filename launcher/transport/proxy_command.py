"""`ProxyCommand` from ~/.ssh/config, as OpenSSH runs it: the user's own command, its %h %p %r %n %% tokens
expanded, run by /bin/sh with its standard input and output as the connection to the host's sshd.

The command text comes only from the user's ssh config (never from a host or a run directory), so running it is
what `ssh HOST` itself would do. Token values come from `--host` (parse_host allows no shell characters there) or
the same config. The proxy runs in a session of its own: a Ctrl-C meant for ddpctl must not cut the connection
that ddpctl then uses to stop the nodes and pull their files.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections import deque
from pathlib import Path
from typing import Any

from launcher.errors import DdpctlError
from launcher.spec.user_paths import read_user_file
from launcher.transport.paramiko_loader import paramiko

SSH_CONFIG_MAX_BYTES = 4 << 20  # far more than any hand-written ssh config

_STDERR_LINES = 5


def expand_proxy_command(template: str, *, hostname: str, port: int, user: str, alias: str) -> str:
    """The command with OpenSSH's tokens replaced: %h host name, %p port, %r remote user, %n the name as typed,
    %% a literal %; any other %-token is refused by name (OpenSSH refuses it too)."""
    values = {"h": hostname, "p": str(port), "r": user, "n": alias, "%": "%"}
    out, i = [], 0
    while i < len(template):
        char = template[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        token = template[i + 1 : i + 2]
        if token not in values:
            raise DdpctlError(f"ProxyCommand {template!r} uses %{token}, which ddpctl does not expand: use %h, %p, "
                              "%r, %n or %% (or ProxyJump)")
        out.append(values[token])
        i += 2
    return "".join(out)


def read_ssh_config(path: Path) -> paramiko.SSHConfig:
    """The ssh config at `path` (nothing there: an empty one); a device, FIFO, directory or an unbounded file
    there is refused in one line (SpecError) before paramiko reads it."""
    try:
        data = read_user_file(path, "the ssh config", SSH_CONFIG_MAX_BYTES,
                              "make it a file of ssh_config(5) lines, or move it away")
    except (FileNotFoundError, NotADirectoryError):
        return paramiko.SSHConfig()
    return RawProxyCommandConfig.from_text(data.decode(errors="replace"))


class RawProxyCommandConfig(paramiko.SSHConfig):
    """paramiko's ssh config reader, leaving ProxyCommand's tokens for expand_proxy_command: paramiko fills %p and
    %r from the config alone (not from `user@host:port` as typed) and knows no %%."""

    def lookup(self, hostname: str) -> Any:
        """paramiko's lookup, with a Port outside 1-65535 refused (ValueError, named by resolve_target) rather than
        tried (a connection refused, blamed on sshd)."""
        found = super().lookup(hostname)
        port = found.get("port")
        if port is not None and not (str(port).isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"Port {port} for {hostname!r} is not a port number (1 to 65535)")
        return found

    def _expand_variables(self, config: Any, target_hostname: str) -> Any:
        raw = config.get("proxycommand")
        # paramiko's own (private, absent from its type stubs): it expands every other key's tokens.
        expanded = super()._expand_variables(config, target_hostname)  # type: ignore[misc]
        if raw is not None:
            expanded["proxycommand"] = raw
        return expanded


class ProxyCommandSocket:
    """The socket-like object paramiko's Transport reads and writes: a running ProxyCommand's stdin/stdout.

    `recv` honours the transport's timeout (socket.timeout when nothing came) and returns b"" at end of file, as a
    socket does; `close` stops the command and reaps it, so no proxy process outlives its connection."""

    def __init__(self, command: str) -> None:
        self.command = command
        self._timeout: float | None = None
        self._stopped = False  # close() ended it: its exit is ours, not the command's failure
        self._eof = False  # its output ended: it is exiting, or has exited, by itself
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        try:
            self._process = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                             start_new_session=True)
        except OSError as e:
            raise DdpctlError(f"cannot start ProxyCommand {command!r}: {e.strerror or e}") from e
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def send(self, data: bytes) -> int:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            return os.write(stdin.fileno(), data)  # BrokenPipeError (an OSError) once the command has exited
        except ValueError:  # closed by close() while the transport's thread was still sending
            raise BrokenPipeError("the ProxyCommand connection is closed") from None

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.send(bytes(view)) :]

    def recv(self, size: int) -> bytes:
        stdout = self._process.stdout
        assert stdout is not None
        try:
            ready, _, _ = select.select([stdout], [], [], self._timeout)
            if not ready:
                raise TimeoutError()  # socket.timeout, which paramiko waits out
            data = os.read(stdout.fileno(), size)
            self._eof = self._eof or not data
            return data
        except ValueError:  # closed by close() while the transport's thread was reading: end of file
            return b""

    def close(self) -> None:
        """Stop the command (SIGTERM, then SIGKILL after 2 s) and reap it. A command that closed its output is
        exiting by itself (the kernel closes a process's files before its status can be read): its exit is awaited
        a moment first, so that it is told as its own failure and not as our stop (paramiko's thread closes the
        socket as soon as it reads the end of file)."""
        if self._eof and self._process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=1)
        if self._process.poll() is None:
            self._stopped = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._reader.join(timeout=1)
        if self._process.stderr is not None:
            with contextlib.suppress(OSError):
                self._process.stderr.close()

    @property
    def closed(self) -> bool:
        return self._process.poll() is not None

    @property
    def _closed(self) -> bool:  # what paramiko's Transport.stop_thread asks a socket
        return self.closed

    def failure(self, wait: float = 1.0) -> str | None:
        """When the command has exited by itself (waiting up to `wait` s for it): its status and last stderr
        line."""
        if self._stopped:
            return None
        try:
            code = self._process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=1)
        said = self._stderr[-1] if self._stderr else "it printed nothing on stderr"
        return f"ProxyCommand `{self.command}` exited {code}: {said}"

    def _read_stderr(self) -> None:
        stderr = self._process.stderr
        assert stderr is not None
        for raw in iter(stderr.readline, b""):
            line = raw.decode(errors="replace").strip()
            if line:
                self._stderr.append(line)
