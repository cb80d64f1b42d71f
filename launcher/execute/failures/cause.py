"""Which failure ended a run: the first one in time across its nodes, named by global rank, node, signal or exit
code, with the lines of that rank's own log that explain it; nodes ddpctl stopped because of it are "stopped".

Each node's facts come from launcher/remote/attribution.py (run on the host by the node program, or here for a
local run). Host clocks are brought onto this machine's by each report's own `now` (the error is the round trip).
The result is one JSON-able record, kept in run.json's `failure` and in events.jsonl (`failure_attributed`),
so `ddpctl status` shows the same cause as `up`."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.execute.failures.hints import RunHints, exit_abort_hint, run_hints
from launcher.execute.failures.worker_log import without_control_chars
from launcher.planning.rdzv_reservation import rendezvous_taken_hint
from launcher.remote import attribution
from launcher.results.peer_loss import lost_a_peer
from launcher.results.progress import console
from launcher.results.rundir import RunDir, primary_node_out, read_json, read_jsonl

if TYPE_CHECKING:
    from launcher.runtimes.native import NodeState
    from launcher.transport.hostsession import HostSession

# torchrun's exit status after ddpctl's stop (SIGTERM, 128+15): never a cause.
STOPPED_EXIT = 143


def host_node_report(state: NodeState | None) -> dict[str, Any] | None:
    """The report of how a node on a host ended (attribution.node_report, which came with the node's state from
    the node program), its times moved onto this machine's clock by the report's own `now` (the error: the way
    back); None if the node could not say (unreachable, or its python could not run the program)."""
    report = state.report if state is not None else None
    if report is None or state is None or state.answered_at is None:
        return None
    report = copy.deepcopy(report)
    offset = state.answered_at - float(report.get("now") or 0)
    for failure in report.get("failures", []):
        if failure.get("time") is not None:
            failure["time"] += offset
    if report.get("exit_time") is not None:
        report["exit_time"] += offset
    return report


def _lost_a_peer(report: dict[str, Any]) -> bool:
    failures = report.get("failures") or []
    return bool(failures) and lost_a_peer(failures[0].get("explain") or [])


def _causes_first(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report with its workers' failures in the order they are causes: one that lost a peer after any other
    (a rank that raised, then its neighbour on the node aborted when the group broke: the one that raised), each
    group in the order torchrun saw them."""
    failures = (report or {}).get("failures") or []
    if report is None or len(failures) < 2:
        return report
    ordered = sorted(failures, key=lambda f: lost_a_peer(f.get("explain") or []))
    return {**report, "failures": ordered}


def _raised(failure: dict[str, Any]) -> bool:
    """A worker that raised by itself (its traceback's exception, not a lost peer), whatever signal then ended it:
    torchrun's SIGTERM reaches a rank that raised while it is still on its way out."""
    explain = failure.get("explain") or []
    return attribution.exception_line(explain) is not None and not lost_a_peer(explain)


def _cause_time(report: dict[str, Any]) -> float | None:
    failures = report.get("failures") or []
    if failures and failures[0].get("time") is not None:
        return float(failures[0]["time"])
    return report.get("exit_time")


def _own_failure(report: dict[str, Any] | None, stop_time: float | None) -> bool:
    """Whether a node failed by itself: a worker failure or a non-zero exit not caused by ddpctl's stop."""
    if report is None:
        return False
    if report.get("supervisor_gone"):  # ended from outside: never by ddpctl's stop, which leaves its status
        return True
    failures = report.get("failures") or []
    if failures and (failures[0]["signal"] != "SIGTERM" or _raised(failures[0])):
        when = failures[0].get("time")
        return stop_time is None or when is None or when < stop_time
    code = report.get("exit_code")
    if code == 0 or failures:
        return False
    if code is None:  # ended without an exit record ("lost"); a node ddpctl stopped has one (143)
        return stop_time is None
    if stop_time is not None:
        ended = report.get("exit_time")
        return code != STOPPED_EXIT and (ended is None or ended < stop_time)
    return True


