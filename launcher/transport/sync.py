"""Ship a directory to a host and pull one back, incrementally, by sha256 manifests.

The host computes its own manifest with a small script run by its python (`--python`, default python3;
symlinks reported, never followed). Pull treats the host as untrusted: absolute paths and `..` are refused
before anything is written, symbolic links are skipped (named, never followed), and every file lands in a
temporary name beside its destination, is verified against the host's sha256, then renamed, so an
interrupted pull leaves no partial final file and the next pull completes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Sequence
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
    for top, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            full = os.path.join(top, name); rel = os.path.relpath(full, root); st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode): continue
            if stat.S_ISLNK(st.st_mode): entries.append({"path": rel, "type": "link"}); continue
            if not stat.S_ISREG(st.st_mode): entries.append({"path": rel, "type": "special"}); continue
            h = hashlib.sha256()
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""): h.update(block)
            entries.append({"path": rel, "type": "file", "size": st.st_size, "sha256": h.hexdigest(),
                            "mode": st.st_mode & 0o777})
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
class PullStats:
    files_fetched: int
    bytes_fetched: int
    files_unchanged: int
    verified: int  # files whose local copy was checked against the host's sha256 (fetched + unchanged)
    skipped_special: int = 0
    skipped_links: tuple[str, ...] = ()  # symbolic links on the host: named, never followed nor recreated


@dataclass(frozen=True)
class RemoteEntry:
    path: str
    type: str  # "file", "link" or "special"
    size: int = 0
    sha256: str = ""
    mode: int = 0o644


ProgressFn = Callable[[str, int], None]  # (relative path, bytes done so far)


class TransferChangedError(HostError):
    """A file's bytes did not match the sha256 the host listed: it changed while it was fetched; pull again."""


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


def remote_manifest(conn: Connection, remote_dir: str, python: str = "python3") -> tuple[bool, list[RemoteEntry]]:
    """(exists, entries) of remote_dir, computed on the host by `python`; HostError on a malformed answer."""
    result = conn.check([python, "-c", REMOTE_SCRIPT, "manifest", remote_dir], f"listing {remote_dir}", timeout=600)
    try:
        data = json.loads(result.stdout)
        entries = [RemoteEntry(str(e["path"]), str(e["type"]), int(e.get("size", 0)), str(e.get("sha256", "")),
                               int(e.get("mode", 0o644))) for e in data["entries"]]
        return bool(data["exists"]), entries
    except (ValueError, KeyError, TypeError) as e:
        raise HostError(conn.label, f"malformed manifest of {remote_dir}: {e}") from e


def ship_tree(conn: Connection, local_dir: Path, remote_dir: str, *, python: str = "python3") -> ShipStats:
    """Make remote_dir equal local_dir (minus ignored files), sending only new or changed files; `python` is
    the host's interpreter, which lists, creates and prunes there."""
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise DdpctlError(f"cannot ship {local_dir}: not a directory")
    spec = ignore_spec(local_dir)
    local = local_manifest(local_dir, spec)
    _, entries = remote_manifest(conn, remote_dir, python)
    remote = {e.path: e for e in entries}
    to_send = [rel for rel, (_, sha, mode) in local.items()
               if rel not in remote or remote[rel].type != "file" or remote[rel].sha256 != sha
               or remote[rel].mode != mode]
    to_delete = [e.path for e in entries if e.path not in local and not spec.match_file(e.path)]
    dirs = sorted({os.path.dirname(rel) for rel in to_send} - {""})
    conn.check([python, "-c", REMOTE_SCRIPT, "mkdirs", remote_dir], f"creating {remote_dir}",
               stdin=json.dumps(dirs).encode(), timeout=120)
    sent_bytes = 0
    sftp = conn.sftp if to_send else None
    for rel in to_send:
        assert sftp is not None
        final = f"{remote_dir}/{rel}"
        head, name = os.path.split(final)
        tmp = f"{head}/.{name}{PART_MARK}{secrets.token_hex(4)}"
        try:
            sftp.put(str(local_dir / rel), tmp)
            sftp.chmod(tmp, local[rel][2])
            sftp.posix_rename(tmp, final)
        except OSError as e:
            raise HostError(conn.label, f"sending {rel} to {remote_dir} failed: {e}") from e
        sent_bytes += local[rel][0]
    if to_delete:
        conn.check([python, "-c", REMOTE_SCRIPT, "prune", remote_dir], f"removing old files in {remote_dir}",
                   stdin=json.dumps(to_delete).encode(), timeout=120)
    return ShipStats(len(to_send), sent_bytes, len(local) - len(to_send), len(to_delete))


