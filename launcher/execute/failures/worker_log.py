"""What to show when a node fails: the end of the failing worker's own log, not torchrun's ChildFailedError.

torchrun (with `--log-dir DIR --redirects 3`) writes each worker's output to
DIR/<rdzv-id>_<suffix>/attempt_<N>/<local rank>/{stdout,stderr}.log and, when a worker fails, names it in
torchrun.out's "Root Cause" section (`rank : R (local_rank: L)`). A failure message shows the last lines of
that worker's stderr.log (its stdout.log when stderr is empty) from the newest attempt, and falls back to the
end of torchrun.out.

Standard library only: a local run's failure message reads its run directory with it (launcher/cli/app.py); a
run on hosts names its failure with launcher/remote/attribution.py instead.
"""

from __future__ import annotations

import glob
import os
import re

# Terminal escape sequences (colours, cursor moves), then any other control character but tab and newline.
_CONTROL_CHARS = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")
_ROOT_CAUSE_RANK = re.compile(r"Root Cause.*?local_rank:\s*(\d+)", re.DOTALL)


def without_control_chars(text: str) -> str:
    """A host's or worker's output made safe to show: escape sequences and other control characters dropped."""
    return _CONTROL_CHARS.sub("", text)


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return ""


def _attempt_number(path: str) -> int:
    suffix = path.rsplit("attempt_", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def failure_tail(workspace: str, lines: int = 20) -> str:
    """The end of the failing worker's log under `workspace` (the run directory locally), headed by its
    path; the end of torchrun.out when torchrun named no worker or its log is empty."""
    torchrun_out = _tail(os.path.join(workspace, "torchrun.out"), 400)
    found = _ROOT_CAUSE_RANK.search(torchrun_out)
    attempts = sorted(glob.glob(os.path.join(workspace, "logs", "*", "attempt_*")), key=_attempt_number)
    if found and attempts:
        for stream in ("stderr.log", "stdout.log"):
            path = os.path.join(attempts[-1], found.group(1), stream)
            text = _tail(path, lines)
            if text.strip():
                return f"{os.path.relpath(path, workspace)}:\n{text}"
    return "\n".join(torchrun_out.splitlines()[-lines:])

