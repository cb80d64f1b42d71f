"""Runs on a host: the node program, one round trip per node for every question the launcher asks of a node
(launcher/runtimes/native.py sends it with the modules it imports, launcher/remote/program.py). Its argument is
one JSON request: `workspace`; `output` (a worker's new output to send: local_rank, attempt, offset, max_bytes,
stream); `stop` (stop the node first, launcher/remote/node_stop.py: grace, fallback); `report` (how the node
ended, launcher/remote/attribution.py). It prints one JSON object: the node's state after the stop, if any.
With `--serve [IDLE_SECONDS]` instead, it answers one request per line read on standard input, one JSON line
each, until its input ends (a followed run's polls: one program on the host for all of them,
launcher/runtimes/served_polls.py).

The state: `pid`, `exit_code`, `alive`, `disk_free` (bytes free on the workspace's file system), `attempt` (the
newest logs/*/attempt_<N>: torchrun's restarts), `ended` (attempts N and N-1 whose workers failed: the note
launcher/spec/attempt_logs.py wrote), `progress` (out/progress.json, only on global rank 0's node), `failures`
and `last_logged` (launcher/remote/node_report.py), the requested output and its byte range, `gone` when the
workspace is not there, `exit_time` (when exit_code was written) and `now` on the host's clock. Whether the
node's process lives is asked before `exit_code` is read: the node writes exit_code and then ends, so read the
other way round a node ending between the two reads would show neither."""

import contextlib
import glob
import json
import os
import sys
import time

from launcher.remote import attribution, node_report, node_stop, proctree

TYPE_CHECKING = False  # typing is not imported on the hosts (see LAZY_IMPORTS); mypy still reads IO from it
if TYPE_CHECKING:
    from typing import IO

DEFAULT_MAX_BYTES = 65536
# A served node program ends when no request has come for this long (the launcher polls every second; its
# connection may vanish without the host's sshd noticing, and nothing may be left running for that).
SERVE_IDLE_SECONDS = 300


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _alive(pid: "int | None", recorded_start: str) -> bool:
    """Whether the node's supervisor lives: a pid the system gave to another process since (its start time is
    not the one the node recorded) is not the node's."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    if not proctree.alive(pid) and os.path.isdir("/proc"):
        return False  # a zombie: it ended, and nothing has reaped it yet
    now = proctree.start_time(pid)
    return not (recorded_start and now is not None and now != recorded_start)


def _attempts(workspace: str) -> "tuple[int | None, str]":
    """The newest attempt number under logs/ and its folder."""
    newest: int | None = None
    folder = ""
    for path in sorted(glob.glob(os.path.join(workspace, "logs", "*", "attempt_*"))):
        number = path.rsplit("attempt_", 1)[-1]
        if os.path.isdir(path) and number.isdigit() and (newest is None or int(number) > newest):
            newest, folder = int(number), path
    return newest, folder


def _size(path: str) -> "int | None":
    try:
        return os.path.getsize(path) if os.path.isfile(path) else None
    except OSError:
        return None


def _output(workspace: str, newest: "int | None", folder: str, request: "dict[str, object]") -> "dict[str, object]":
    """The bytes of a worker's log the request asks for: after `offset` in attempt `attempt`, at most the newest
    `max_bytes`; the rest of an attempt that has ended first, the new attempt's on the next poll."""
    rank = str(request["local_rank"])
    stream = "stderr" if request.get("stream") == "stderr" else "stdout"
    asked = request.get("attempt")
    offset = int(str(request.get("offset") or 0))
    most = int(str(request.get("max_bytes") or DEFAULT_MAX_BYTES))
    read_attempt, read_folder = newest, folder
    if asked is not None and asked != newest:
        for path in sorted(glob.glob(os.path.join(workspace, "logs", "*", f"attempt_{asked}"))):
            size = _size(os.path.join(path, rank, f"{stream}.log"))
            if size is not None and size > offset:
                read_attempt, read_folder = int(str(asked)), path
    log = os.path.join(read_folder, rank, f"{stream}.log") if read_folder else ""
    size = _size(log) if log else None
    if size is None:
        return {"output_attempt": read_attempt}
    start = offset if asked == read_attempt else 0
    start = max(start, size - most)
    if start > size:
        start = 0
    with open(log, "rb") as f:
        f.seek(start)
        chunk = f.read(size - start)
    return {"output_attempt": read_attempt, "output_from": start, "output_to": start + len(chunk),
            "output": chunk.decode("utf-8", "replace")}


