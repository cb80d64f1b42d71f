"""Host-key trust: ~/.ssh/known_hosts (read only) plus ddpctl's own file, where first-use trust is recorded.

A host is looked up under the name OpenSSH uses: `host` for port 22, `[host]:port` otherwise. Hashed entries
(`|1|salt|hash`) and simple wildcards are understood. Keys are never added silently: only
`record()` (called when the user passed --accept-new-host-keys) writes, and only to ddpctl's file.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

ACCEPT_FLAG = "--accept-new-host-keys"


def default_known_hosts_path() -> Path:
    """ddpctl's own known-hosts file: $DDPCTL_KNOWN_HOSTS, else ~/.config/ddpctl/known_hosts."""
    env = os.environ.get("DDPCTL_KNOWN_HOSTS")
    return Path(env) if env else Path.home() / ".config" / "ddpctl" / "known_hosts"


def host_key_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as OpenSSH prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts entry that matches a host: its key and where it was written."""

    key: paramiko.PKey
    path: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


class KnownHosts:
    """The union of the user's OpenSSH known_hosts and ddpctl's own file."""

    def __init__(self, ddpctl_file: Path | None = None, system_file: Path | None = None) -> None:
        self.ddpctl_file = ddpctl_file or default_known_hosts_path()
        self.system_file = system_file if system_file is not None else Path.home() / ".ssh" / "known_hosts"

    def lookup(self, name: str) -> list[KnownKey]:
        """Every entry for `name` (as host_key_name gives it), from both files, in file order."""
        found: list[KnownKey] = []
        for path in (self.system_file, self.ddpctl_file):
            found.extend(_matching_entries(path, name))
        return found

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Append `name keytype base64` to ddpctl's file (created mode 0600 in a 0700 directory)."""
        self.ddpctl_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.ddpctl_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _matching_entries(path: Path, name: str) -> list[KnownKey]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    found = []
    for lineno, line in enumerate(lines, start=1):
        text = line.strip()
        # '@cert-authority' / '@revoked' lines are not plain trust: skip them (they never grant trust here).
        if not text or text.startswith(("#", "@")):
            continue
        try:
            entry = HostKeyEntry.from_line(text, lineno)
        except (paramiko.SSHException, ValueError, TypeError):
            continue
        if entry is None or entry.key is None:
            continue
        if _names_match(entry.hostnames, name):
            found.append(KnownKey(entry.key, path, lineno))
    return found


def _names_match(patterns: list[str], name: str) -> bool:
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            hit = paramiko.HostKeys.hash_host(name, pattern) == pattern
        else:
            hit = _wildcard(pattern).fullmatch(name) is not None
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def _wildcard(pattern: str) -> re.Pattern[str]:
    """OpenSSH host patterns: only '*' and '?' are special ('[host]:port' brackets are literal)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))
