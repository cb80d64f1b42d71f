"""A run on this machine, seen from outside the `up` that started it: whether its torchrun still runs (measured:
its recorded pid lives and is still the process that was started), the state `ddpctl status` shows, and the stop
`ddpctl down` makes — the same stop a host node gets (launcher/remote/node_stop.py, run here: the tree of the
torchrun with its process group, and every process carrying the run's mark, with a grace period, then SIGKILL).

The run's mark: every local run's torchrun gets DDPCTL_OUTPUT_DIR=RUN_DIR/out in its environment (a host node's
supervisor sets the same variable to its workspace's out/), which its workers and whatever they start inherit,
so a worker that left torchrun's tree is still found."""

from __future__ import annotations

import os
import time
from typing import Any

from launcher.execute.following.outside_stops import DOWN_EVENT
from launcher.remote import node_stop
from launcher.remote.node_start import OUTPUT_DIR_ENV
from launcher.remote.proctree import alive, start_time
from launcher.results.progress import finite_number, progress_record
from launcher.results.restarts import newest_attempt_dir
from launcher.results.run_records import node_restarts
from launcher.results.rundir import RunDir, read_json, read_jsonl
from launcher.results.script_progress import SCRIPT_TAIL_BYTES, script_record

# How long a run may show no torchrun pid after its run directory was made before it counts as never started.
START_GRACE_SECONDS = 30.0
END_EVENTS = ("exited", "stopped")


def run_mark(run_dir: RunDir) -> dict[str, str]:
    """The environment entry that marks every process of a local run (node_stop.run_marks finds it)."""
    return {OUTPUT_DIR_ENV: os.path.join(node_stop.workspace_path(str(run_dir.path)), "out")}


def local_torchrun_running(record: dict[str, Any]) -> bool:
    """Whether the local run's torchrun still runs: its recorded pid lives, not as a zombie, and (a pid alone is no
    identity: the system hands it to another process once ours ended) still has the start time recorded with it.
    A record without one (older runs) is judged by the pid alone."""
    pid, recorded_start = record.get("local_pid"), record.get("local_pid_start")
    if not isinstance(pid, int):
        return False
    if recorded_start is not None:
        return start_time(pid) == str(recorded_start) and alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return alive(pid)  # a zombie (ended, not yet reaped) still answers kill 0


def local_run_ended(run_dir: RunDir) -> bool:
    """True once `up` recorded the end of the run, or once its torchrun is gone (`up` itself was killed)."""
    if any(e.get("event") in END_EVENTS for e in run_dir.events()):
        return True
    record = run_dir.record()
    if not isinstance(record.get("local_pid"), int):  # starting right now (the pid follows), or it never started
        return time.time() - float(record.get("created") or 0) > START_GRACE_SECONDS
    return not local_torchrun_running(record)


def local_state(run_dir: RunDir) -> tuple[str, int | None]:
    """(state, exit code) of a local run, as a host node's are told (launcher/runtimes/native.py NodeState.label):
    "running" while its torchrun is measured alive; then "stopped" (`ddpctl down`, Ctrl-C), "finished",
    "failed (exit N)" from what its `up` recorded; "lost" when its torchrun is gone and nothing recorded how it
    ended (its `up` was killed); "starting" before its torchrun was recorded, "not started" when it never was."""
    record, events = run_dir.record(), run_dir.events()
    ended = [e for e in events if e.get("event") in END_EVENTS]
    code = ended[-1].get("exit_code") if ended else None
    code = code if isinstance(code, int) else None
    if local_torchrun_running(record):
        return "running", None
    if any(e.get("event") == DOWN_EVENT for e in events) or (ended and ended[-1]["event"] == "stopped"):
        return "stopped", code
    if ended:
        return ("finished" if code == 0 else f"failed (exit {code})" if code is not None else "failed"), code
    if (run_dir.path / "summary.json").exists():
        return "finished", None
    if not isinstance(record.get("local_pid"), int):
        starting = time.time() - float(record.get("created") or 0) <= START_GRACE_SECONDS
        return ("starting" if starting else "not started"), None
    return "lost", None


def local_status_rows(run_dir: RunDir) -> list[dict[str, Any]]:
    """The one row of a run on this machine: its measured state, and its progress from progress.json in its run
    directory (what the trainer wrote), else from the end of a script's rank-0 output, as a host run's rows are
    made."""
    state, code = local_state(run_dir)
    progress = progress_record(read_json(run_dir.path / "progress.json")) or _script_progress(run_dir)
    return [{"node": 0, "host": "local", "state": state, "exit_code": code,
             "epoch": progress.get("epoch"), "epochs": progress.get("epochs"), "loss": newest_loss(run_dir, progress),
             "restarts": node_restarts(run_dir)[0]}]


def _script_progress(run_dir: RunDir) -> dict[str, Any]:
    """A script's progress, from the end of rank 0's output (its progress lines, or lines that name an epoch):
    nothing writes progress.json for a script, and a detached run has no `up` reading its output."""
    newest = newest_attempt_dir(run_dir.path / "logs") if run_dir.spec().user_command else None
    if newest is None:
        return {}
    try:
        with open(newest / "0" / "stdout.log", "rb") as log:  # one node: global rank 0 is its local rank 0
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - SCRIPT_TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return {}
    return progress_record(script_record(tail, size <= SCRIPT_TAIL_BYTES)) or {}


def newest_loss(run_dir: RunDir, progress: dict[str, Any]) -> float | None:
    """The progress record's loss; where it has none (the trainer's records carry none), the training loss of
    the last epoch that ended (timing.jsonl, which a local run writes as it goes); None before either."""
    if progress.get("loss") is not None:
        return float(progress["loss"])
    timing = read_jsonl(run_dir.path / "timing.jsonl")
    return finite_number(timing[-1].get("train_loss")) if timing else None


def stop_local_run(run_dir: RunDir, grace: float) -> list[int]:
    """Stop a local run as a host node is stopped: its torchrun's tree and process group (when the recorded pid
    is still its torchrun) and every process with the run's mark; SIGKILL after `grace` seconds. The pids
    signalled."""
    record = run_dir.record()
    pid = record["local_pid"] if local_torchrun_running(record) else None
    return sorted(node_stop.stop_processes(pid, node_stop.workspace_path(str(run_dir.path)), grace))


def local_run_processes(run_dir: RunDir) -> dict[int, str]:
    """The processes that carry the run's mark now (pid -> start time)."""
    from launcher.remote.proctree import marked_processes

    return marked_processes(*node_stop.run_marks(node_stop.workspace_path(str(run_dir.path))))