def state(workspace: str, output: "dict[str, object] | None" = None) -> "dict[str, object]":
    """The node's state as the module's docstring says; {"gone": True} when there is no workspace."""
    path = node_stop.workspace_path(workspace)
    if not os.path.isdir(path):
        return {"gone": True}
    pid_text = _read(os.path.join(path, "pid"))
    pid = int(pid_text) if pid_text.isdigit() else None
    alive = _alive(pid, _read(os.path.join(path, "pid_start")))
    code = _read(os.path.join(path, "exit_code"))
    found: dict[str, object] = {"pid": pid, "alive": alive,
                                "exit_code": int(code) if code.lstrip("-").isdigit() else None}
    with contextlib.suppress(OSError):
        found["exit_time"] = os.stat(os.path.join(path, "exit_code")).st_mtime  # when the node ended
    with contextlib.suppress(OSError):
        stats = os.statvfs(path)
        found["disk_free"] = stats.f_bavail * stats.f_frsize
    newest, folder = _attempts(path)
    found["attempt"] = newest
    ended = {}
    for number in ([newest, newest - 1] if newest is not None else []):
        note = os.path.join(os.path.dirname(folder), f"attempt_{number}", "ended.json")
        if number >= 0 and os.path.isfile(note):
            with contextlib.suppress(ValueError, RecursionError):
                ended[str(number)] = json.loads(_read(note))
    found["ended"] = ended
    try:
        found["progress"] = json.loads(_read(os.path.join(path, "out", "progress.json")) or "null")
    except (ValueError, RecursionError):
        found["progress"] = None
    found["failures"] = node_report.failure_notes(path)
    found["last_logged"] = node_report.last_logged(path)
    if output is not None:
        found.update(_output(path, newest, folder, output))
    return found


def answer(request: "dict[str, object]") -> "dict[str, object]":
    """What the launcher asked: stop first when asked, then the state, with the node's report when asked."""
    workspace = str(request["workspace"])
    stopped = None
    if isinstance(request.get("stop"), dict):
        stop = request["stop"]
        assert isinstance(stop, dict)
        stopped = node_stop.stop(workspace, str(stop.get("grace") or ""), str(stop.get("fallback") or "20"))
    output = request.get("output")
    found = state(workspace, output if isinstance(output, dict) else None)
    if stopped is not None:
        found["stopped"] = stopped
    if request.get("report") and not found.get("gone"):
        found["report"] = attribution.node_report(node_stop.workspace_path(workspace))
    found["now"] = time.time()  # the host's clock, to put its times on the launcher's
    return found


def serve(requests: "IO[bytes]", answers: "IO[str]", idle_seconds: int = SERVE_IDLE_SECONDS) -> int:
    """Answer each line of `requests` (a JSON request) with one line on `answers`, until `requests` ends; a line
    that is no request gets `{"error": ...}`. The process ends (SIGALRM) when no request came for `idle_seconds`."""
    import signal  # LAZY: see LAZY_IMPORTS

    while True:
        signal.alarm(idle_seconds)
        line = requests.readline()
        signal.alarm(0)
        if not line:
            return 0
        try:
            request = json.loads(line)
            found = answer(request) if isinstance(request, dict) else {"error": "a request is a JSON object"}
        except (ValueError, RecursionError, KeyError) as e:
            found = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(found) + "\n")
        answers.flush()


def main(argv: "list[str]") -> int:
    """`REQUEST` (JSON): print the answer as one JSON line; `--serve [IDLE_SECONDS]`: answer requests from
    standard input (serve)."""
    if argv[:1] == ["--serve"]:
        return serve(sys.stdin.buffer, sys.stdout, int(argv[1]) if len(argv) > 1 else SERVE_IDLE_SECONDS)
    print(json.dumps(answer(json.loads(argv[0]))))
    sys.stdout.flush()
    return 0
