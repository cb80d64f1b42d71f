"""Atomic file writes: a temporary file in the same folder, fsync, rename; readers never see half a file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

TEMP_MARK = ".tmp-"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would keep results from the other users of a host
        with os.fdopen(fd, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def is_temp_file(path: Path) -> bool:
    """A leftover from a write that died before its rename."""
    return path.name.startswith(".") and TEMP_MARK in path.name


def _fsync_dir(directory: Path) -> None:
    # The rename itself is only durable once the directory entry is on disk.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
