"""Taking every rank's Python stacks on a node: for each rank that registered (logs/stacks/rank-R.json, written by
the join hook or the trainer: launcher/runtimes/join_hook.py, trainer/stack_dumps.py), its dump file is emptied,
the rank is sent the signal it registered, and what faulthandler wrote is read back once it stops growing; then
the same for each process below the rank that catches that signal too (DataLoader workers forked from it inherit
the handler and the file), one at a time so that two dumps never interleave.

A process is signalled only if it is still the one that registered (its start time) and catches the signal (its
SigCgt mask): the signal's default action would end any other. A rank whose process is gone is reported as
exited. For the frames of the user's own files, the source line is read here, where the files are.

Runs on the hosts (`python -c PROGRAM WORKSPACE`, launcher/execute/stacks.py) and here (a run on this
machine). Standard library only.
"""

import contextlib
import json
import os
import sys
import time

from launcher.remote import flight_records, proctree

TYPE_CHECKING = False  # typing is not imported on the hosts (launcher/remote/__init__.py); mypy still reads it
if TYPE_CHECKING:
    from typing import Any

STACKS_DIR = os.path.join("logs", "stacks")
MAX_DUMP_BYTES = 1 << 20  # faulthandler writes at most 100 frames of 100 threads: far less than this
MAX_SOURCE_BYTES = 4 << 20  # a source file larger than this is not read for its line
SETTLE_SECONDS = 0.3  # a dump that has not grown for this long is whole
DUMP_WAIT_SECONDS = 3.0


def catches(pid: int, number: int) -> bool:
    """Whether `pid` has a handler for signal `number` (its SigCgt mask in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (number - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _read_bounded(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_DUMP_BYTES).decode("utf-8", "replace")


def dump_of(pid: int, started: str, number: int, path: str) -> "str | None":
    """Empty `path`, signal the process, return what it wrote (None: it could not be signalled)."""
    with open(path, "ab") as f:  # the rank holds it open in append mode: its next write starts at 0
        f.truncate(0)
    if not proctree.signal_same(pid, started, number):
        return None
    deadline, size, since = time.monotonic() + DUMP_WAIT_SECONDS, -1, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = os.path.getsize(path) if os.path.exists(path) else 0
        if now != size:
            size, since = now, time.monotonic()
        elif size > 0 and time.monotonic() - since >= SETTLE_SECONDS:
            break
    return _read_bounded(path)


def _frame_files(text: str) -> "list[tuple[str, int]]":
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('File "') and '", line ' in line:
            name, rest = line[len('File "'):].split('", line ', 1)
            number = rest.split(" ", 1)[0]
            if number.isdigit():
                found.append((name, int(number)))
    return found


def _library(path: str) -> bool:
    return "-packages/" in path or "/lib/python3" in path or path.startswith("<") or path.endswith("sitecustomize.py")


def source_lines(texts: "list[str]") -> "dict[str, str]":
    """`FILE:LINE` -> the line's text, for the frames of the user's own files (not the standard library's or an
    installed package's) in the dumps."""
    wanted: dict[str, set[int]] = {}
    for text in texts:
        for name, number in _frame_files(text):
            if not _library(name):
                wanted.setdefault(name, set()).add(number)
    lines: dict[str, str] = {}
    for name, numbers in wanted.items():
        try:
            if not os.path.isfile(name) or os.path.getsize(name) > MAX_SOURCE_BYTES:
                continue
            with open(name, encoding="utf-8", errors="replace") as f:
                content = f.read().splitlines()
        except OSError:
            continue
        for number in numbers:
            if 0 < number <= len(content):
                lines[f"{name}:{number}"] = content[number - 1].strip()[:200]
    return lines


def _registrations(folder: str) -> "list[dict[str, Any]]":
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                record = json.loads(f.read(65536))
            if isinstance(record, dict) and all(isinstance(record.get(k), int) for k in ("rank", "pid", "signal")):
                found.append(record)
        except (OSError, ValueError):
            continue  # half-written by a rank stopped meanwhile
    return sorted(found, key=lambda r: int(r["rank"]))


def take(workspace: str) -> "dict[str, Any]":
    """Every registered rank's dump (and its workers'), with the source lines of the user's frames."""
    folder = os.path.join(workspace, STACKS_DIR)
    ranks = []
    registered = _registrations(folder)
    asked = None
    with contextlib.suppress(OSError):  # the flight records are written by the ranks' own threads meanwhile
        asked = flight_records.request(folder) if registered else None
    for record in registered:
        pid, number, started = int(record["pid"]), int(record["signal"]), str(record.get("start") or "")
        dump_path = os.path.join(folder, os.path.basename(str(record.get("dump") or "")))
        entry: dict[str, Any] = {"rank": record["rank"], "pid": pid, "world_size": record.get("world_size")}
        same = proctree.alive(pid) and (not started or proctree.start_time(pid) == started)
        if not same:
            entry["state"] = "exited"
        elif not catches(pid, number) or not dump_path.endswith(".txt"):
            entry["state"] = "no handler"
        else:
            text = dump_of(pid, started, number, dump_path)
            entry["state"] = "dumped" if text else "no dump"
            entry["dump"] = text or ""
            workers = []
            for child in proctree.process_tree(pid)[1:]:
                child_start = proctree.start_time(child)
                if child_start and catches(child, number):
                    workers.append({"pid": child, "dump": dump_of(child, child_start, number, dump_path) or ""})
            entry["workers"] = workers
        ranks.append(entry)
    texts = [str(r.get("dump") or "") for r in ranks]
    texts += [str(w["dump"]) for r in ranks for w in r.get("workers") or []]
    living = [int(r["rank"]) for r in ranks if r.get("state") != "exited"]
    flights = flight_records.collect(folder, living, asked) if registered else []
    return {"host": os.uname().nodename, "time": time.time(), "ranks": ranks, "lines": source_lines(texts),
            "flight_records": flights}


def main(argv: "list[str]") -> int:
    """`WORKSPACE`: print the node's stacks as JSON."""
    print(json.dumps(take(argv[0])))
    sys.stdout.flush()
    return 0
