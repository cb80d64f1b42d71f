"""SSH to hosts with paramiko: resolve what the user typed, verify host keys, authenticate, run quoted commands.

Quoting happens in one place, `command_line()`: a remote command is always `shlex.join(argv)` for a POSIX
login shell. Host keys are checked against ~/.ssh/known_hosts and ddpctl's own file (launcher.transport.known_hosts):
a host with no entry at all is refused unless the user passed --accept-new-host-keys; a host that presents a
key other than those pinned for it (of the same type or of another one) or a revoked key is always refused.
As OpenSSH does, we ask a host first for the key types pinned for it, so one with several keys shows a pinned one.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.errors import AuthenticationFailed, DdpctlError, HostError
from launcher.spec.hosts import HostSpec, parse_host
from launcher.transport.channel_output import CONNECTION_DROPPED, CommandTimedOut, read_until_exit
from launcher.transport.known_hosts import ACCEPT_FLAG, KnownHosts, KnownKey, fingerprint, host_key_name
from launcher.transport.paramiko_loader import config_lookup, paramiko
from launcher.transport.proxy_command import ProxyCommandSocket, expand_proxy_command, read_ssh_config
from launcher.transport.ssh_keys import KeyLoad, check_identity_file
from launcher.transport.tcp_connect import abort, connect_tcp

DEFAULT_CONNECT_TIMEOUT = 15.0
KEEPALIVE_S = 15
_DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
# The host key algorithms that present an `ssh-rsa` key (paramiko 5 has dropped SHA-1 "ssh-rsa" itself).
_RSA_ALGORITHMS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect. `label` is what the user typed; it names the host in every message."""

    label: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    proxy_jump: str | None = None  # OpenSSH ProxyJump text: "[user@]host[:port][,...]"
    proxy_command: str | None = None  # OpenSSH ProxyCommand from the user's ssh config, tokens expanded

    @property
    def key_name(self) -> str:
        """The name the host's key is filed under in known_hosts files."""
        return host_key_name(self.hostname, self.port)


def resolve_target(host: HostSpec, ssh_config: Path | None = None, identity_file: Path | None = None) -> SSHTarget:
    """Apply ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump, ProxyCommand) to `host`; explicit
    values win."""
    path = ssh_config if ssh_config is not None else Path.home() / ".ssh" / "config"
    if identity_file is not None:
        check_identity_file(identity_file)
    try:
        config = read_ssh_config(path)  # bounded, a regular file (launcher/spec/user_paths.py)
        opts: dict[str, Any] = dict(config_lookup(config, host.hostname))
    except (OSError, paramiko.SSHException, ValueError) as e:
        raise DdpctlError(f"cannot read ssh config {path}: {e}") from e
    # Absolute, so run.json's record of them serves `status`/`pull`/`down` from any working directory.
    given = [str(identity_file)] if identity_file else []
    identities = [os.path.abspath(os.path.expanduser(p)) for p in given + opts.get("identityfile", [])]
    jump = opts.get("proxyjump")
    try:
        port = host.port or int(opts.get("port", 22))
    except ValueError as e:
        raise DdpctlError(f"ssh config {path}: Port for {host.hostname!r} is not a number") from e
    hostname, user = opts.get("hostname", host.hostname), host.user or opts.get("user") or getpass.getuser()
    jump = None if not jump or jump.lower() == "none" else jump
    proxy = opts.get("proxycommand")
    proxy = None if not proxy or proxy.lower() == "none" else proxy
    if proxy and jump:
        raise DdpctlError(f"ssh config {path} gives {host.hostname!r} both ProxyJump and ProxyCommand: keep one")
    return SSHTarget(
        label=host.label,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=tuple(dict.fromkeys(identities)),
        proxy_jump=jump,
        proxy_command=proxy and expand_proxy_command(proxy, hostname=hostname, port=port, user=user,
                                                     alias=host.hostname),
    )


