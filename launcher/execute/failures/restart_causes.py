"""Why torchrun restarted a run's workers: the failure that ended the attempt before, named as a run's failure is
(global rank, node, signal by name or exit code with the exception line), from the notes each node's torchrun
writes when its workers fail (attempt_<N>/ended.json, launcher/spec/attempt_logs.py). A rank that failed only
because a peer went away is never the cause while another failure of that attempt exists."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.execute.failures.worker_log import without_control_chars
from launcher.remote.attribution import exception_line
from launcher.results.peer_loss import lost_a_peer
from launcher.results.restarts import attempt_number
from launcher.results.run_records import finish_records, node_logs_dirs
from launcher.results.rundir import RunDir
from launcher.spec.attempt_logs import ENDED_FILE

# torchrun's own stop of a worker group's other workers once one failed (SIGTERM): never the cause.
STOPPED_BY_TORCHRUN = -signal.SIGTERM.value

Notes = Mapping[int, Any]  # one node's attempt -> its ended.json


def ended_notes(logs_dir: Path) -> dict[int, Any]:
    """A --log-dir's ended.json notes on this machine (a local run's logs/, a pulled nodes/<k>/logs/)."""
    notes: dict[int, Any] = {}
    for path in logs_dir.glob(f"*/attempt_*/{ENDED_FILE}"):
        number = attempt_number(path.parent.name)
        try:
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if number is not None and isinstance(note, dict):
            notes[number] = note
    return notes


def restart_cause(notes: Sequence[Notes], attempt: int, labels: Sequence[str]) -> dict[str, Any] | None:
    """What ended attempt `attempt - 1` so that `attempt` began: the first failure across nodes (a lost peer's
    after any other, torchrun's own SIGTERM of the rest last); None when no node noted one."""
    found = []
    for node, by_attempt in enumerate(notes):
        note = by_attempt.get(attempt - 1)
        failures = note.get("failures") if isinstance(note, dict) else None
        for failure in failures if isinstance(failures, list) else []:
            if not isinstance(failure, dict) or not isinstance(failure.get("exitcode"), int):
                continue
            tail = [without_control_chars(str(x)) for x in failure.get("stderr_tail") or []]
            found.append(((failure["exitcode"] == STOPPED_BY_TORCHRUN, lost_a_peer(tail),
                           float(failure.get("time") or 0), node), node, failure, tail))
    if not found:
        return None
    _, node, failure, tail = min(found, key=lambda item: item[0])
    code = failure["exitcode"]
    name = _signal_name(-code) if code < 0 else None
    raised = exception_line(tail) if name is None else None
    how = f"was killed by {name}" if name else f"exited with {code}" + (f": {raised}" if raised else "")
    label = labels[node] if node < len(labels) else "?"
    return {"node": node, "host": label, "rank": failure.get("rank"), "local_rank": failure.get("local_rank"),
            "exit_code": code, "signal": name, "exception": raised,
            "summary": f"rank {failure.get('rank')} on node {node} ({label}) {how}"}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def node_labels(run_dir: RunDir) -> list[str]:
    """Each node's host label, as the run recorded it ("local" for a run on this machine)."""
    nodes = run_dir.record().get("nodes")
    if isinstance(nodes, list) and nodes:
        return [str(n.get("label", k)) if isinstance(n, dict) else str(k) for k, n in enumerate(nodes)]
    return ["local"]


def pulled_causes(run_dir: RunDir) -> Callable[[int], dict[str, Any] | None]:
    """Restart causes from the logs this machine has (a local run's, or pulled from every node)."""
    notes = [ended_notes(d) for d in node_logs_dirs(run_dir)]
    labels = node_labels(run_dir)
    return lambda attempt: restart_cause(notes, attempt, labels)


def finish_run_records(run_dir: RunDir) -> dict[str, Any] | None:
    """run_records.finish_records with each restart's cause named from the logs this machine has."""
    return finish_records(run_dir, pulled_causes(run_dir))


def restart_line(attempt: int, cause: dict[str, Any] | None) -> str:
    """The line that tells a restart: which rank on which node ended and how."""
    why = cause["summary"] if cause else "the failure that ended the attempt before was not recorded"
    return f"torchrun restarted the workers (attempt {attempt}): {why}"
