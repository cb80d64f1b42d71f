"""What a node's workspace says about how it is doing: the last line its workers (or torchrun) logged, and the
failure notes its ranks left (trainer/failure.py: OUT/failures/rank-NNNNN.txt, "UNIXTIME rank R: MESSAGE").

Runs on the hosts as part of every state poll (launcher/remote/node_state.py) and here for a local run.
"""

import glob
import os

# A host's node writes under WORKSPACE/out; a local run's out directory is the run directory itself.
NOTE_GLOBS = (os.path.join("out", "failures", "rank-*.txt"), os.path.join("failures", "rank-*.txt"))
_MAX_LINE = 300


def _last_line(path: str) -> str:
    """The last non-empty line of a file (read from its end: logs can be long)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:_MAX_LINE] if lines else ""


def last_logged(workspace: str) -> str:
    """`PATH: LINE` for the newest worker log (or torchrun.out) under `workspace`; "" when nothing was logged."""
    logs = glob.glob(os.path.join(workspace, "logs", "*", "attempt_*", "*", "std*.log"))
    logs.append(os.path.join(workspace, "torchrun.out"))
    found = []
    for path in logs:
        try:
            found.append((os.path.getmtime(path), path))
        except OSError:
            continue
    for _, path in sorted(found, reverse=True):
        line = _last_line(path)
        if line:
            return f"{os.path.relpath(path, workspace)}: {line}"
    return ""


def failure_notes(workspace: str) -> list[dict[str, object]]:
    """Every non-empty failure note: {"time": unix seconds, "text": "rank R: MESSAGE"}, oldest first."""
    notes = []
    for path in (p for pattern in NOTE_GLOBS for p in glob.glob(os.path.join(workspace, pattern))):
        try:
            with open(path, "rb") as f:
                raw = f.read(8192).replace(b"\0", b"").decode("utf-8", "replace").strip()
        except OSError:
            continue
        stamp, _, text = raw.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            continue
        if text:
            notes.append({"time": when, "text": " ".join(text.split())[:_MAX_LINE * 2]})
    return sorted(notes, key=lambda note: float(note["time"]))  # type: ignore[arg-type]


def report(workspace: str) -> dict[str, object]:
    return {"last_logged": last_logged(workspace), "failures": failure_notes(workspace)}