def pull_tree(conn: Connection, remote_dir: str, local_dir: Path, *, include: Sequence[str] | None = None,
              missing_ok: bool = False, python: str = "python3", progress: ProgressFn | None = None,
              exclude: Callable[[RemoteEntry], bool] | None = None) -> PullStats:
    """Copy remote_dir's files into local_dir, fetching only those whose sha256 differs; each one verified.

    `include`: gitignore-style patterns; only matching paths are pulled; `exclude`: entries it says yes to are
    not (e.g. files equal to what was shipped). A host answer naming an unsafe
    path (absolute, `..`) raises HostError before anything is written; symbolic links are never followed
    nor recreated, only named in the stats.
    """
    local_dir = Path(local_dir)
    exists, entries = remote_manifest(conn, remote_dir, python)
    if not exists:
        if missing_ok:
            return PullStats(0, 0, 0, 0)
        raise HostError(conn.label, f"{remote_dir} does not exist on the host")
    wanted = pathspec.GitIgnoreSpec.from_lines(include) if include else None
    files, special, links = [], 0, []
    for entry in entries:
        _check_remote_path(conn, remote_dir, entry)
        if (wanted is not None and not wanted.match_file(entry.path)) or (exclude is not None and exclude(entry)):
            continue
        if entry.type == "special":
            special += 1  # fifos, sockets, devices: nothing to copy
        elif entry.type == "file":
            files.append(entry)
        else:
            links.append(entry.path)
    local_dir.mkdir(parents=True, exist_ok=True)
    root = local_dir.resolve()
    _remove_stale_parts(root)
    fetched = fetched_bytes = unchanged = 0
    for entry in files:
        dest = _local_destination(conn, root, entry.path)
        if dest.is_file() and not dest.is_symlink() and file_sha256(dest) == entry.sha256:
            unchanged += 1
            continue
        fetched_bytes += _fetch_verified(conn, f"{remote_dir}/{entry.path}", dest, entry, progress)
        fetched += 1
    return PullStats(fetched, fetched_bytes, unchanged, fetched + unchanged, special, tuple(links))


def _check_remote_path(conn: Connection, remote_dir: str, entry: RemoteEntry) -> None:
    parts = entry.path.split("/")
    bad = (entry.path.startswith("/") or ".." in parts or "" in parts or "\x00" in entry.path
           or entry.type not in ("file", "link", "special"))
    if bad:
        raise HostError(conn.label, f"refusing to pull {entry.path!r} from {remote_dir}: the path escapes the "
                                    "directory (the host may be compromised)")
    try:
        entry.path.encode()
    except UnicodeEncodeError as e:
        raise HostError(conn.label, f"refusing to pull {entry.path!r}: the name is not UTF-8") from e


def _local_destination(conn: Connection, root: Path, rel: str) -> Path:
    """root/rel with its parents created; refuses (HostError) if a local symlink would take it outside root."""
    dest = root / rel
    real_parent = dest.parent.resolve()
    if real_parent != root and root not in real_parent.parents:
        raise HostError(conn.label, f"refusing to write {rel}: {dest.parent} leads outside {root}")
    real_parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():
        dest.unlink()  # a local link in the destination must not redirect the write
    return real_parent / dest.name


def _fetch_verified(conn: Connection, remote_path: str, dest: Path, entry: RemoteEntry,
                    progress: ProgressFn | None) -> int:
    tmp = dest.parent / f".{dest.name}{PART_MARK}{secrets.token_hex(4)}"
    h, done = hashlib.sha256(), 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out, conn.sftp.open(remote_path, "rb") as src:
            src.prefetch(entry.size)
            while block := src.read(CHUNK):
                out.write(block)
                h.update(block)
                done += len(block)
                if progress:
                    progress(entry.path, done)
        if h.hexdigest() != entry.sha256:
            raise TransferChangedError(conn.label, f"{remote_path} changed during the transfer (sha256 mismatch); "
                                       "pull again")
        os.chmod(tmp, (entry.mode & 0o755) | 0o600)
        os.replace(tmp, dest)
    except OSError as e:
        raise HostError(conn.label, f"fetching {remote_path} failed: {e}") from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return done


def _remove_stale_parts(root: Path) -> None:
    """Delete temporary files an interrupted earlier pull left behind."""
    for top, _dirs, files in os.walk(root):
        for name in files:
            if name.startswith(".") and PART_MARK in name:
                path = os.path.join(top, name)
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
