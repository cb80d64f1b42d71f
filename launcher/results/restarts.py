"""Restarts of a run's workers, read from torchrun's own records for any script: with `--log-dir DIR`, each
attempt of a node's worker group writes to DIR/<rdzv-id>_<suffix>/attempt_<N>/, N counting the restarts."""

from __future__ import annotations

import re
from pathlib import Path

_ATTEMPT = re.compile(r"attempt_(\d+)$")


def attempt_number(path: str) -> int | None:
    """N of a path ending in attempt_<N>; None for any other path."""
    found = _ATTEMPT.search(path.rstrip("/"))
    return int(found.group(1)) if found else None


def newest_attempt_dir(logs_dir: Path) -> Path | None:
    """The newest attempt's folder under a torchrun --log-dir; None before the first worker started."""
    attempts = [(attempt_number(p.name), p) for p in logs_dir.glob("*/attempt_*") if p.is_dir()]
    numbered = [(n, p) for n, p in attempts if n is not None]
    return max(numbered, key=lambda item: item[0])[1] if numbered else None


def restarts_in(logs_dir: Path) -> int:
    """How many times torchrun restarted the worker group whose --log-dir this is (0 when it never started)."""
    newest = newest_attempt_dir(logs_dir)
    return (attempt_number(newest.name) or 0) if newest is not None else 0


def restarts_phrase(count: int) -> str:
    """'no restart', '1 restart', '2 restarts'."""
    return "no restart" if count == 0 else f"{count} restart" + ("" if count == 1 else "s")
