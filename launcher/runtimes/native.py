"""Per-node operations on a host, each one quoted argv over SSH: start torchrun detached, read its state,
stop it. The workspace layout is docs/contracts.md's "Remote workspace".

A node's environment (NodePlan.env: the user's --env API keys and tokens among it) never goes on a command line,
where every user of the host could read it in the process table: the start step writes it over SFTP into a 0600
file in the (0700) workspace, and the node reads it from there and deletes it."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from launcher.errors import HostError
from launcher.planning.plan import NodePlan, native_node_plan
from launcher.remote import attribution, node_report, node_start, node_state, node_stop, proctree
from launcher.remote.program import on_stdin, program
from launcher.runtimes.base import NODE_STOP_GRACE_SECONDS

if TYPE_CHECKING:
    from launcher.planning.plan import NodeHost
    from launcher.spec.run_spec import RunSpec
    from launcher.transport.connection import HostConnection


@dataclass(frozen=True)
class NativeRuntime:
    """torchrun started by the host's own python (see launcher.planning.plan.NodeRuntime): host versions must agree."""

    name: str = "native"
    runs_host_torch: bool = True
    image: str | None = None
    detach_reads_env_file: bool = True  # the node's supervisor exports the file's variables itself

    @property
    def stop_grace_seconds(self) -> int:
        """How long a stop waits between SIGTERM and SIGKILL of the node's process tree."""
        return NATIVE_STOP_GRACE_SECONDS

    def env_file(self, node: NodePlan) -> tuple[str, bytes]:
        """ENV_FILE and its bytes (encode_env)."""
        return ENV_FILE, encode_env(node.env)

    def plan_node(self, spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
        """Node `index` as torchrun on `host` (launcher.planning.plan.native_node_plan)."""
        return native_node_plan(spec, index, host, rdzv_addr, workspace)


# A native node's environment file in its workspace: one NAME=VALUE line per variable, the value with each
# backslash doubled and each newline written as \n (see encode_env), which `printf %b` undoes. Nothing in it
# is ever run as shell text.
ENV_FILE = "env"
# How long a native node's process tree gets between SIGTERM and SIGKILL when it is stopped.
NATIVE_STOP_GRACE_SECONDS = 20



def start_program() -> str:
    """The program that starts a node (launcher/remote/node_start.py, sent as its text): `PYTHON -c PROGRAM
    WORKSPACE CWD ENV_FILE GRACE COMMAND...` prints the node's pid."""
    return program(node_start, proctree, keep=True)


def node_program() -> str:
    """The program every question about a node runs (launcher/remote/node_state.py and what it imports, sent as
    their text): its state, a stop, how it ended, in one round trip."""
    return program(node_state, proctree, node_report, attribution, node_start, node_stop, keep=True)


def encode_env(env: Sequence[tuple[str, str]]) -> bytes:
    """ENV_FILE's contents: values may hold anything a command line can (quotes, `$`, newlines, other bytes)."""
    lines = (f"{key}=" + value.replace("\\", "\\\\").replace("\n", "\\n") + "\n" for key, value in env)
    return "".join(lines).encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class OutputRequest:
    """What read_state also fetches of one worker's stdout.log (or `stream`.log): the bytes after `offset` of
    attempt `attempt`, at most the newest `max_bytes`."""

    local_rank: int
    attempt: int | None = None
    offset: int = 0
    max_bytes: int = 65536
    stream: str = "stdout"


@dataclass(frozen=True)
class NodeState:
    pid: int | None
    exit_code: int | None
    alive: bool
    progress: dict[str, Any] | None
    disk_free: int | None = None  # bytes free where the workspace is (None: not known)
    attempt: int | None = None  # the newest attempt_<N> under logs/: torchrun's restarts so far
    output: str = ""  # the requested worker's new output (OutputRequest), bytes output_from..output_to
    output_from: int | None = None
    output_to: int | None = None
    output_attempt: int | None = None  # the attempt those bytes belong to (the one before `attempt` until read)
    ended: dict[int, Any] = field(default_factory=dict)  # attempt -> how its workers failed (attempts N, N-1)
    workspace_gone: bool = False  # the host has no such workspace (deleted since the start)
    failures: tuple[dict[str, Any], ...] = ()  # the ranks' failure notes (launcher/remote/node_report.py)
    last_logged: str = ""  # `PATH: LINE`, the newest line a worker (or torchrun) logged
    report: dict[str, Any] | None = None  # how the node ended (launcher/remote/attribution.py), when asked
    stopped: dict[str, Any] | None = None  # what a stop asked in the same round trip did (node_stop.stop)
    answered_at: float | None = None  # this machine's time when the answer came (a report's clock offset)
    exit_time: float | None = None  # when the node recorded its exit status, on this machine's clock

    @property
    def finished(self) -> bool:
        return self.exit_code is not None or (self.pid is not None and not self.alive)

    @property
    def label(self) -> str:
        # exit_code first: an exited process can linger as a zombie where nothing reaps orphans.
        if self.exit_code is not None:
            return "finished" if self.exit_code == 0 else f"failed (exit {self.exit_code})"
        if self.alive:
            return "running"
        if self.workspace_gone:
            return "workspace gone"
        return "not started" if self.pid is None else "lost"


def ask_node(conn: HostConnection, workspace: str, python: str = "python3", output: OutputRequest | None = None,
             stop: tuple[float | None, float] | None = None, report: bool = False) -> NodeState:
    """One round trip to the node program (launcher/remote/node_state.py): with `stop` ((grace or None for the
    node's own, fallback grace)) the node is stopped first, with `report` its report of how it ended comes too;
    always its state, and with `output` a worker's new output."""
    request, timeout = node_request(workspace, output, stop, report)
    loader, text = on_stdin(node_program())  # without `site` (-S): the program needs the standard library only
    result = conn.run([python, "-S", *loader, json.dumps(request)], timeout=timeout, stdin=text)
    try:
        found = json.loads(result.stdout) if result.exit_code == 0 else None
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, dict):
        why = " ".join((result.stderr or result.stdout or f"exit {result.exit_code}").split()[-30:])
        raise HostError(getattr(conn, "label", "host"), f"the node program could not run with {python}: {why[:300]}")
    return answered_state(found)


