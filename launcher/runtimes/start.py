"""Starting a planned node on its host, whatever its runtime: the environment file first (over SFTP, 0600 in the
0700 workspace: never on a command line), then the start program (launcher/remote/node_start.py, run by the
host's python) around the node's command. The node's runtime answers what differs: the file's name and format,
whether the start program's supervisor or the node's own wrapper reads it, and how long a stop waits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import HostError
from launcher.results.record import RecordError
from launcher.runtimes.docker import DockerRuntime
from launcher.runtimes.join_files import write_remote_hook
from launcher.runtimes.native import NativeRuntime, start_program
from launcher.spec.launchers import NODE_RANK_ENV
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


def start_argv(node: NodePlan, python: str = "python3") -> list[str]:
    """The quoted-argv command that starts a node detached with the host's `python`; its environment is in
    env_file(node), written first."""
    runtime = runtime_named(node.runtime)
    name = runtime.env_file(node)[0] if runtime.detach_reads_env_file else ""
    return [python, "-c", start_program(), node.workspace, node.cwd, name, str(runtime.stop_grace_seconds),
            *node.command]


def env_file(node: NodePlan) -> tuple[str, bytes]:
    """The file that carries the node's environment to its host: its name in the workspace, and its bytes."""
    return runtime_named(node.runtime).env_file(node)


def write_env_file(conn: HostConnection, node: NodePlan) -> None:
    """Write env_file(node) over SFTP into the node's workspace (which must exist): the workspace is made 0700
    first, so nobody else can open the file even before its own mode, 0600, is set."""
    name, data = env_file(node)
    sftp = conn.sftp
    sftp.chmod(node.workspace, 0o700)
    with sftp.open(f"{node.workspace}/{name}", "wb") as f:
        f.chmod(0o600)
        f.write(data)


def start_node(conn: HostConnection, node: NodePlan, label: str, python: str = "python3") -> int:
    """Write the node's environment file, then start its command detached with the host's `python`; return its
    pid."""
    try:
        write_env_file(conn, node)
        if NODE_RANK_ENV in dict(node.env):  # a `-- CMD` node: the world its processes join is measured
            write_remote_hook(conn.sftp, node.workspace)
    except OSError as e:
        raise HostError(label, f"could not write the node's environment into {node.workspace}: {e}") from e
    result = conn.run(start_argv(node, python), timeout=30)
    if result.exit_code != 0 or not result.stdout.strip().isdigit():
        raise HostError(label, f"could not start torchrun: {(result.stderr or result.stdout).strip()[:300]}")
    return int(result.stdout.strip())
