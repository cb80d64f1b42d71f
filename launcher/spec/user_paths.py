"""Files ddpctl writes at a path the user gave (`--save-config FILE`, the files of `report --out DIR`) and folders
it writes under (`--runs-dir`, `report --out`): what such a path may be.

- A file path must name a regular file (replaced whole, atomically) or nothing yet (created) in a folder that
  exists (no folder is made for it). A device, a FIFO, a socket or a directory there is refused in one line:
  never replaced, never written into, never waited on.
- A symbolic link is written through: the link stays, the file it points to is created or replaced, by the same
  rules (a link to a device is refused like the device). This is what a shell's `>` and editors do.
- A folder path must name a directory (a link to one is followed) or nothing yet (created).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from launcher.errors import SpecError

WHAT_IT_IS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((words for test, words in WHAT_IT_IS if test(mode)), "not a regular file")


def file_target(path: Path, option: str, fix: str = "give the path of a file to write (it is created, or replaced "
                                                    "whole)") -> Path:
    """The file to write for the user's `path`: the path itself, or what its symbolic link points to; SpecError
    (one line) when that is there and is not a regular file."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    via = f" (the link leads to {target})" if target != path else ""
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (what cannot be made is named when writing)
        return target
    except OSError as e:
        raise SpecError(f"{option} {path}: cannot use it ({e.strerror or e}){via}") from None
    if not stat.S_ISREG(mode):
        raise SpecError(f"{option} {path} is {kind_of(mode)}{via}, not a regular file: {fix}")
    return target


def folder_target(path: Path, option: str, purpose: str = "a directory") -> Path:
    """`path` unless it is there and is not a directory (a link to one is followed); SpecError (one line)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return path
    except OSError as e:
        raise SpecError(f"{option} {path}: cannot use it ({e.strerror or e})") from None
    if not stat.S_ISDIR(mode):
        what = "a file" if stat.S_ISREG(mode) else kind_of(mode)
        raise SpecError(f"{option} {path} is {what}, not a directory: give {purpose} (it is created if missing)")
    return path


def read_user_file(path: Path | str, what: str, limit: int, fix: str = "give the path of a regular file") -> bytes:
    """The bytes of a file the user named (a key, known_hosts, a plan, a config): opened without waiting (a FIFO
    would block the open) and refused in one line (SpecError) when it is not a regular file or holds more than
    `limit` bytes (/dev/zero never ends; a /proc file says size 0 and is read only up to the limit). Other
    OSErrors, a missing file among them, go to the caller, which knows what a missing file means there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpecError(f"{what} {path} is {kind_of(mode)}, not a regular file: {fix}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise SpecError(f"{what} {path} is larger than {_bytes(limit)}, more than such a file ever holds: {fix}")
    return b"".join(chunks)


def _bytes(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count >> 10} KiB"