def node_request(workspace: str, output: OutputRequest | None = None, stop: tuple[float | None, float] | None = None,
                 report: bool = False) -> tuple[dict[str, Any], float]:
    """The node program's request (launcher/remote/node_state.py) for ask_node's arguments, and how long its
    answer may take."""
    request: dict[str, Any] = {"workspace": workspace}
    if output is not None:
        request["output"] = {"local_rank": output.local_rank, "attempt": output.attempt, "offset": output.offset,
                             "max_bytes": output.max_bytes, "stream": output.stream}
    timeout = 30.0
    if stop is not None:
        grace, fallback = stop
        request["stop"] = {"grace": "" if grace is None else str(grace), "fallback": str(fallback)}
        timeout = max(grace or 0, fallback, NODE_STOP_GRACE_SECONDS) + 30
    if report:
        request["report"] = True
        timeout += 30
    return request, timeout


def answered_state(found: dict[str, Any]) -> NodeState:
    """The NodeState of the node program's answer, just received: its times put on this machine's clock."""
    answered = time.time()
    state = replace(node_state_of(found), answered_at=answered)
    host_now, ended = found.get("now"), found.get("exit_time")
    if isinstance(host_now, (int, float)) and isinstance(ended, (int, float)):  # the error: the way back
        state = replace(state, exit_time=ended + answered - host_now)
    return state


def node_state_of(found: dict[str, Any]) -> NodeState:
    """The NodeState the node program's JSON answer describes."""
    if found.get("gone"):
        return NodeState(None, None, False, None, workspace_gone=True, stopped=_dict(found.get("stopped")))
    ended: dict[int, Any] = {}
    for number, note in (found.get("ended") or {}).items():
        with contextlib.suppress(ValueError):
            ended[int(number)] = note
    has_output = isinstance(found.get("output_to"), int)
    return NodeState(
        pid=_int(found.get("pid")), exit_code=_int(found.get("exit_code")), alive=found.get("alive") is True,
        progress=_dict(found.get("progress")), disk_free=_int(found.get("disk_free")),
        attempt=_int(found.get("attempt")), output=str(found.get("output", "")) if has_output else "",
        output_from=_int(found.get("output_from")), output_to=_int(found.get("output_to")),
        output_attempt=_int(found.get("output_attempt")), ended=ended,
        failures=tuple(n for n in found.get("failures") or [] if isinstance(n, dict) and "time" in n and "text" in n),
        last_logged=str(found.get("last_logged") or ""), report=_dict(found.get("report")),
        stopped=_dict(found.get("stopped")))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dict(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def read_state(conn: HostConnection, workspace: str, output: OutputRequest | None = None,
               python: str = "python3") -> NodeState:
    """The node's process state, progress record, restarts, failure notes and last logged line, and (with
    `output`) a worker's new output: one command on the host."""
    return ask_node(conn, workspace, python, output)


def stop_node(conn: HostConnection, workspace: str, python: str = "python3", grace_seconds: float | None = None,
              fallback_grace_seconds: float = NATIVE_STOP_GRACE_SECONDS, report: bool = False) -> NodeState:
    """TERM the node's processes (launcher/remote/node_stop.py), KILL what is left after `grace_seconds`, by
    default the grace the node recorded at its start (longer for a docker node: its wrapper must finish `docker
    stop` and `docker rm`), else `fallback_grace_seconds` (its runtime's); `python` is the host's. Returns the
    node's state after the stop (with `report`, how it ended), from the same round trip."""
    return ask_node(conn, workspace, python, stop=(grace_seconds, fallback_grace_seconds), report=report)