def proxy_command_now(label: str, ssh_config: Path | None = None) -> str | None:
    """The ProxyCommand the user's ssh config gives the host typed as `label` now (reattach reads it there, never
    from a run directory: a command is run only from the user's own config)."""
    try:
        return resolve_target(parse_host(label), ssh_config).proxy_command
    except DdpctlError:
        return None


@dataclass(frozen=True)
class CommandResult:
    """A finished remote command: its exit code and output (decoded as UTF-8, undecodable bytes replaced)."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def command_line(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The one place remote commands are quoted: `[cd DIR && ]exec [env K=V ...] argv` for a POSIX shell."""
    if not argv:
        raise ValueError("empty command")
    words = list(argv)
    if env:
        for key in env:
            if not _ENV_NAME.match(key):
                raise DdpctlError(f"environment variable name {key!r} is not valid")
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *words]
    line = "exec " + shlex.join(words)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


class Connection:
    """A lazily opened SSH connection to one target; memoizes its SFTP client. Use as a context manager.

    Thread-safe for concurrent run() calls (each is its own channel). Reopens if the transport died.
    """

    def __init__(self, target: SSHTarget, *, known_hosts: KnownHosts | None = None,
                 accept_new_host_keys: bool = False, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 allow_agent: bool = True, ssh_config: Path | None = None) -> None:
        self.target = target
        self.known_hosts = known_hosts or KnownHosts()
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.allow_agent = allow_agent
        self.ssh_config = ssh_config
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._jump: Connection | None = None
        self._lock = threading.Lock()
        self._opening: socket.socket | paramiko.Channel | ProxyCommandSocket | None = None  # the last connect's

    @property
    def label(self) -> str:
        return self.target.label

    @property
    def transport(self) -> paramiko.Transport:
        """The open transport (connecting, verifying the host key and authenticating on first use)."""
        with self._lock:
            if self._transport is None or not self._transport.is_active():
                self._close_locked()
                self._transport = self._open()
            return self._transport

    @property
    def sftp(self) -> paramiko.SFTPClient:
        """The SFTP client (opened once); HostError saying what to do where sshd has no SFTP subsystem."""
        with self._lock:
            if self._sftp is not None:
                return self._sftp
        chan = self._session()
        try:
            chan.invoke_subsystem("sftp")
            client = paramiko.SFTPClient(chan)
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            if not self.transport.is_active():
                raise HostError(self.label, f"connection lost while starting SFTP: {e}") from e
            raise HostError(self.label, f"ddpctl copies files over SFTP, and sshd at {self._where()} offers no SFTP "
                                        "subsystem: enable it in the host's sshd_config (`Subsystem sftp "
                                        "internal-sftp`) and reload sshd") from e
        with self._lock:
            if self._sftp is None:
                self._sftp = client
            else:
                client.close()
            return self._sftp

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | Iterable[bytes] | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None) -> CommandResult:
        """Run argv on the host (quoted by command_line) and wait for it; HostError after `timeout` seconds."""
        # A program sent as an argument (`python3 -c SOURCE`) is shown as `...`: its text says nothing in a line.
        shown = " ".join("..." if "\n" in word else shlex.quote(word) for word in argv)
        return self._exec(command_line(argv, env=env, cwd=cwd), timeout, stdin, shown)

    def run_shell(self, script: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        """Run a shell script verbatim. ONLY for fixed scripts written in our code: never interpolate input."""
        return self._exec(script, timeout, stdin, script.splitlines()[0] if script else "")

    def open_channel_command(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                             cwd: str | None = None) -> paramiko.Channel:
        """Start argv and return its channel for streaming (sendall/shutdown_write, recv, recv_exit_status)."""
        chan = self._session()
        try:
            chan.exec_command(command_line(argv, env=env, cwd=cwd))
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            raise HostError(self.label, f"connection lost while starting `{_short(shlex.join(argv))}`: {e}") from e
        return chan

    def check(self, argv: Sequence[str], what: str, **kwargs: Any) -> CommandResult:
        """run() and raise HostError naming `what` and the command's stderr when it exits non-zero."""
        result = self.run(argv, **kwargs)
        if not result.ok:
            tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise HostError(self.label, f"{what} failed (exit {result.exit_code}): {tail[0]}")
        return result

    def close(self) -> None:
        """Close the connection; a connect under way in another thread is cut short, not waited out (Ctrl-C)."""
        if self._lock.locked() and self._opening is not None:
            abort(self._opening)
        with self._lock:
            self._close_locked()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _session(self) -> paramiko.Channel:
        transport = self.transport
        try:
            return transport.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            if not transport.is_active():  # it died under the request (sshd ended, the link cut): say so
                raise HostError(self.label, CONNECTION_DROPPED) from e
            raise HostError(self.label, f"cannot open a session: {e or type(e).__name__}") from e

    def _exec(self, line: str, timeout: float | None, stdin: bytes | Iterable[bytes] | None,
              shown: str) -> CommandResult:
        chan = self._session()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            chan.exec_command(line)
            if timeout is not None:
                chan.settimeout(timeout)  # bounds sendall when the command does not read its input
            for part in [stdin] if isinstance(stdin, bytes) else stdin or ():  # parts: each sent when it comes
                chan.sendall(part)
            chan.shutdown_write()  # EOF on the remote stdin, so a command reading it does not wait for us
            code, out, err = read_until_exit(chan, deadline)
        except (TimeoutError, CommandTimedOut) as e:
            raise HostError(self.label, f"`{_short(shown)}` did not finish within {timeout:g} s") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise HostError(self.label, f"connection lost while running `{_short(shown)}`: {e}") from e
        finally:
            chan.close()
        return CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def _open(self) -> paramiko.Transport:
        sock = self._socket()
        transport = paramiko.Transport(sock)  # type: ignore[arg-type]  # a ProxyCommandSocket is socket-like
        self._opening = sock
        try:
            known = self.known_hosts.lookup(self.target.key_name)
            opts = transport.get_security_options()
            opts.key_types = _pinned_types_first(known, opts.key_types)
            transport.banner_timeout = self.connect_timeout
            transport.auth_timeout = self.connect_timeout
            transport.start_client(timeout=self.connect_timeout)
            self._verify_host_key(transport.get_remote_server_key(), known)
            self._authenticate(transport)
            transport.set_keepalive(KEEPALIVE_S)
            return transport
        except BaseException as e:
            # Whether the ProxyCommand exited by itself, asked before closing the transport stops it.
            failed = (sock.failure() if isinstance(sock, ProxyCommandSocket) and isinstance(e, Exception)
                      and not isinstance(e, DdpctlError) else None)
            transport.close()
            if isinstance(e, DdpctlError):
                raise
            if failed:
                raise HostError(self.label, f"{failed} (check the ProxyCommand for this host in your ssh config)") \
                    from e
            if isinstance(e, (paramiko.SSHException, EOFError, OSError)):
                raise HostError(self.label, f"SSH handshake with {self._where()} failed: {e}") from e
            raise

    def _socket(self) -> socket.socket | paramiko.Channel | ProxyCommandSocket:
        t = self.target
        if t.proxy_command:
            return ProxyCommandSocket(t.proxy_command)
        if t.proxy_jump:
            hops = t.proxy_jump.split(",")
            spec = parse_host(hops[-1])
            jump_target = resolve_target(spec, self.ssh_config)
            # The user's keys (--identity-file, the target's IdentityFile) also serve the jump host.
            jump_target = replace(
                jump_target, proxy_jump=",".join(hops[:-1]) or None,
                identity_files=tuple(dict.fromkeys(jump_target.identity_files + t.identity_files)))
            self._jump = Connection(jump_target, known_hosts=self.known_hosts,
                                    accept_new_host_keys=self.accept_new_host_keys,
                                    connect_timeout=self.connect_timeout, allow_agent=self.allow_agent,
                                    ssh_config=self.ssh_config)
            try:
                return self._jump.transport.open_channel("direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0),
                                                         timeout=self.connect_timeout)
            except (paramiko.SSHException, OSError) as e:
                raise HostError(self.label, f"jump host {jump_target.label} cannot reach {self._where()}: "
                                            f"{e}") from e
        try:
            return connect_tcp(t.hostname, t.port, self.connect_timeout, lambda sock: setattr(self, "_opening", sock))
        except TimeoutError as e:
            raise HostError(self.label, f"host unreachable within {self.connect_timeout:g} s "
                                        f"({self._where()})") from e
        except ConnectionRefusedError as e:
            raise HostError(self.label, f"connection refused at {self._where()}: is sshd running on that "
                                        "port?") from e
        except OSError as e:
            raise HostError(self.label, f"host unreachable ({self._where()}): {e.strerror or e}") from e

    def _verify_host_key(self, key: paramiko.PKey, known: list[KnownKey]) -> None:
        """Accept a pinned key; record a new host's key with --accept-new-host-keys; refuse everything else."""
        name, desc = self.target.key_name, f"{key.get_name()} {fingerprint(key)}"
        revoked = [k for k in self.known_hosts.revoked(name) if k.holds(key)]
        if revoked:
            raise HostError(self.label, f"REVOKED HOST KEY for {name}: it presents {desc}, which {revoked[0].where} "
                                        "marks @revoked; refusing to connect")
        if any(k.holds(key) for k in known):
            return
        if not known:
            if not self.accept_new_host_keys:
                raise HostError(self.label, f"unknown host key for {name} ({desc}); check the fingerprint and "
                                            f"pass {ACCEPT_FLAG} to trust it")
            self.known_hosts.record(name, key)
            return
        same_type = [k for k in known if k.key_type == key.get_name()]
        pin = (same_type or known)[0]
        remove = f"delete that line (`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(pin.path))}`)"
        if same_type:
            raise HostError(self.label, f"HOST KEY CHANGED for {name}: it now presents {desc}, but {pin.where} "
                                        f"holds another key. Possible attack; if the host was really reinstalled, "
                                        f"{remove} and connect again")
        raise HostError(self.label, f"HOST KEY TYPE CHANGED for {name}: it presents {desc}, a key of another type, "
                                    f"while {pin.where} pins its {pin.key_type} key. Possible attack; if the host "
                                    f"really dropped that key, {remove} and connect again")

    def _authenticate(self, transport: paramiko.Transport) -> None:
        loaded = KeyLoad()
        tried = loaded.tried
        for path, key in self._keys(loaded):
            try:
                transport.auth_publickey(self.target.user, key)
            except paramiko.AuthenticationException:
                tried.append(path)
                continue
            except paramiko.SSHException as e:
                raise AuthenticationFailed(self.label, f"authentication as {self.target.user} failed: {e}") from e
            if transport.is_authenticated():
                return
        raise AuthenticationFailed(self.label, f"authentication as {self.target.user!r} at {self._where()} failed; "
                                               f"keys tried: {', '.join(tried) or 'none'}; "
                                               f"{loaded.failure_hint()}")

    def _keys(self, loaded: KeyLoad) -> Any:
        """Yield (description, key): identity files (else the default ~/.ssh/id_*), then agent keys."""
        files = list(self.target.identity_files) or [str(Path.home() / ".ssh" / n) for n in _DEFAULT_KEYS]
        yield from loaded.files(files, explicit=bool(self.target.identity_files))
        if self.allow_agent:
            for n, key in enumerate(paramiko.Agent().get_keys(), start=1):
                yield f"agent key {n} ({fingerprint(key)})", key

    def _where(self) -> str:
        return f"{self.target.hostname}:{self.target.port}"

    def _close_locked(self) -> None:
        for closable in (self._sftp, self._transport, self._jump):
            if closable is not None:
                closable.close()
        self._sftp = self._transport = self._jump = None


def _pinned_types_first(known: list[KnownKey], offered: Sequence[str]) -> tuple[str, ...]:
    """Host key algorithms to offer, those of the keys pinned for the host first (as OpenSSH orders them)."""
    pinned = [a for k in known for a in (_RSA_ALGORITHMS if k.key_type == "ssh-rsa" else (k.key_type,))]
    first = [a for a in dict.fromkeys(pinned) if a in offered]
    return tuple(first + [a for a in offered if a not in first])


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
