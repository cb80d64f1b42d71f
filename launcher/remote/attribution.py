"""One node's failure facts, read from its workspace: what torchrun and the kernel recorded about how it ended.

torchrun (`--log-dir DIR --redirects 3`) ends a failed node with a ChildFailedError report in its own output
(torchrun.out): one block per failed worker (`time`, global `rank` and `local_rank`, `exitcode` — negative: the
signal — `pid`, `error_file`), the earliest under "Root Cause". Its log line `E<MMDD> <HH:MM:SS.ffffff> ...
failed (exitcode: N) local_rank: L (pid: P) of binary: B` dates that first failure to the millisecond and names
the program the worker ran. A worker whose entry point uses torch's `@record` also leaves the error file torchrun
gave it in TORCHELASTIC_ERROR_FILE (`error.json` beside its logs), with its traceback. The node's supervisor
(launcher/remote/node_start.py) records torchrun's own exit status in `exit_code` (its modification time: when
torchrun ended); 128+N is torchrun itself ended by signal N, e.g. its agent SIGKILLed.

Runs on the hosts as part of the node program when a node's end is asked about (launcher/remote/node_state.py,
read by launcher.execute.failures.cause), and here for a local run and for pulled copies.
"""

import glob
import json
import os
import re
import signal
import time

TYPE_CHECKING = False  # typing is not imported on the hosts (see LAZY_IMPORTS); mypy still reads Any from it
if TYPE_CHECKING:
    from typing import Any

_FAILURE_BLOCK = re.compile(
    r"\[\d+\]:\s*\n\s*time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>.*)\n"
    r"\s*rank\s*:\s*(?P<rank>-?\d+) \(local_rank: (?P<local_rank>\d+)\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<exitcode>-?\d+) \(pid: (?P<pid>\d+)\).*\n"
    r"\s*error_file\s*:\s*(?P<error_file>.*)\n")
_FIRST_FAILED_LINE = re.compile(
    r"^E(?P<md>\d{4}) (?P<hms>\d\d:\d\d:\d\d\.\d+) .*failed \(exitcode: (?P<exitcode>-?\d+)\) "
    r"local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\) of binary: (?P<binary>.*)$", re.MULTILINE)
# How far into a worker's log to look back for what explains its end.
_LOG_BYTES = 256 * 1024
EXPLAIN_LINES = 25
_TORCH_MISSING = "No module named 'torch'"
# torch's C++ warnings and infos in a log (glog style): `[W1123 03:16:02.552191429 socket.cpp:207] ...`.
_TORCH_WARNING = re.compile(r"^\[?[WI]\d{4} \d\d:\d\d:\d\d")
# torchrun's store on node 0 (is_host=1) failing to bind: an earlier exception than its last traceback shows.
_PORT_TAKEN = re.compile(r"failed to listen on any local network address\. port: (\d+),.*EADDRINUSE")


