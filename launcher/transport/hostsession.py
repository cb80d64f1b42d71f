"""The hosts of one run: resolved SSH targets and their (lazily opened, self-reopening) connections."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import SpecError
from launcher.transport.known_hosts import KnownHosts, default_known_hosts_path, fingerprint
from launcher.transport.parallel import raise_for_errors, run_on_hosts
from launcher.transport.ssh import Connection, SSHTarget, proxy_command_now, resolve_target

if TYPE_CHECKING:
    from launcher.spec.hosts import HostSpec


class ConnectOptions(Protocol):
    """What connecting to hosts needs of a request (launcher.planning.request.UpOptions has it)."""

    @property
    def hosts(self) -> tuple[HostSpec, ...]: ...
    @property
    def identity_file(self) -> Path | None: ...
    @property
    def accept_new_host_keys(self) -> bool: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def ssh_config(self) -> Path | None: ...
    @property
    def dry_run(self) -> bool: ...


def target_to_json(target: SSHTarget) -> dict[str, Any]:
    """What run.json keeps of a host: enough to reconnect later (absolute key paths, never key contents)."""
    return {"label": target.label, "hostname": target.hostname, "port": target.port, "user": target.user,
            "identity_files": [os.path.abspath(p) for p in target.identity_files], "proxy_jump": target.proxy_jump,
            "uses_proxy_command": bool(target.proxy_command)}  # the command itself is read from ssh config again


def target_from_json(data: dict[str, Any]) -> SSHTarget:
    return SSHTarget(label=data["label"], hostname=data["hostname"], port=int(data["port"]), user=data["user"],
                     identity_files=tuple(data.get("identity_files", ())), proxy_jump=data.get("proxy_jump"),
                     proxy_command=proxy_command_now(data["label"]) if data.get("uses_proxy_command") else None)


class HostSession:
    """Connections to a run's hosts, node 0 first. Failing hosts are named together, never one at a time."""

    def __init__(self, targets: list[SSHTarget], options: ConnectOptions,
                 settings: dict[str, Any] | None = None) -> None:
        self.targets = targets
        self.options = options
        settings = settings or {}
        known_hosts_file = settings.get("known_hosts_file") or str(default_known_hosts_path())
        # A dry run records nothing: a new host key it was told to accept is trusted for this session only.
        self._known_hosts = KnownHosts(ddpctl_file=Path(known_hosts_file), record_keys=not options.dry_run)
        self._conns = [self._connection(t) for t in targets]

    @classmethod
    def open(cls, options: ConnectOptions, *, sftp: bool = True) -> HostSession:
        """Resolve every --host and connect to all of them in parallel (host keys verified). `sftp` False: SFTP is
        left to the caller, which opens it beside its first commands (a Slurm login node's probe)."""
        targets = [resolve_target(h, options.ssh_config, options.identity_file) for h in options.hosts]
        session = cls(targets, options)
        try:
            session.connect_all(sftp)
            session.check_distinct()
        except BaseException:
            session.close()
            raise
        return session

    def _connection(self, target: SSHTarget) -> Connection:
        """The target's connection; -i/--identity-file is tried first, also for targets read back from run.json."""
        if self.options.identity_file:
            given = os.path.abspath(os.path.expanduser(self.options.identity_file))
            target = replace(target, identity_files=tuple(dict.fromkeys((given, *target.identity_files))))
        return Connection(target, known_hosts=self._known_hosts, accept_new_host_keys=self.options.accept_new_host_keys,
                          connect_timeout=self.options.connect_timeout, ssh_config=self.options.ssh_config)

    def connect_all(self, sftp: bool = True) -> None:
        # SFTP too: a host whose sshd lacks it is named now, before anything is written for the run.
        outcomes = run_on_hosts(list(range(len(self._conns))),
                                lambda i: self._conns[i].sftp if sftp else self._conns[i].transport,
                                timeout=self.options.connect_timeout * 2 + 10, label=self.label_of)
        raise_for_errors(outcomes, "connect")

    def check_distinct(self) -> None:
        """Refuse (one line) two targets that are one host however they were typed (`u@10.0.0.2` and
        `u@10.0.0.2:22`, an ssh config alias and its address): the same login user and either the same address and
        port as connected or the same host key. Both nodes would share one workspace and one pid file there."""
        seen: list[tuple[int, str, tuple[str, int], str]] = []
        for index, target in enumerate(self.targets):
            address, key = host_identity(self._conns[index])
            for other, user, other_address, other_key in seen:
                if user == target.user and (address == other_address or key == other_key):
                    why = (f"{address[0]} port {address[1]}" if address == other_address else f"host key {key}")
                    raise SpecError(
                        f"--host {self.targets[other].label!r} and --host {target.label!r} are the same host "
                        f"(user {user}, {why}): each node needs a host of its own (two nodes would share one run "
                        "workspace there); for more processes on one host, raise --gpus")
            seen.append((index, target.user, address, key))

    @property
    def labels(self) -> list[str]:
        return [t.label for t in self.targets]

    def label_of(self, index: int) -> str:
        return self.targets[index].label

    def conn(self, index: int) -> Connection:
        return self._conns[index]

    def drop(self, index: int) -> None:
        """Forget a broken connection; the next use reconnects."""
        self._conns[index].close()

    def settings_json(self) -> dict[str, Any]:
        return {"known_hosts_file": str(self._known_hosts.ddpctl_file), "connect_timeout": self.options.connect_timeout}

    def close(self) -> None:
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> HostSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_identity(conn: Connection) -> tuple[tuple[str, int], str]:
    """What a host is, however it was typed: the address and port connected to (the target's own names through a
    jump host or ProxyCommand) and its host key's fingerprint."""
    transport = conn.transport
    sock = transport.sock
    peer = sock.getpeername() if isinstance(sock, socket.socket) else (conn.target.hostname, conn.target.port)
    return (str(peer[0]), int(peer[1])), fingerprint(transport.get_remote_server_key())
