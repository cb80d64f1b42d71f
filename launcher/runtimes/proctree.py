"""Stopping a process with everything below it. torchrun starts each worker in a session of its own, so a signal
to torchrun's process group does not reach the workers once torchrun itself is gone: the whole tree is found
through /proc before anything is signalled, and whatever of it still lives after the grace period is killed.

Standard library only, and no imports from launcher: this file's source is also run on hosts as a script
(launcher.runtimes.native.STOP_SCRIPT), where ddpctl is not installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # gone meanwhile, or no /proc here


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (only `root` where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        fields = _stat(int(name)) if name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat's 22nd field); None when it is gone."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def is_node_process(pid: int, recorded_start: str, marker: bytes) -> bool:
    """Whether `pid` is still the process that was started (a pid alone is no identity: the system hands it to
    another process once ours ended): its start time is the recorded one (when one was recorded) and its command
    line holds the argument `marker`. True where there is no /proc to ask (nothing better is known)."""
    if not os.path.isdir("/proc"):
        return True
    now = start_time(pid)
    if now is None or (recorded_start and now != recorded_start):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return marker in argv


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def stop_tree(pid: int, grace: float) -> None:
    """SIGTERM `pid`'s process group, wait up to `grace` seconds for the tree to end, then SIGKILL what is left
    of it (as found before the signal, and again now)."""
    procs = process_tree(pid)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(p) for p in procs):
        time.sleep(0.2)
    for p in set(procs + process_tree(pid)):
        if alive(p):
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
