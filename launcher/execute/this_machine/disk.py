"""A local run whose --runs-dir disk fills up: one line naming the folder and its free space, not a traceback
(the launcher's own event writes fail too) nor a bare "training failed"."""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import DdpctlError
from launcher.remote.node_report import failure_notes

# What a rank's failure note says when a write found the disk full (the trainer writes `OSError: [Errno 28] ...`).
_FULL_DISK_MARKS = (f"[Errno {errno.ENOSPC}]", "No space left on device")


def full_disk_message(run_path: Path) -> str:
    """One line: the disk under the run directory is full, how much is free, where the run's files are."""
    try:
        free = f"{shutil.disk_usage(run_path if run_path.exists() else run_path.parent).free / (1 << 20):.1f} MiB"
    except OSError:
        free = "an unknown amount"
    return (f"no space left on device under {run_path.parent} ({free} free): the run stopped; what it wrote is in "
            f"{run_path}. Free space there, or pass --runs-dir on a disk with room, and run again")


@contextlib.contextmanager
def full_disk_named(run_path: Path) -> Iterator[None]:
    """Turn a full disk met by the launcher itself (writing run.json or events) into full_disk_message, and a run
    directory that became read-only into one line too."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and str(exc.filename or "").startswith(
                str(run_path)):  # made read-only mid-run: said in one line (the run was stopped, or had ended)
            raise DdpctlError(f"the run directory {run_path} cannot be written ({exc.strerror}): what the run did "
                              "after that is not recorded there (its summary neither); make it writable "
                              "again") from None
        if exc.errno != errno.ENOSPC:
            raise
        raise DdpctlError(full_disk_message(run_path)) from None


def raise_if_disk_full(run_path: Path, exit_code: int) -> None:
    """After a failed local run: when a rank failed on a full disk, say so in one line (DdpctlError)."""
    if exit_code in (0, 130):
        return
    if any(mark in str(note["text"]) for note in failure_notes(str(run_path)) for mark in _FULL_DISK_MARKS):
        raise DdpctlError(full_disk_message(run_path))
