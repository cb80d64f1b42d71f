"""Runs on a host under the run's python (standard library only; sent as this file's text by
launcher/transport/sync.py, `PYTHON -c SOURCE OP ROOT`): the host's side of shipping a directory. OP `manifest`
prints ROOT's files as one JSON object (symlinks reported, never followed; what cannot be read is listed as
unreadable, with why, never fatal); `mkdirs` and `prune` read a JSON list of relative paths on stdin and create
those folders / remove those files (and the folders they leave empty) under ROOT."""

import hashlib
import json
import os
import stat
import sys
import time
from typing import Any


def safe_path(root: str, rel: str) -> str:
    """ROOT/rel, refusing (exit 1, one line) a path that is absolute, climbs out of ROOT or has an empty part."""
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts:
        raise SystemExit("unsafe path " + repr(rel))
    return os.path.join(root, rel)


def manifest(root: str, deadline: "float | None" = None) -> "dict[str, Any]":
    """{"exists": bool, "entries": [...]}: every file under `root` with its size, sha256 and mode; links,
    special files and what could not be read (with `reason`) as entries of their own type. A path whose bytes are
    not UTF-8 is given escaped, with its bytes in hex as `raw`. Past `deadline` (time.monotonic()), TimeoutError."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return {"exists": False, "entries": []}
    if not stat.S_ISDIR(st.st_mode):
        raise SystemExit(root + " is not a directory")
    entries: list[dict[str, Any]] = []

    def add(rel: str, **fields: Any) -> None:
        raw = os.fsencode(rel)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            fields["raw"] = raw.hex()
            rel = raw.decode("utf-8", "backslashreplace")
        entries.append(dict(path=rel, **fields))

    def unreadable(rel: str, e: OSError) -> None:
        add(rel, type="unreadable", reason="cannot read it: " + (e.strerror or str(e)))

    def unlisted(err: OSError) -> None:
        add(os.path.relpath(str(err.filename), root), type="unreadable",
            reason="cannot list the folder: " + (err.strerror or str(err)))

    for top, dirs, files in os.walk(root, onerror=unlisted):
        for name in sorted(dirs + files):
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            except OSError as e:
                unreadable(rel, e)
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if stat.S_ISLNK(st.st_mode):
                add(rel, type="link")
                continue
            if not stat.S_ISREG(st.st_mode):
                add(rel, type="special")
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("listing " + root + " took too long")
            digest = file_digest(full)
            if isinstance(digest, OSError):
                unreadable(rel, digest)
            elif digest is not None:
                add(rel, type="file", size=digest[0], sha256=digest[1], mode=st.st_mode & 0o777)
    return {"exists": True, "entries": entries}


def file_digest(path: str) -> "tuple[int, str] | OSError | None":
    """(size, sha256 hex) of a regular file read without following a link and without blocking on a FIFO that
    took its place; None when it is gone or no longer a regular file; the error when it cannot be read."""
    h, size = hashlib.sha256(), 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                size += len(block)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e
    return size, h.hexdigest()


def make_dirs(root: str, rels: "list[str]") -> None:
    """`root` and each folder of `rels` under it."""
    for rel in ["", *rels]:
        os.makedirs(safe_path(root, rel) if rel else root, exist_ok=True)


def prune(root: str, rels: "list[str]") -> None:
    """Remove each file of `rels` under `root`, then the folders above it that it leaves empty (never `root`)."""
    for rel in rels:
        path = safe_path(root, rel)
        if os.path.lexists(path):
            os.unlink(path)
        parent = os.path.dirname(rel)
        while parent:
            try:
                os.rmdir(os.path.join(root, parent))
            except OSError:
                break
            parent = os.path.dirname(parent)


def main(argv: "list[str]") -> None:
    op, root = argv[0], argv[1]
    if op == "manifest":
        print(json.dumps(manifest(root)))
    elif op == "mkdirs":
        make_dirs(root, json.load(sys.stdin))
    elif op == "prune":
        prune(root, json.load(sys.stdin))


if __name__ == "__main__":  # `python -c SOURCE OP ROOT` on the host
    main(sys.argv[1:])
