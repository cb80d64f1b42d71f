"""Checks of command-line values shared by several commands; each raises SpecError with one line saying what
was wrong and what to do."""

from __future__ import annotations

import math
from pathlib import Path

from launcher.errors import SpecError
from launcher.spec.user_paths import folder_target


def check_runs_dir(runs_dir: Path, option: str = "--runs-dir") -> Path:
    """`runs_dir` unless it exists and is not a directory (a file there would give 'File exists' later)."""
    return folder_target(runs_dir, option, "a directory for run directories")


def check_seconds(value: float, option: str) -> float:
    """`value` if it is a positive, finite number of seconds."""
    if not (math.isfinite(value) and value > 0):
        raise SpecError(f"{option} {value:g}: give a positive number of seconds")
    return value


def check_at_least(value: int, low: int, option: str) -> int:
    """`value` if it is at least `low`; the message matches RunSpec's for the same options."""
    if value < low:
        raise SpecError(f"{option} must be an integer >= {low}, got {value}")
    return value
