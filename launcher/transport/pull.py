"""Pull a host's directory back, incrementally, one verified file at a time.

The host is untrusted: absolute paths and `..` in its answer are refused before anything is written, symbolic
links are skipped (named, never followed), and every file lands in a temporary name beside its destination, is
verified against the host's sha256, then renamed, so an interrupted pull leaves no partial final file and the
next pull completes it.

Per file, not per node: a file the host cannot read (mode 000, in a folder it cannot list), one that vanishes,
changes or changes type between listing and copying, or one that cannot be placed here (an earlier pull's file
where the host now has a folder) is named in `not_pulled` with why, and everything else still comes back
verified. A name that is not UTF-8 on the host is stored under an escaped name (its odd bytes written `\\xff`),
recorded in `escaped`. Only what ends the whole pull raises HostError: the connection lost, this machine's disk
full or read-only, a host answer that escapes the directory, a local link leading outside it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from launcher.errors import HostError
from launcher.transport.digest import file_sha256
from launcher.transport.pathspec_loader import pathspec
from launcher.transport.prefetch_threads import quiet_prefetch_failures
from launcher.transport.ssh import Connection
from launcher.transport.sync import CHUNK, PART_MARK, RemoteEntry, part_name, remote_manifest

ProgressFn = Callable[[str, int], None]  # (relative path, bytes done so far)
CHANGED = "changed on the host while it was copied"
# This machine cannot take any file: the whole pull stops (each file would fail the same way).
LOCAL_FATAL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


@dataclass(frozen=True)
class PullStats:
    files_fetched: int
    bytes_fetched: int
    files_unchanged: int
    verified: int  # files whose local copy was checked against the host's sha256 (fetched + unchanged)
    skipped_special: int = 0
    skipped_links: tuple[str, ...] = ()  # symbolic links on the host: named, never followed nor recreated
    not_pulled: tuple[tuple[str, str], ...] = ()  # (relative path, why) of what could not be pulled
    escaped: tuple[tuple[str, str], ...] = ()  # (local name, the host's name as Python writes its bytes)


class TransferChangedError(HostError):
    """A file's bytes did not match the sha256 the host listed: it changed while it was fetched; pull again."""


class _NotPulled(Exception):
    """One file that cannot be pulled, and why (the pull goes on with the others)."""


def pull_tree(conn: Connection, remote_dir: str, local_dir: Path, *, include: Sequence[str] | None = None,
              missing_ok: bool = False, python: str = "python3", progress: ProgressFn | None = None,
              exclude: Callable[[RemoteEntry], bool] | None = None) -> PullStats:
    """Copy remote_dir's files into local_dir, fetching only those whose sha256 differs; each one verified.

    `include`: gitignore-style patterns; only matching paths are pulled; `exclude`: entries it says yes to are
    not (e.g. files equal to what was shipped). What cannot be pulled is named in the stats, never fatal.
    """
    local_dir = Path(local_dir)
    exists, entries = remote_manifest(conn, remote_dir, python)
    if not exists:
        if missing_ok:
            return PullStats(0, 0, 0, 0)
        raise HostError(conn.label, f"{remote_dir} does not exist on the host")
    wanted = pathspec.GitIgnoreSpec.from_lines(include) if include else None
    files, special, links, not_pulled = [], 0, [], []
    for entry in entries:
        _check_remote_path(conn, remote_dir, entry)
        if entry.path != "." and ((wanted is not None and not wanted.match_file(entry.path))
                                  or (exclude is not None and exclude(entry))):
            continue
        if entry.type == "special":
            special += 1  # fifos, sockets, devices: nothing to copy
        elif entry.type == "file":
            files.append(entry)
        elif entry.type == "unreadable":
            not_pulled.append((entry.path, f"the host {entry.reason or 'cannot read it'}"))
        else:
            links.append(entry.path)
    local_dir.mkdir(parents=True, exist_ok=True)
    root = local_dir.resolve()
    _remove_stale_parts(root)
    fetched = fetched_bytes = unchanged = 0
    escaped, taken = [], set()
    for entry in files:
        try:
            if entry.path in taken:
                raise _NotPulled("its escaped name is another file's on the host")
            taken.add(entry.path)
            dest = _local_destination(conn, root, entry.path)
            if dest.is_file() and not dest.is_symlink() and file_sha256(dest) == entry.sha256:
                unchanged += 1
            else:
                fetched_bytes += _fetch_verified(conn, remote_dir, dest, entry, progress)
                fetched += 1
        except _NotPulled as why:
            not_pulled.append((entry.path, str(why)))
            continue
        if entry.raw is not None:
            escaped.append((entry.path, repr(os.fsdecode(entry.raw))))
    return PullStats(fetched, fetched_bytes, unchanged, fetched + unchanged, special, tuple(links),
                     tuple(not_pulled), tuple(escaped))