def attribute(reports: Sequence[dict[str, Any] | None], labels: Sequence[str], stopped: Sequence[int] = (),
              stop_time: float | None = None, python: str = "python3",
              hints: RunHints | None = None, launcher: str = "torchrun") -> dict[str, Any] | None:
    """The run's failure record from every node's report: the cause (the earliest failure of a node that failed
    by itself) and each node's outcome; None when no node failed. `stopped`: nodes still running when ddpctl
    began stopping them at `stop_time` (this machine's clock); `hints`: what the run's hints need."""
    reports = [_causes_first(r) for r in reports]
    own = [i for i, r in enumerate(reports) if _own_failure(r, stop_time if i in stopped else None)]
    if not own:
        unknown = [i for i, r in enumerate(reports) if r is None]
        if not unknown:
            return None
        own = unknown[:1]
    first = min(own, key=lambda i: (_lost_a_peer(reports[i] or {}), _cause_time(reports[i] or {}) or float("inf"), i))
    cause = _describe_cause(first, labels[first], reports[first], python, hints, launcher)
    nodes = []
    for index, report in enumerate(reports):
        if index == first:
            outcome = "failed: the cause"
        elif report is None:
            outcome = "unknown (it could not be asked)"
        elif index in own:
            what = _short(_describe_cause(index, labels[index], report, python, launcher=launcher))
            # "after node K" only where the node says it lost a peer: a rank that raised by itself is its own cause
            outcome = f"failed after node {first}: {what}" if _lost_a_peer(report) else f"failed by itself: {what}"
        elif index in stopped:
            outcome = "stopped"
        else:
            outcome = "finished" if report.get("exit_code") == 0 else f"ended (exit {report.get('exit_code')})"
        nodes.append({"node": index, "host": labels[index], "outcome": outcome})
    return {**cause, "nodes": nodes}


def _describe_cause(node: int, label: str, report: dict[str, Any] | None, python: str,
                    hints: RunHints | None = None, launcher: str = "torchrun") -> dict[str, Any]:
    """The cause on one node: who (rank or torchrun's agent), how (signal by name, out of memory, exit code)."""
    where = f"node {node} ({label})"
    record: dict[str, Any] = {"node": node, "host": label, "rank": None, "exit_code": None, "signal": None,
                              "time": None, "explain": [], "log": None, "hint": None}
    if report is None:
        record["summary"] = f"{where} could not be asked how it ended (unreachable?)"
        return record
    failures = report.get("failures") or []
    code = report.get("exit_code")
    gone = report.get("supervisor_gone")
    if isinstance(gone, dict):
        record.update(exit_code=code, time=gone.get("time"))  # torchrun's own tail: only the stop's SIGTERM
        after = (f"torchrun and its workers, left running without it, were stopped by ddpctl "
                 f"({gone.get('left_running')} process(es))")
        record["summary"] = (f"the supervisor of {where}, ddpctl's process that runs torchrun there and records how "
                             f"it ends, was ended from outside (killed?) before torchrun ended; {after}")
    elif failures:
        worker = failures[0]
        how = _how(worker["exitcode"], worker["signal"], worker.get("oom"))
        record.update(rank=worker["rank"], local_rank=worker["local_rank"], exit_code=worker["exitcode"],
                      signal=worker["signal"], time=worker.get("time"),
                      explain=[without_control_chars(x) for x in worker.get("explain", [])], log=worker.get("log"),
                      oom=worker.get("oom"), binary=worker.get("binary"))
        record["summary"] = f"rank {worker['rank']} on {where} {how}"
        raised = attribution.exception_line(record["explain"])
        if raised and worker["signal"] is None:  # the exception, never a line the script printed before it ended
            record["summary"] += ": " + raised
        elif raised and worker["signal"] in ("SIGABRT", "SIGTERM"):
            # an uncaught exception, then an abort on the way out (a C++ thread still running at exit: "terminate
            # called without an active exception"), or torchrun's SIGTERM (another worker of the node ended first,
            # while this one was still exiting): the exception is the cause the user needs to read
            record["summary"] += " as it exited after raising " + raised
    elif code is not None and code > 128:
        record.update(exit_code=code, signal=attribution.signal_name(code - 128), time=report.get("exit_time"))
        record["summary"] = f"torchrun's agent on {where} was ended by {record['signal']} (exit {code})"
        record["explain"] = [without_control_chars(x) for x in report.get("torchrun_tail", [])]
    else:
        record.update(exit_code=code, time=report.get("exit_time"),
                      explain=[without_control_chars(x) for x in report.get("torchrun_tail", [])])
        what = f"exited with {code}" if code is not None else "ended without recording its exit status"
        record["summary"] = (f"torchrun on {where} {what}, and no worker of it failed" if launcher == "torchrun" else
                             f"{'the script' if launcher == 'spawn' else 'mpirun'} on {where} {what}")
        # torchrun's own output ends in its own error; a spawn or mpirun node's output is the script's: only its
        # exception line is a reason, never a line it printed before it ended
        last = next((x for x in reversed(record["explain"]) if x.strip()), "") if launcher == "torchrun" else ""
        reason = attribution.exception_line(record["explain"]) or last.strip()
        if reason:
            record["summary"] += f": {reason}"
    record["hint"] = (torch_import_hint(record["explain"], record.get("binary") or python, where)
                      or rendezvous_taken_hint(report.get("port_taken"), node)
                   or (hints.hint(node, record["explain"], where) if hints else None)
                   or exit_abort_hint(record["explain"]))
    return record


