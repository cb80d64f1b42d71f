"""Ship a directory to a host, incrementally, by sha256 manifests (pulling one back: launcher/transport/pull.py).

The host computes its own manifest with a small script run by its python (`--python`, default python3;
symlinks reported, never followed; what it cannot read is listed as unreadable, with why, never fatal).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from launcher.errors import DdpctlError, HostError
from launcher.transport.digest import file_sha256
from launcher.transport.ssh import Connection

# Never shipped unless a .ddpctlignore line re-includes it (`!NAME`): caches, runs, and what holds credentials,
# since a rented machine belongs to a stranger.
DEFAULT_IGNORE = ("__pycache__/", ".git/", "runs/", "*.pyc", ".venv/",
                  ".ssh/", ".gnupg/", ".aws/", ".netrc", ".env", "*.pem", "id_rsa*", "id_ecdsa*", "id_ed25519*",
                  ".config/ddpctl/", ".config/vastai/", ".vast_api_key")
IGNORE_FILES = (".gitignore", ".ddpctlignore")
PART_MARK = ".ddpctl-part-"  # temporary files: `.NAME.ddpctl-part-RANDOM` in the destination's directory
CHUNK = 1 << 16
NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, tmpfs)

# Runs on the host as `PYTHON -c SCRIPT OP ROOT`; OP manifest prints JSON, mkdirs/prune read a JSON list on stdin.
REMOTE_SCRIPT = r"""
import hashlib, json, os, stat, sys
op, root = sys.argv[1], sys.argv[2]
def safe(rel):
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts: sys.exit("unsafe path " + repr(rel))
    return os.path.join(root, rel)
if op == "manifest":
    try: st = os.lstat(root)
    except FileNotFoundError: print(json.dumps({"exists": False, "entries": []})); sys.exit()
    if not stat.S_ISDIR(st.st_mode): sys.exit(root + " is not a directory")
    entries = []
    def add(rel, **fields):
        raw = os.fsencode(rel)
        try: raw.decode("utf-8")
        except UnicodeDecodeError: fields["raw"] = raw.hex(); rel = raw.decode("utf-8", "backslashreplace")
        entries.append(dict(path=rel, **fields))
    def unreadable(rel, e): add(rel, type="unreadable", reason="cannot read it: " + (e.strerror or str(e)))
    def unlisted(err):
        add(os.path.relpath(err.filename, root), type="unreadable",
            reason="cannot list the folder: " + (err.strerror or str(err)))
    for top, dirs, files in os.walk(root, onerror=unlisted):
        for name in sorted(dirs + files):
            full = os.path.join(top, name); rel = os.path.relpath(full, root)
            try: st = os.lstat(full)
            except FileNotFoundError: continue
            except OSError as e: unreadable(rel, e); continue
            if stat.S_ISDIR(st.st_mode): continue
            if stat.S_ISLNK(st.st_mode): add(rel, type="link"); continue
            if not stat.S_ISREG(st.st_mode): add(rel, type="special"); continue
            h, size = hashlib.sha256(), 0
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode): continue
                    for block in iter(lambda: f.read(1 << 20), b""): h.update(block); size += len(block)
            except FileNotFoundError: continue
            except OSError as e: unreadable(rel, e); continue
            add(rel, type="file", size=size, sha256=h.hexdigest(), mode=st.st_mode & 0o777)
    print(json.dumps({"exists": True, "entries": entries}))
elif op == "mkdirs":
    for rel in [""] + json.load(sys.stdin): os.makedirs(safe(rel) if rel else root, exist_ok=True)
elif op == "prune":
    for rel in json.load(sys.stdin):
        path = safe(rel)
        if os.path.lexists(path): os.unlink(path)
        parent = os.path.dirname(rel)
        while parent:
            try: os.rmdir(os.path.join(root, parent))
            except OSError: break
            parent = os.path.dirname(parent)
"""


@dataclass(frozen=True)
class ShipStats:
    files_sent: int
    bytes_sent: int
    files_unchanged: int
    files_deleted: int = 0


@dataclass(frozen=True)
class RemoteEntry:
    path: str  # relative; a name that is not UTF-8 on the host has its odd bytes escaped (`\\xff`)
    type: str  # "file", "link", "special" or "unreadable" (the host could not read it: `reason` says why)
    size: int = 0
    sha256: str = ""
    mode: int = 0o644
    reason: str = ""
    raw: bytes | None = None  # the host's own bytes of `path`, when they are not UTF-8


def part_name(name: str) -> str:
    """The temporary name a file is written under beside `name` (`.NAME.ddpctl-part-RANDOM`), NAME cut short so
    that the whole stays within NAME_MAX bytes (a 249-character name still gets one)."""
    token = secrets.token_hex(4)
    room = NAME_MAX - len(f".{PART_MARK}{token}".encode())
    head = name.encode(errors="surrogateescape")[:room].decode(errors="ignore")
    return f".{head}{PART_MARK}{token}"


def check_ship_dir(directory: Path) -> None:
    """`up -- CMD` ships the working directory: refuse the home directory and the root, whose trees hold far more
    than a project (keys, tokens, other projects)."""
    resolved = directory.resolve()
    if resolved == Path("/") or resolved == Path.home().resolve():
        raise DdpctlError(f"`-- CMD` ships the working directory to the hosts, and {resolved} is your "
                          f"{'root' if resolved == Path('/') else 'home'} directory: cd into the project first")


def ignore_spec(local_dir: Path, extra: Sequence[str] = ()) -> pathspec.PathSpec:
    """Defaults + the directory's .gitignore and .ddpctlignore (top level) + extra patterns, gitignore rules."""
    lines = list(DEFAULT_IGNORE)
    for name in IGNORE_FILES:
        path = local_dir / name
        if path.is_file():
            lines += path.read_text(errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines([*lines, *extra])


def local_manifest(local_dir: Path, spec: pathspec.PathSpec) -> dict[str, tuple[int, str, int]]:
    """relative path -> (size, sha256, mode) of every file not ignored; symlinks to files count as files."""
    found: dict[str, tuple[int, str, int]] = {}
    for top, dirs, files in os.walk(local_dir):
        rel_top = os.path.relpath(top, local_dir)
        rel_top = "" if rel_top == "." else rel_top + "/"
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(top, d))
                         and not spec.match_file(rel_top + d + "/"))
        for name in sorted(files):
            rel, full = rel_top + name, os.path.join(top, name)
            if spec.match_file(rel) or not os.path.isfile(full):
                continue
            st = os.stat(full)
            found[rel] = (st.st_size, file_sha256(Path(full)), st.st_mode & 0o777)
    return found


