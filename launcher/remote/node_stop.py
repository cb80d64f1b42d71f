"""Runs on a host (part of the node program, launcher/remote/node_state.py): stop a node's command and everything
it started, and record exit status 143 unless the node recorded its own.

What is signalled is the node's own, never another process that now has a recorded pid:
- the supervisor recorded in `pid`, when its start time is the one recorded in `pid_start` and its command line
  holds the node marker (launcher/remote/node_start.py), with its process group and every process below it;
- every process of this user that carries the run's marks: the supervisor's command line (the marker, then the
  workspace's absolute path) or, in its environment, the node's output folder (DDPCTL_OUTPUT_DIR=WORKSPACE/out,
  which everything the node ran inherits). This finds the workers torchrun left behind, and the whole node when
  its workspace (and so its pid file) was deleted.
Each is held by its start time (and a pidfd where the system has them) until it is signalled; SIGTERM is followed by
SIGCONT, so a stopped process ends at once rather than after the grace. Nothing is signalled once the node recorded
its exit status. A supervisor found gone with no exit status recorded (ended from outside: it records one whatever
its command does) while the node's processes still run is noted in SUPERVISOR_GONE, with how many it left running,
so that the report names it rather than the SIGTERM this stop sends the torchrun it left behind."""

import contextlib
import json
import os
import signal
import time

from launcher.remote import node_start, proctree

KILL_WAIT_SECONDS = 5.0
SUPERVISOR_GONE = "supervisor_gone"  # {"time", "left_running"}: read by attribution.node_report


def workspace_path(workspace: str) -> str:
    """The workspace's absolute path as the supervisor recorded it (relative paths are under home)."""
    home = os.path.expanduser("~")
    return os.path.realpath(os.path.join(home, os.path.expanduser(workspace)))


def run_marks(path: str) -> "tuple[list[bytes], bytes]":
    """What proctree.marked_processes looks for: the supervisor's argv, the environment entry of its command."""
    out = os.fsencode(os.path.join(path, "out"))
    return [node_start.NODE_MARKER.encode(), os.fsencode(path)], node_start.OUTPUT_DIR_ENV.encode() + b"=" + out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def stop(workspace: str, grace: str, fallback: str) -> "dict[str, object]":
    """Stop the node in `workspace` (grace: seconds between SIGTERM and SIGKILL; empty: the one the node
    recorded, else `fallback`). Returns `signalled` (the pids that were sent a signal) and `found_by`
    ("pid file", "marks" or "" when nothing was found)."""
    path = workspace_path(workspace)
    files = os.path.isdir(path)
    if files and os.path.exists(os.path.join(path, "exit_code")):
        return {"signalled": [], "found_by": ""}
    seconds = float(grace or _read(os.path.join(path, "stop_grace")) or fallback)
    pid_text = _read(os.path.join(path, "pid")) if files else ""
    pid = int(pid_text) if pid_text.isdigit() else None
    # Ours, or gone: a process group outlives its leader and its id is never handed out while it has members, so
    # what is left of the group is ours. A pid that names another process now is left alone.
    ours = pid is not None and (proctree.start_time(pid) is None or proctree.is_node_process(
        pid, _read(os.path.join(path, "pid_start")), node_start.NODE_MARKER.encode()))
    gone = pid is not None and (proctree.start_time(pid) is None or not proctree.alive(pid))  # a zombie: gone too
    signalled = stop_processes(pid if ours else None, path, seconds)
    if files and gone and signalled and not os.path.exists(os.path.join(path, "exit_code")):
        with contextlib.suppress(OSError), open(os.path.join(path, SUPERVISOR_GONE), "w") as f:
            json.dump({"time": time.time(), "left_running": len(signalled)}, f)
    if files and (ours or signalled) and not os.path.exists(os.path.join(path, "exit_code")):
        with contextlib.suppress(OSError), open(os.path.join(path, "exit_code"), "w") as f:
            f.write("143\n")
    return {"signalled": sorted(signalled), "found_by": "pid file" if ours else "marks" if signalled else ""}


def stop_processes(pid: "int | None", path: str, seconds: float) -> "dict[int, str]":
    """Stop the run whose workspace (or, on this machine, run directory) is `path`: the tree of `pid` (the
    node's own process, already known to be the one started, or None) with its process group, and every process
    carrying the run's marks (run_marks); SIGTERM, SIGCONT, up to `seconds` of grace, then SIGKILL. Returns the
    processes signalled (pid -> start time). Also what a local run's `ddpctl down` calls
    (launcher/execute/this_machine/state.py)."""
    victims = proctree.marked_processes(*run_marks(path))
    if pid is not None:
        victims.update(_with_start_times(proctree.process_tree(pid)))
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
    signalled = {p: started for p, started in victims.items() if proctree.signal_same(p, started, signal.SIGTERM)}
    # a process stopped by SIGSTOP (a job control stop, a debugger, a freezer) acts on SIGTERM only once continued
    for p, started in signalled.items():
        proctree.signal_same(p, started, signal.SIGCONT)
    _wait_gone(signalled, seconds, every=0.2)
    if pid is not None:  # what the tree started meanwhile
        signalled.update(_with_start_times(proctree.process_tree(pid)))
    killed = {p: started for p, started in signalled.items()
              if _lives(p, started) and proctree.signal_same(p, started, signal.SIGKILL)}
    # A SIGKILL takes effect when the process next runs, which on a loaded host can be a moment later: the stop
    # returns (and the node is told stopped) once they are gone, or after KILL_WAIT_SECONDS.
    _wait_gone(killed, KILL_WAIT_SECONDS, every=0.05)
    return signalled


def _with_start_times(pids: "list[int]") -> "dict[int, str]":
    found = {}
    for pid in pids:
        started = proctree.start_time(pid)
        if started is not None:
            found[pid] = started
    return found


def _wait_gone(procs: "dict[int, str]", seconds: float, every: float) -> None:
    """Wait up to `seconds` until none of `procs` (pid -> start time) lives."""
    deadline = time.time() + seconds
    while time.time() < deadline and any(_lives(p, started) for p, started in procs.items()):
        time.sleep(every)


def _lives(pid: int, started: str) -> bool:
    return proctree.alive(pid) and proctree.start_time(pid) == started
