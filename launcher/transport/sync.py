"""Ship a directory to a host, incrementally, by sha256 manifests (pulling one back: launcher/transport/pull.py).

The host computes its own manifest with launcher/remote/tree_sync.py run by its python (`--python`, default
python3; symlinks reported, never followed; what it cannot read is listed as unreadable, with why, never fatal).
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

from launcher.errors import DdpctlError, HostError
from launcher.remote import tree_sync
from launcher.remote.client_watch import GONE_STATUS
from launcher.remote.program import program
from launcher.transport.channel_output import CONNECTION_DROPPED
from launcher.transport.digest import file_sha256
from launcher.transport.pathspec_loader import pathspec
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
REMOTE_SCRIPT = program(tree_sync, end_with_client=True)  # a listing ends when ddpctl is gone


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


# A host's folder as its manifest gives it: (whether it exists, its entries).
Listing = tuple[bool, list[RemoteEntry]]


def remote_manifest(conn: Connection, remote_dir: str, python: str = "python3") -> Listing:
    """(exists, entries) of remote_dir, computed on the host by `python`; HostError on a malformed answer."""
    result = conn.run([python, "-c", REMOTE_SCRIPT, "manifest", remote_dir], timeout=600)
    if result.exit_code == GONE_STATUS:  # the program saw its SSH session end under it: the connection went
        raise HostError(conn.label, f"listing {remote_dir}: {CONNECTION_DROPPED}")
    if not result.ok:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise HostError(conn.label, f"listing {remote_dir} failed (exit {result.exit_code}): {tail[0]}")
    try:
        data = json.loads(result.stdout)
    except (ValueError, RecursionError) as e:
        raise HostError(conn.label, f"malformed manifest of {remote_dir}: {e}") from e
    return read_listing(conn.label, remote_dir, data)


def read_listing(label: str, remote_dir: str, data: object) -> Listing:
    """The Listing of the host's manifest (launcher/remote/tree_sync.py's, as JSON data, however it came: its own
    round trip or the probe's); HostError naming `label` when it is malformed."""
    try:
        if not isinstance(data, dict):
            raise TypeError(f"not an object: {str(data)[:80]}")
        entries = [RemoteEntry(str(e["path"]), str(e["type"]), int(e.get("size", 0)), str(e.get("sha256", "")),
                               int(e.get("mode", 0o644)), str(e.get("reason", "")),
                               bytes.fromhex(e["raw"]) if e.get("raw") else None) for e in data["entries"]]
        return bool(data["exists"]), entries
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise HostError(label, f"malformed manifest of {remote_dir}: {e or type(e).__name__}") from e


def _with_parents(folder: str) -> list[str]:
    """`a/b/c` -> [`a/b/c`, `a/b`, `a`]."""
    parts = folder.split("/") if folder else []
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def ship_tree(conn: Connection, local_dir: Path, remote_dir: str, *, python: str = "python3",
              listed: Listing | None = None) -> ShipStats:
    """Make remote_dir equal local_dir (minus ignored files), sending only new or changed files; `python` is
    the host's interpreter, which lists, creates and prunes there. `listed`: remote_dir as already listed (the
    probe's round trip lists the code cache); None: listed here."""
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise DdpctlError(f"cannot ship {local_dir}: not a directory")
    spec = ignore_spec(local_dir)
    local = local_manifest(local_dir, spec)
    exists, entries = listed if listed is not None else remote_manifest(conn, remote_dir, python)
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