def _how(exitcode: int, signal: str | None, oom: str | None) -> str:
    if signal == "SIGKILL" and oom:
        return f"was killed for lack of memory (out of memory, SIGKILL; the kernel: {oom})"
    if signal:
        return f"was killed by {signal}"
    return f"exited with {exitcode}"


def _short(record: dict[str, Any]) -> str:
    return str(record["summary"]).split(" on node ", 1)[0] + (
        f" ({record['signal']})" if record.get("signal") else f" (exit {record.get('exit_code')})")


def torch_import_hint(lines: Sequence[str], interpreter: str, where: str) -> str | None:
    """When torch could not be imported: which interpreter ran, where, and how to pick another."""
    if not any(attribution._TORCH_MISSING in line for line in lines):
        return None
    return (f"{interpreter} on {where} has no torch: give an interpreter that has it with --python PATH (it runs "
            "torchrun; `-- python script.py` runs the script with it too), or install torch for this one")


def cause_text(record: dict[str, Any], run_dir: Path | None = None) -> str:
    """The lines `up` prints about a failure: the cause, its log lines, each other node's outcome, the hint."""
    lines = [f"first failure: {record['summary']}"]
    if record.get("explain"):
        source = record.get("log") or "torchrun.out"
        lines.append(f"  from {source}" + (f" on node {record['node']}" if record.get("node") is not None else "")
                     + ":")
        lines += ["    " + line for line in record["explain"]]
    for node in record.get("nodes", []):
        if node["node"] != record.get("node"):
            lines.append(f"node {node['node']} ({node['host']}): {node['outcome']}")
    if record.get("hint"):
        lines.append(f"hint: {record['hint']}")
    return "\n".join(lines)


def final_line(record: dict[str, Any]) -> str:
    """The cause in one line, for the run's last message and `ddpctl status`."""
    text = str(record["summary"])
    return text + (f" — {record['hint']}" if record.get("hint") else "")


def cause_of(run_path: Path | None, ran_here: bool) -> str | None:
    """The message a failed run ends with, from its recorded attribution: the cause in one line, then (for a
    run on this machine, `ran_here`, where nothing printed them yet) the lines of the rank's log that explain it."""
    record = read_json(run_path / "run.json") if run_path else None
    failure = record.get("failure") if record else None
    if not isinstance(failure, dict) or "summary" not in failure or failure.get("teardown_only"):
        return None
    text = f"training failed: {final_line(failure)}; logs in {run_path}"
    if ran_here and failure.get("explain"):
        text += f"\n{failure.get('log') or 'torchrun.out'}:\n" + "\n".join(failure["explain"])
    return text


def record_failure(run_dir: RunDir, record: dict[str, Any]) -> None:
    """Keep the attribution where `status` and later commands read it: run.json `failure`, and an event."""
    run_dir.update_record(failure=record)
    run_dir.event("failure_attributed", **{k: v for k, v in record.items() if k != "explain"})


def local_failure(run_dir: RunDir, exit_code: int, python: str) -> dict[str, Any] | None:
    """A local run's failure record (one node: this machine), kept in run.json and events.jsonl."""
    if exit_code in (0, 130):
        return None
    report = attribution.node_report(str(run_dir.path), exit_code)
    record = attribute([report], ["local"], python=python, launcher=run_dir.spec().launcher)
    if record is not None:
        record_failure(run_dir, record)
    return record


def failure_from_pulled(run_dir: RunDir) -> dict[str, Any] | None:
    """A run no `up` followed to its end (--detach): once every node's files were pulled and each node had ended,
    its failure record worked out from those copies (nodes/<k>/ has a workspace's layout), kept like `up` keeps
    it. None when a failure is already recorded, a node has not ended, or no node failed."""
    record = run_dir.record()
    nodes = record.get("nodes") or []
    if record.get("failure") is not None or not nodes:
        return None
    copies = [run_dir.path / "nodes" / str(k) for k in range(len(nodes))]
    if not all((copy / "exit_code").is_file() for copy in copies):
        return None  # a node still running (or never pulled): nothing to say yet
    reports = [attribution.node_report(str(copy.resolve())) for copy in copies]
    spec = run_dir.spec()
    failure = attribute(reports, [str(n.get("label", k)) for k, n in enumerate(nodes)], python=spec.python,
                        hints=run_hints(run_dir.path, record), launcher=spec.launcher)
    if failure is not None:
        record_failure(run_dir, failure)
    return failure