def _read_tail(path: str, limit: int = _LOG_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def signal_name(number: int) -> str:
    """`SIGKILL` for 9; `signal N` for a number this system does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def parse_failures(torchrun_out: str) -> "list[dict[str, Any]]":
    """The worker failures of torchrun's last ChildFailedError report, the root cause first."""
    start = torchrun_out.rfind("Failures:")
    if start < 0:
        return []
    report = torchrun_out[start:]
    root_at = report.find("Root Cause")
    failures = []
    for found in _FAILURE_BLOCK.finditer(report):
        exitcode = int(found["exitcode"])
        error_file = found["error_file"].strip()
        failures.append({
            "rank": int(found["rank"]), "local_rank": int(found["local_rank"]), "exitcode": exitcode,
            "signal": signal_name(-exitcode) if exitcode < 0 else None, "pid": int(found["pid"]),
            "time": _report_time(found["time"]), "host": found["host"].strip(),
            "error_file": None if error_file.startswith("<") else error_file,
            "root_cause": root_at >= 0 and found.start() > root_at,
        })  # fmt: skip
    return sorted(failures, key=lambda f: not f["root_cause"])


def _report_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d_%H:%M:%S"))
    except ValueError:
        return None


def first_failed_line(torchrun_out: str, year: int) -> "dict[str, Any] | None":
    """torchrun's log line about the first worker it saw fail: its time to the millisecond (local time, the year
    from the report) and the program the worker ran."""
    every = list(_FIRST_FAILED_LINE.finditer(torchrun_out))
    if not every:
        return None
    found = every[-1]  # the attempt that ended the run
    whole, fraction = found["hms"].split(".")
    try:
        seconds = time.mktime(time.strptime(f"{year}{found['md']} {whole}", "%Y%m%d %H:%M:%S"))
    except ValueError:
        return None
    return {"time": seconds + float("0." + fraction), "local_rank": int(found["local_rank"]),
            "pid": int(found["pid"]), "binary": found["binary"].strip()}


def explaining_lines(text: str, lines: int = EXPLAIN_LINES, errors_only: bool = False) -> list[str]:
    """What explains a worker's end: its last Python traceback (to the exception line) or fatal-error report
    (faulthandler's, on SIGSEGV), else its last lines but torch's own warnings (`[W1123 ...] ...`), which
    explain nothing; with `errors_only` (a worker ended by a signal), only a traceback or fatal-error report, or a
    last line from C++'s std::terminate."""
    all_lines = text.splitlines()
    starts = [i for i, line in enumerate(all_lines)
              if line.split("]:", 1)[-1].lstrip().startswith(("Traceback (most recent", "Fatal Python error"))]
    if starts:
        chosen = all_lines[starts[-1]:]
        return chosen if len(chosen) <= lines else chosen[:3] + ["  ..."] + chosen[-(lines - 4):]
    if errors_only:  # or C++'s std::terminate as the log's last word (the process aborted in native code)
        last = next((line for line in reversed(all_lines) if line.strip()), "")
        return [last] if last.split("]:", 1)[-1].lstrip().startswith("terminate called") else []
    return [line for line in all_lines if line.strip() and not _TORCH_WARNING.match(line)][-lines:]


# A traceback's exception line, once a rank's "[rank1]: " prefix is gone: `ValueError: bad batch`,
# `torch.distributed.DistBackendError: ...`, `KeyboardInterrupt` (a dotted name without spaces, then ": text").
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*|:)?$")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?")


def exception_line(lines: list[str]) -> str | None:
    """The exception line of the last Python traceback in `lines` (`ValueError: bad batch`); None when they hold
    no traceback: a line a script printed is never taken for its reason."""
    plain = [_RANK_PREFIX.sub("", line) for line in lines]
    starts = [i for i, line in enumerate(plain) if line.lstrip().startswith("Traceback (most recent")]
    if not starts:
        return None
    for line in plain[starts[-1] + 1:]:
        if line and not line[0].isspace() and _EXCEPTION_LINE.match(line.rstrip()):
            return line.strip()
    return None


def _worker_dir(workspace: str, local_rank: int) -> str | None:
    def attempt(path: str) -> int:
        suffix = path.rsplit("attempt_", 1)[-1]
        return int(suffix) if suffix.isdigit() else -1

    attempts = sorted(glob.glob(os.path.join(workspace, "logs", "*", "attempt_*")), key=attempt)
    return os.path.join(attempts[-1], str(local_rank)) if attempts else None