def _check_remote_path(conn: Connection, remote_dir: str, entry: RemoteEntry) -> None:
    parts = entry.path.split("/")
    whole = entry.path == "." and entry.type == "unreadable"  # the folder itself cannot be listed
    bad = (entry.path.startswith("/") or ".." in parts or "" in parts or ("." in parts and not whole)
           or "\x00" in entry.path or entry.type not in ("file", "link", "special", "unreadable")
           or (entry.raw is not None and (b"\x00" in entry.raw or b".." in entry.raw.split(b"/"))))
    if bad:
        raise HostError(conn.label, f"refusing to pull {entry.path!r} from {remote_dir}: the path escapes the "
                                    "directory (the host may be compromised)")
    try:
        entry.path.encode()
    except UnicodeEncodeError as e:
        raise HostError(conn.label, f"refusing to pull {entry.path!r}: the host's manifest is malformed") from e


def _local_destination(conn: Connection, root: Path, rel: str) -> Path:
    """root/rel with its parents created; refuses (HostError) if a local symlink would take it outside root."""
    dest = root / rel
    real_parent = dest.parent.resolve()
    if real_parent != root and root not in real_parent.parents:
        raise HostError(conn.label, f"refusing to write {rel}: {dest.parent} leads outside {root}")
    try:
        real_parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        in_way = next(p for p in [real_parent, *real_parent.parents] if p.exists() or p.is_symlink())
        raise _NotPulled(f"an earlier pull's file {in_way.relative_to(root)} is where the host now has a "
                         "folder") from None
    except OSError as e:
        _local_failure(conn, rel, e)
    if dest.is_symlink():
        dest.unlink()  # a local link in the destination must not redirect the write
    elif dest.is_dir():
        raise _NotPulled("an earlier pull's folder of that name is where the host now has a file")
    return real_parent / dest.name


def _fetch_verified(conn: Connection, remote_dir: str, dest: Path, entry: RemoteEntry,
                    progress: ProgressFn | None) -> int:
    tmp = dest.parent / part_name(dest.name)
    remote_path = f"{remote_dir}/{entry.path}" if entry.raw is None else remote_dir.encode() + b"/" + entry.raw
    h, done = hashlib.sha256(), 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        _local_failure(conn, entry.path, e)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                src = conn.sftp.open(remote_path, "rb")  # paramiko takes bytes paths as they are
            except OSError as e:
                _remote_failure(conn, entry.path, e)
            with src:
                quiet_prefetch_failures()  # its read-ahead thread's failure is this copy's, said once, here
                src.prefetch(entry.size)
                while True:
                    try:
                        block = src.read(CHUNK)
                    except OSError as e:
                        _remote_failure(conn, entry.path, e)
                    if not block:
                        break
                    try:
                        out.write(block)
                    except OSError as e:
                        _local_failure(conn, entry.path, e)
                    h.update(block)
                    done += len(block)
                    if progress:
                        progress(entry.path, done)
        if h.hexdigest() != entry.sha256:
            raise _NotPulled(CHANGED)
        try:
            os.chmod(tmp, (entry.mode & 0o755) | 0o600)
            os.replace(tmp, dest)
        except OSError as e:
            _local_failure(conn, entry.path, e)
    finally:
        if tmp.exists():
            tmp.unlink()
    return done


def _remote_failure(conn: Connection, rel: str, error: OSError) -> NoReturn:
    """Name one file the host would not give (raise _NotPulled), unless the connection itself is gone."""
    channel = conn.sftp.get_channel()
    if channel is None or channel.closed or not channel.get_transport().is_active():
        raise HostError(conn.label, f"fetching {rel} failed: {error}") from error
    if error.errno == errno.ENOENT:
        raise _NotPulled("vanished on the host before it was copied") from None
    if error.errno == errno.EACCES:
        raise _NotPulled("the host cannot read it: Permission denied") from None
    raise _NotPulled(f"the host could not read it ({error}); it may have changed type") from None


def _local_failure(conn: Connection, rel: str, error: OSError) -> NoReturn:
    """Name one file that cannot be written here (raise _NotPulled); a full or read-only disk ends the pull."""
    if error.errno in LOCAL_FATAL:
        raise HostError(conn.label, f"fetching {rel} failed: {error}") from error
    raise _NotPulled(f"cannot be written here: {error.strerror or error}") from None


def _remove_stale_parts(root: Path) -> None:
    """Delete temporary files an interrupted earlier pull left behind."""
    for top, _dirs, files in os.walk(root):
        for name in files:
            if name.startswith(".") and PART_MARK in name:
                path = os.path.join(top, name)
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISREG(os.lstat(path).st_mode):
                        os.unlink(path)
