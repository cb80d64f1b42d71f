"""Starting a planned node on its host, whatever its runtime, in one round trip: the start program
(launcher/remote/node_start.py, run by the host's python) around the node's command, with the node's files on its
standard input (the environment file, 0600 in the 0700 workspace: never on a command line; a `-- CMD` node's join
hook), written there before the start. The node's runtime answers what differs: the file's name and format,
whether the start program's supervisor or the node's own wrapper reads it, and how long a stop waits."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from launcher.errors import HostError
from launcher.results.record import RecordError
from launcher.runtimes.docker import DockerRuntime
from launcher.runtimes.join_files import HOOK_FILE, join_hook_source
from launcher.runtimes.native import NativeRuntime, start_program
from launcher.spec.launchers import HOOK_DIR, NODE_RANK_ENV
from launcher.spec.torchrun import TORCHRUN_SOURCE, WRAPPER_FILE
from launcher.transport.connection import HostConnection

if TYPE_CHECKING:
    from launcher.planning.plan import NodePlan, NodeRuntime
    from launcher.results.record import RunRecord

RUNTIMES: dict[str, type[NativeRuntime] | type[DockerRuntime]] = {"native": NativeRuntime, "docker": DockerRuntime}


def runtime_named(name: str, image: str | None = None) -> NodeRuntime:
    """The runtime a plan or run.json names (`image`: the one its docker nodes run)."""
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}")
    return DockerRuntime(image) if name == "docker" and image else RUNTIMES[name]()


def runtime_of(record: RunRecord) -> NodeRuntime:
    """The runtime a recorded run's nodes ran (native when the record predates `runtime`)."""
    name = record.extra.get("runtime", "native")
    if name not in RUNTIMES:
        raise RecordError(f"run {record.run_id}: run.json names runtime {name!r}, which this ddpctl does not know "
                          f"({', '.join(RUNTIMES)})")
    image = (record.options or {}).get("image")
    return runtime_named(name, image if isinstance(image, str) else None)


def start_argv(node: NodePlan, python: str = "python3", files_on_stdin: bool = False) -> list[str]:
    """The quoted-argv command that starts a node detached with the host's `python` (without `site`: the start
    program needs the standard library only); its environment is in env_file(node): written first, or
    (`files_on_stdin`) given with node_files() on its standard input."""
    runtime = runtime_named(node.runtime)
    name = runtime.env_file(node)[0] if runtime.detach_reads_env_file else ""
    return [python, "-S", "-c", start_program(), node.workspace, node.cwd, name, str(runtime.stop_grace_seconds),
            "stdin" if files_on_stdin else "", *node.command]


def node_files(node: NodePlan, code: tuple[str, str] | None = None) -> bytes:
    """The start program's standard input: the node's files (path in the workspace, bytes, mode) as JSON; with
    `code` (the host's code cache, from its home folder, and where under code/ it goes), the copy of the shipped
    code into the workspace too, done by the start itself (launcher/remote/node_start.py: no round trip of its own)."""
    name, data = env_file(node)
    files = [(name, data, 0o600)]
    if NODE_RANK_ENV in dict(node.env):  # a `-- CMD` node: the world its processes join is measured
        files.append((f"{HOOK_DIR}/{HOOK_FILE}", join_hook_source(), 0o644))
    if any(arg.endswith(WRAPPER_FILE) for arg in node.command):  # torchrun's wrapper, run from the workspace
        files.append((WRAPPER_FILE, TORCHRUN_SOURCE.encode(), 0o644))
    listed = [[path, base64.b64encode(content).decode(), mode] for path, content, mode in files]
    if code is None:
        return json.dumps(listed).encode()
    return json.dumps({"files": listed, "code": {"cache": code[0], "dest": code[1]}}).encode()


def env_file(node: NodePlan) -> tuple[str, bytes]:
    """The file that carries the node's environment to its host: its name in the workspace, and its bytes."""
    return runtime_named(node.runtime).env_file(node)


def start_node(conn: HostConnection, node: NodePlan, label: str, python: str = "python3",
               code: tuple[str, str] | None = None) -> int:
    """Start the node's command detached with the host's `python`, its files written first by the same command
    (and with `code`, node_files', the shipped code copied from the host's code cache into the workspace, which is
    made); return its pid."""
    result = conn.run(start_argv(node, python, files_on_stdin=True), timeout=30, stdin=node_files(node, code))
    if result.exit_code != 0 or not result.stdout.strip().isdigit():
        raise HostError(label, f"could not start torchrun: {(result.stderr or result.stdout).strip()[:300]}")
    return int(result.stdout.strip())
