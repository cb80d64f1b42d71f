"""Stopping a process with everything below it. torchrun starts each worker in a session of its own, so a signal
to torchrun's process group does not reach the workers once torchrun itself is gone: the whole tree is found
through /proc before anything is signalled, and whatever of it still lives after the grace period is killed.

Runs on the hosts (launcher/remote/node_stop.py, sent as source) and here (a local run's stop, `down`).
"""

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


def marked_processes(argv_marker: "list[bytes]", env_entry: bytes) -> "dict[int, str]":
    """This user's processes that carry a run's marks, by pid, with their start times: those whose command line
    holds `argv_marker` as consecutive arguments (the node's supervisor: its marker, then its workspace), and
    those whose environment holds the entry `env_entry` (what the node ran, and what that started, unless it
    cleared its environment). Found through /proc; none where there is none."""
    found: dict[int, str] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        holds_argv = any(argv[i:i + len(argv_marker)] == argv_marker for i in range(len(argv)))
        started = start_time(pid)
        if (holds_argv or env_entry in environ) and started is not None and alive(pid):
            found[pid] = started
    return found


def signal_same(pid: int, started: str, number: int) -> bool:
    """Send signal `number` to `pid` only if it is still the process that started at `started` (a pid reused
    since is another's). Where the system has pidfds, the process is held by one while it is checked, so the
    signal cannot reach a process that took the pid in between. Whether the signal was sent."""
    opener = getattr(os, "pidfd_open", None)
    sender = getattr(signal, "pidfd_send_signal", None)
    if opener is None or sender is None:
        if start_time(pid) != started:
            return False
        with contextlib.suppress(OSError):
            os.kill(pid, number)
            return True
        return False
    try:
        handle = opener(pid)
    except OSError:
        return False
    try:
        if start_time(pid) != started:
            return False
        sender(handle, number)
        return True
    except OSError:
        return False
    finally:
        os.close(handle)


def stop_marked(found: "dict[int, str]", grace: float) -> "list[int]":
    """SIGTERM every process of `found` (pid -> start time) still the one found, wait up to `grace` seconds for
    them to end, then SIGKILL those left. The pids signalled."""
    signalled = [pid for pid, started in found.items() if signal_same(pid, started, signal.SIGTERM)]
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(p) and start_time(p) == found[p] for p in signalled):
        time.sleep(0.2)
    for pid in signalled:
        if alive(pid):
            signal_same(pid, found[pid], signal.SIGKILL)
    return signalled