def results_complete(run_dir: RunDir, nodes: int | None) -> bool:
    """Whether training finished and every result was written: summary.json at the top with every epoch the
    run asked for, one timing record per epoch, and the final model (beside them, or in rank 0's node)."""
    summary = read_json(run_dir.path / "summary.json")
    epochs = run_dir.spec().epochs
    if not summary or summary.get("epochs") != epochs:
        return False
    timing = read_jsonl(run_dir.path / "timing.jsonl")
    if not timing or timing[-1].get("epoch") != epochs:
        return False
    primary = primary_node_out(run_dir.path, nodes) if nodes else run_dir.path
    return any(p is not None and (p / "final_model.pt").is_file() for p in (run_dir.path, primary))


def teardown_outcome(run_dir: RunDir, exit_code: int, nodes: int | None = None) -> int:
    """A run whose training finished and whose results were all written, but whose teardown failed: say exactly
    that, note the teardown problem in run.json, and give 0. Any other run: its exit code unchanged."""
    record = run_dir.record().get("failure")
    if exit_code in (0, 130) or run_dir.spec().user_command or not results_complete(run_dir, nodes):
        return exit_code
    problem = record.get("summary") if isinstance(record, dict) else f"exit {exit_code}"
    note = {"teardown_only": True, "exit_code_before": exit_code, "summary": f"teardown failed: {problem}"}
    run_dir.update_record(failure={**(record if isinstance(record, dict) else {}), **note})
    run_dir.event("teardown_failed", exit_code=exit_code, problem=problem)
    console.print(f"training finished and every result was written; the teardown after it failed ({problem}): "
                  "the results are complete", markup=False, highlight=False)
    return 0


def report_failure(session: HostSession, run_dir: RunDir, states: Sequence[NodeState | None],
                   stop_and_report: Callable[[HostSession, RunDir, bool], list[NodeState | None]],
                   ) -> dict[str, Any] | None:  # fmt: skip
    """A node of a run on hosts failed: stop the nodes still running (they are "stopped", not causes) and ask
    every node how it ended, in one round trip per node (`stop_and_report`), print and record the first failure
    in time."""
    running = [i for i, s in enumerate(states) if s is None or not s.finished]
    # A node whose supervisor ended from outside recorded no exit status, and its torchrun and workers may still
    # run without it: stopped too, also where it is the run's only node (its stop records that the supervisor
    # was gone, which names the cause).
    orphaned = any(s is not None and s.finished and s.exit_code is None for s in states)
    stop_time = time.time()
    if running:
        run_dir.event("stopping", nodes=running, reason="another node failed")
    reports = [host_node_report(state) for state in stop_and_report(session, run_dir, bool(running) or orphaned)]
    python = run_dir.spec().python
    record = attribute(reports, session.labels, running, stop_time, python, run_hints(run_dir.path, run_dir.record()),
                       run_dir.spec().launcher)
    if record is not None:
        record_failure(run_dir, record)
        console.print(cause_text(record), markup=False, highlight=False)
    return record


def shown_state(record: dict[str, Any] | None, node: int, label: str) -> str:
    """A node's state on the progress display once a failure is attributed: "stopped" for a node ddpctl stopped
    (not its exit 143), "failed after node K" for one that failed because of the cause."""
    outcomes = [n["outcome"] for n in (record or {}).get("nodes", []) if n["node"] == node]
    if not outcomes or outcomes[0].startswith(("finished", "unknown", "ended")):
        return label
    if outcomes[0].startswith("failed: the cause"):
        return "failed (the first failure)"
    return outcomes[0].split(":", 1)[0]


def cause_exit_code(record: dict[str, Any] | None, codes: Sequence[int]) -> int:
    """The run's exit code: the failing node's (never 143 from ddpctl's own stop of another node), else the first
    non-zero one, else 0."""
    if record is not None and record.get("node") is not None:
        node_codes = [c for i, c in enumerate(codes) if i == record["node"] and c not in (0, STOPPED_EXIT)]
        worker_code = record.get("exit_code")
        return node_codes[0] if node_codes else worker_code if isinstance(worker_code, int) and worker_code > 0 else 1
    return next((c for c in codes if c != 0), 0)
