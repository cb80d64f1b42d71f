"""Writing a file at a path the user gave, by the rules of launcher/spec/user_paths.py (a regular file or nothing;
a symbolic link written through; anything else refused in one line)."""

from __future__ import annotations

from pathlib import Path

from launcher.errors import SpecError
from launcher.results.rundir import write_bytes_atomic
from launcher.spec.user_paths import file_target

# How the files of `report --out DIR` are named when one is in the way.
REPORT_FILE = "cannot write the report:"
REPORT_FIX = "move it away or give another directory with --out"

def write_user_file(path: Path, data: bytes, option: str, mode: int = 0o644, **fix: str) -> Path:
    """Write `data` at the user's `path` by file_target's rules, atomically (a temporary file beside the target,
    renamed over it); return the file written."""
    target = file_target(path, option, **fix)
    if not target.parent.is_dir():  # a mistyped path makes no folders (as root, anywhere): nothing outside the file
        via = f" (the link leads to {target})" if target != path else ""
        raise SpecError(f"{option} {path}: the folder {target.parent} does not exist{via}: create it first, or give "
                        "a path in an existing folder")
    write_bytes_atomic(target, data, mode)
    return target
