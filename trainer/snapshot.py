"""Snapshot files: one per saved epoch, `snapshot-epoch-NNNNNN.pt`, each a header line carrying the sha256
of the torch.save payload that follows. Written atomically; the newest K are kept; a corrupt or truncated
one is reported and skipped in favour of the previous good one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch

from trainer.errors import SnapshotError
from trainer.files import atomic_write_bytes, is_temp_file

_Key = TypeVar("_Key", int, tuple[int, int])  # an epoch, or (epoch, step)

MAGIC = b"DDPCTL-SNAPSHOT 1 sha256="
STALE_TEMP_SECONDS = 600
# A snapshot after a finished epoch, or (a stop for a requeue, trainer/requeue.py) after a step within the next one.
_NAME = re.compile(r"^snapshot-epoch-(\d{6,})(?:-step-(\d{8,}))?\.pt$")


def snapshot_path(directory: Path, epoch: int, step: int = 0) -> Path:
    """Where the snapshot taken after `epoch` finished lives (step > 0: after `step` steps of the next epoch)."""
    name = f"snapshot-epoch-{epoch:06d}" + (f"-step-{step:08d}" if step else "")
    return directory / f"{name}.pt"


def list_positions(directory: Path) -> list[tuple[tuple[int, int], Path]]:
    """((epoch, step), path) of every snapshot file in `directory`, newest first (validity not checked)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_file():
            found.append(((int(match.group(1)), int(match.group(2) or 0)), path))
    return sorted(found, reverse=True)


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every end-of-epoch snapshot file in `directory`, newest first (validity not checked)."""
    return [(epoch, path) for (epoch, step), path in list_positions(directory) if step == 0]


def save_snapshot(directory: Path, epoch: int, state: dict[str, Any], keep: int, step: int = 0) -> Path:
    """Write `state` as the snapshot of `epoch` (and `step` steps into the next; atomically, with its checksum);
    keep the newest `keep`."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    path = snapshot_path(directory, epoch, step)
    atomic_write_bytes(path, header + payload)
    _prune(directory, keep)
    return path


def read_snapshot(path: Path) -> dict[str, Any]:
    """The state saved in `path`, after checking its checksum; SnapshotError if it is corrupt or truncated."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    newline = raw.find(b"\n")
    if not raw.startswith(MAGIC) or newline != len(MAGIC) + 64:
        raise SnapshotError(f"snapshot {path} has no valid header (truncated or not a ddpctl snapshot)")
    expected = raw[len(MAGIC) : newline].decode("ascii", "replace")
    payload = raw[newline + 1 :]
    if hashlib.sha256(payload).hexdigest() != expected:
        raise SnapshotError(f"snapshot {path} fails its sha256 check (truncated or corrupt)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SnapshotError(f"snapshot {path} cannot be loaded: {exc}") from None
    if not isinstance(state, dict):
        raise SnapshotError(f"snapshot {path} does not hold a state dictionary")
    return state


def newest_valid(
    directory: Path, warn: Callable[[str], None], at_most: int | None = None
) -> tuple[int, dict[str, Any]] | None:
    """The newest snapshot (of an epoch <= at_most) whose checksum holds, as (epoch, state); None if none.

    Every invalid one met on the way is named through `warn`.
    """
    return _newest_readable(list_snapshots(directory), warn, at_most)


def newest_valid_position(
    directory: Path, warn: Callable[[str], None], at_most: tuple[int, int] | None = None
) -> tuple[tuple[int, int], dict[str, Any]] | None:
    """newest_valid over every snapshot, mid-epoch ones included: ((epoch, step), state), or None."""
    return _newest_readable(list_positions(directory), warn, at_most)


def _newest_readable(
    found: Iterable[tuple[_Key, Path]], warn: Callable[[str], None], at_most: _Key | None
) -> tuple[_Key, dict[str, Any]] | None:
    """The first of `found` (newest first) not past `at_most` that reads back whole; each unreadable one warned."""
    for key, path in found:
        if at_most is not None and key > at_most:
            continue
        try:
            return key, read_snapshot(path)
        except SnapshotError as exc:
            warn(f"{exc}; trying the previous one")
    return None


def _prune(directory: Path, keep: int) -> None:
    for _, path in list_positions(directory)[keep:]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    # Temporary files left by a writer killed mid-write; only stale ones, since another node's writer may
    # share this folder (a shared file system) and be writing right now.
    now = time.time()
    for path in directory.iterdir():
        if is_temp_file(path) and path.name.startswith(".snapshot-"):
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                    path.unlink()
