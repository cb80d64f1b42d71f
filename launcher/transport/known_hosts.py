"""Host-key trust: ~/.ssh/known_hosts (read only) plus ddpctl's own file, where first-use trust is recorded.

A host is looked up under the name OpenSSH uses: `host` for port 22, `[host]:port` otherwise. Hashed entries
(`|1|salt|hash`), simple wildcards and negated patterns are understood. A host with any plain entry is known
(even one of a key type paramiko cannot read: it pins the host all the same); `@revoked` lines name keys never
to accept; `@cert-authority` lines are ignored (host certificates are not used). Keys are never added
silently: only `record()` (called when the user passed --accept-new-host-keys) writes, and only to ddpctl's file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import SpecError
from launcher.spec.user_paths import read_user_file
from launcher.transport.paramiko_loader import paramiko

ACCEPT_FLAG = "--accept-new-host-keys"
KNOWN_HOSTS_MAX_BYTES = 64 << 20  # a line per host key: millions of hosts


def default_known_hosts_path() -> Path:
    """ddpctl's own known-hosts file: $DDPCTL_KNOWN_HOSTS, else ~/.config/ddpctl/known_hosts (absolute: run.json
    records it)."""
    env = os.environ.get("DDPCTL_KNOWN_HOSTS")
    return Path(os.path.abspath(env)) if env else Path.home() / ".config" / "ddpctl" / "known_hosts"


def host_key_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as OpenSSH prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts entry that matches a host: its key type, key and where it was written."""

    key_type: str
    key: paramiko.PKey | None  # None: a key paramiko cannot read, which no presented key equals
    path: Path
    line: int

    def holds(self, key: paramiko.PKey) -> bool:
        return self.key is not None and self.key_type == key.get_name() and self.key.asbytes() == key.asbytes()

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


class KnownHosts:
    """The union of the user's OpenSSH known_hosts and ddpctl's own file."""

    def __init__(self, ddpctl_file: Path | None = None, system_file: Path | None = None,
                 record_keys: bool = True) -> None:
        self.ddpctl_file = ddpctl_file or default_known_hosts_path()
        self.record_keys = record_keys
        # Keys accepted but not recorded (record_keys False: a dry run), by host key name.
        self._session_keys: dict[str, list[KnownKey]] = {}
        self.system_file = system_file if system_file is not None else Path.home() / ".ssh" / "known_hosts"

    def lookup(self, name: str) -> list[KnownKey]:
        """The keys pinned for `name` (as host_key_name gives it), from both files, in file order."""
        return self._entries(name, revoked=False) + self._session_keys.get(name, [])

    def revoked(self, name: str) -> list[KnownKey]:
        """The `@revoked` entries that apply to `name`: keys never to accept."""
        return self._entries(name, revoked=True)

    def _entries(self, name: str, *, revoked: bool) -> list[KnownKey]:
        found: list[KnownKey] = []
        for path in (self.system_file, self.ddpctl_file):
            found.extend(_matching_entries(path, name, "@revoked" if revoked else None))
        return found

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Append `name keytype base64` to ddpctl's file (created mode 0600 in a 0700 directory); without
        record_keys, trust it for this object's life only."""
        if not self.record_keys:
            self._session_keys.setdefault(name, []).append(KnownKey(key.get_name(), key, Path("(this dry run)"), 0))
            return
        self.ddpctl_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.ddpctl_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _matching_entries(path: Path, name: str, marker: str | None) -> list[KnownKey]:
    """Entries for `name` with that marker (None: plain lines) in one file; `marker hosts keytype base64 ...`."""
    try:
        lines = read_user_file(path, "the known_hosts file", KNOWN_HOSTS_MAX_BYTES,
                               "give a known_hosts file (DDPCTL_KNOWN_HOSTS)").decode(errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise SpecError(f"the known_hosts file {path} cannot be read ({e.strerror or e})") from None
    found = []
    for lineno, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        line_marker = fields.pop(0) if fields[0].startswith("@") else None
        if line_marker != marker or len(fields) < 3:
            continue
        hosts, key_type, blob = fields[:3]
        if _names_match(hosts.split(","), name):
            found.append(KnownKey(key_type, _load_key(key_type, blob), path, lineno))
    return found


def _load_key(key_type: str, blob: str) -> paramiko.PKey | None:
    try:
        key = paramiko.PKey.from_type_string(key_type, base64.b64decode(blob, validate=True))
    except (paramiko.SSHException, paramiko.pkey.UnknownKeyType, ValueError, TypeError):  # binascii.Error: ValueError
        return None
    return key if key.get_name() == key_type else None


def _names_match(patterns: list[str], name: str) -> bool:
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            hit = _hashed_match(pattern, name)
        else:
            hit = _wildcard(pattern).fullmatch(name) is not None
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def _hashed_match(pattern: str, name: str) -> bool:
    """Whether `|1|salt|hash` (base64 of an HMAC-SHA1 key and of the name's HMAC under it) hashes `name`; a
    malformed one matches nothing, as OpenSSH ignores it."""
    parts = pattern.split("|")
    if len(parts) != 4:
        return False
    try:
        salt, digest = base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
    except ValueError:  # binascii.Error
        return False
    return len(salt) == 20 and hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def _wildcard(pattern: str) -> re.Pattern[str]:
    """OpenSSH host patterns: only '*' and '?' are special ('[host]:port' brackets are literal)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))