def tree_digest(local_dir: Path) -> str:
    """"sha256:<hex>" over what ship_tree sends of local_dir: every file's path, size, content and mode."""
    manifest = local_manifest(local_dir, ignore_spec(local_dir))
    lines = "".join(f"{rel}\0{size}\0{sha}\0{mode:o}\n" for rel, (size, sha, mode) in sorted(manifest.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def remote_manifest(conn: Connection, remote_dir: str, python: str = "python3") -> tuple[bool, list[RemoteEntry]]:
    """(exists, entries) of remote_dir, computed on the host by `python`; HostError on a malformed answer."""
    result = conn.check([python, "-c", REMOTE_SCRIPT, "manifest", remote_dir], f"listing {remote_dir}", timeout=600)
    try:
        data = json.loads(result.stdout)
        entries = [RemoteEntry(str(e["path"]), str(e["type"]), int(e.get("size", 0)), str(e.get("sha256", "")),
                               int(e.get("mode", 0o644)), str(e.get("reason", "")),
                               bytes.fromhex(e["raw"]) if e.get("raw") else None) for e in data["entries"]]
        return bool(data["exists"]), entries
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise HostError(conn.label, f"malformed manifest of {remote_dir}: {e}") from e


def _with_parents(folder: str) -> list[str]:
    """`a/b/c` -> [`a/b/c`, `a/b`, `a`]."""
    parts = folder.split("/") if folder else []
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def ship_tree(conn: Connection, local_dir: Path, remote_dir: str, *, python: str = "python3") -> ShipStats:
    """Make remote_dir equal local_dir (minus ignored files), sending only new or changed files; `python` is
    the host's interpreter, which lists, creates and prunes there."""
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise DdpctlError(f"cannot ship {local_dir}: not a directory")
    spec = ignore_spec(local_dir)
    local = local_manifest(local_dir, spec)
    exists, entries = remote_manifest(conn, remote_dir, python)
    remote = {e.path: e for e in entries}
    to_send = [rel for rel, (_, sha, mode) in local.items()
               if rel not in remote or remote[rel].type != "file" or remote[rel].sha256 != sha
               or remote[rel].mode != mode]
    to_delete = [e.path for e in entries if e.path not in local and not spec.match_file(e.path)]
    present = {os.path.dirname(e.path) for e in entries}  # a folder holding anything is there (and its parents)
    dirs = sorted({os.path.dirname(rel) for rel in to_send} - {""}
                  - {parent for folder in present for parent in _with_parents(folder)})
    if dirs or not exists:  # a relaunch with its folders in place needs no round trip here
        conn.check([python, "-c", REMOTE_SCRIPT, "mkdirs", remote_dir], f"creating {remote_dir}",
                   stdin=json.dumps(dirs).encode(), timeout=120)
    sent_bytes = 0
    sftp = conn.sftp if to_send else None
    for rel in to_send:
        assert sftp is not None
        final = f"{remote_dir}/{rel}"
        head, name = os.path.split(final)
        tmp = f"{head}/{part_name(name)}"
        try:
            sftp.put(str(local_dir / rel), tmp)
            sftp.chmod(tmp, local[rel][2])
            sftp.posix_rename(tmp, final)
        except OSError as e:
            with contextlib.suppress(OSError, EOFError):  # a partial upload is not left in the cache (when the
                sftp.remove(tmp)  # connection is gone, the next ship prunes it: it is in no local manifest)
            raise HostError(conn.label, f"sending {rel} to {remote_dir} failed: {e}") from e
        sent_bytes += local[rel][0]
    if to_delete:
        conn.check([python, "-c", REMOTE_SCRIPT, "prune", remote_dir], f"removing old files in {remote_dir}",
                   stdin=json.dumps(to_delete).encode(), timeout=120)
    return ShipStats(len(to_send), sent_bytes, len(local) - len(to_send), len(to_delete))