def _error_file(path: str | None) -> "dict[str, Any]":
    """The traceback and time a worker's @record handler wrote (torch's error.json), if it wrote one."""
    if not path:
        return {}
    try:
        with open(path) as f:
            message = json.load(f).get("message", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(message, dict):
        return {"text": str(message)}
    extra = message.get("extraInfo", {}) if isinstance(message.get("extraInfo"), dict) else {}
    stamp = str(extra.get("timestamp", ""))
    return {"text": str(message.get("message", "")), "callstack": str(extra.get("py_callstack", "")),
            "time": float(stamp) if stamp.isdigit() else None}


def killed_for_memory(pid: int) -> str | None:
    """How the kernel says it killed `pid` for memory (its log line), or that the cgroup counted an OOM kill."""
    import subprocess  # LAZY: see LAZY_IMPORTS

    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    for command in (["dmesg"], ["journalctl", "-k", "-n", "2000", "--no-pager"]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines()[::-1]:
            if pattern.search(line):
                return line.strip()[-200:]
    try:
        with open("/proc/self/cgroup") as f:
            group = f.read().split("::", 1)[-1].strip()
        with open(os.path.join("/sys/fs/cgroup", group.lstrip("/"), "memory.events")) as f:
            counts = dict(line.split() for line in f if line.strip())
        if int(counts.get("oom_kill", "0")) > 0:
            return f"this cgroup's memory.events counts {counts['oom_kill']} OOM kill(s)"
    except (OSError, ValueError):
        pass
    return None


def rendezvous_port_taken(text: str) -> int | None:
    """The port node 0's rendezvous store could not listen on because something else held it (EADDRINUSE)."""
    found = _PORT_TAKEN.findall(text)
    return int(found[-1]) if found else None


def _explain(workspace: str, failure: "dict[str, Any]", line: "dict[str, Any] | None") -> None:
    """Give a failed worker the lines of its log (or error file) that explain its end, and its best time: `line`,
    torchrun's own line about it (the first failure's), else its error file's, else when its log was written."""
    worker = _worker_dir(workspace, failure["local_rank"])
    recorded = _error_file(failure["error_file"])
    if recorded.get("time") and not (line and line["pid"] == failure["pid"]):
        failure["time"] = recorded["time"]
    explain: list[str] = explaining_lines(recorded["callstack"]) if recorded.get("callstack") else []
    for stream in ("stderr.log", "stdout.log"):
        if explain or worker is None:
            break
        explain = explaining_lines(_read_tail(os.path.join(worker, stream)), errors_only=bool(failure["signal"]))
        if explain:
            failure["log"] = os.path.relpath(os.path.join(worker, stream), workspace)
    # A worker that raised wrote its traceback before it ended, and torchrun saw the end up to a monitor interval
    # (and a slow exit) later: when its log was written just before, that time is closer to the failure.
    written = _mtime(os.path.join(worker, "stderr.log")) if worker else None
    if written is not None and failure["time"] is not None and failure["time"] - 2.0 <= written < failure["time"]:
        failure["time"] = written
    failure["explain"] = explain


def node_report(workspace: str, exit_code: int | None = None) -> "dict[str, Any]":
    """What ended this node: torchrun's exit status and when, its failed workers, the first seen first (rank, exit
    code or signal, time, the program the first ran, the lines of each one's log that explain its end)."""
    workspace = os.path.expanduser(workspace) if workspace.startswith("~") else workspace
    if not os.path.isabs(workspace):
        workspace = os.path.join(os.path.expanduser("~"), workspace)
    report: dict[str, Any] = {"now": time.time(), "exit_code": exit_code, "exit_time": None}
    try:
        with open(os.path.join(workspace, "exit_code")) as f:
            report["exit_code"] = int(f.read().strip())
        report["exit_time"] = _mtime(os.path.join(workspace, "exit_code"))
    except (OSError, ValueError):
        pass
    try:  # the supervisor ended from outside before torchrun did (launcher/remote/node_stop.py)
        with open(os.path.join(workspace, "supervisor_gone")) as f:
            report["supervisor_gone"] = json.load(f)
    except (OSError, ValueError):
        pass
    torchrun_out = _read_tail(os.path.join(workspace, "torchrun.out"))
    failures = parse_failures(torchrun_out)
    report["failures"] = failures
    if not failures:
        report["torchrun_tail"] = explaining_lines(torchrun_out, 12)
        report["port_taken"] = rendezvous_port_taken(torchrun_out)
        return report
    first = failures[0]
    year = time.localtime(first["time"] or time.time()).tm_year
    line = first_failed_line(torchrun_out, year)
    if line and line["pid"] == first["pid"]:
        first["time"], first["binary"] = line["time"], line["binary"]
    for failure in failures:  # every failed worker's own lines: which one raised by itself is the cause
        _explain(workspace, failure, line if failure is first else None)
    if first["signal"] == "SIGKILL":
        first["oom"] = killed_for_memory(first["pid"])
    return report

