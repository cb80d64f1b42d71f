"""The Docker runtime for SSH hosts: each node is a container of the trainer image wrapping the same torchrun argv.

`docker_node_plan` is pure (plan_remote calls it for --runtime docker). The node's command is a fixed POSIX
shell wrapper, launcher/remote/docker_run.sh: `sh -c RUN_SCRIPT ddpctl-docker WORKSPACE DATA_DIR NAME GRACE ENV_FILE
DOCKER-RUN-OPTIONS... IMAGE TORCHRUN...`: every value reaches it as a quoted argument. The wrapper
- makes WORKSPACE (and DATA_DIR) absolute against the login user's $HOME (docker -v needs absolute paths), so
  the executor needs to know nothing of the host's home: run NodePlan.command like a native one;
- starts the container detached (`docker run -d`, named ddpctl-<run_id>-n<index>, labelled ddpctl.run and
  ddpctl.node, --network host, --ipc host, --gpus all where the host has the NVIDIA runtime, the workspace
  bind-mounted at /workspace, running as the login user so the files it writes stay the user's), its
  environment from WORKSPACE/ENV_FILE (`--env-file`, written by the start step: launcher/runtimes/native.py), which
  it deletes once the container exists, so no value is ever on a command line;
- follows the container's output and exits with the container's exit code, then removes the container;
- on SIGTERM/SIGINT/SIGHUP stops the container (`docker stop -t GRACE`, GRACE = STOP_GRACE_SECONDS); stopping
  the node gives the wrapper longer than that (NODE_STOP_GRACE_SECONDS) to finish its `docker stop` and `docker rm`.
So the native machinery (launcher/runtimes/native.py: detached start, pid, exit_code, torchrun.out, stop by process
group) works unchanged for containers. Inside, outputs go to /workspace/out and /workspace/logs, and
PYTHONPATH=/workspace/code puts the run's shipped trainer ahead of the image's copy.

The hosts' engines (what they have, getting the image onto them) are launcher/runtimes/docker_hosts.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from launcher.errors import SpecError
from launcher.planning.plan import NodeHost, NodePlan, node_env, script_env, secret_names
from launcher.remote import shell_text
from launcher.runtimes.base import NODE_STOP_GRACE_SECONDS, STOP_GRACE_SECONDS
from launcher.spec.launchers import HOOK_DIR, JOIN_DIR_ENV, JOINED_DIR
from launcher.spec.run_spec import RunSpec
from launcher.spec.torchrun import WRAPPER_FILE, NodeRole, shown_command, torchrun_argv

CONTAINER_WORKSPACE = "/workspace"
CONTAINER_DATA = "/data"
DEFAULT_IMAGE = "ddpctl:latest"
# The container's environment in docker's --env-file format, in the node's workspace (0600; see remote_node).
ENV_FILE = "docker.env"
# Python inside the image; spec.python names the hosts' python, which the container does not have.
IMAGE_PYTHON = "python3"

RUN_SCRIPT = shell_text("docker_run.sh")  # launcher/remote/docker_run.sh


def display_line(node: NodePlan) -> str:
    """What a docker node runs, as the `docker run` line the wrapper issues (for --dry-run and logs)."""
    ws, data, name, _grace, env_file, *rest = node.command[len(("sh", "-c", RUN_SCRIPT, "ddpctl-docker")):]
    home = lambda path: path if path.startswith("/") else f"$HOME/{path}"  # noqa: E731
    mounts = f'-v "{home(ws)}:{CONTAINER_WORKSPACE}"' + (f' -v "{home(data)}:{CONTAINER_DATA}"' if data else "")
    return (f'docker run -d --name {name} --user "$(id -u):$(id -g)" {mounts} --env-file "{home(ws)}/{env_file}" '
            f"{shown_command(rest)}  # {env_file}: {node.shown_env()}; then follows its output and exits with its "
            "exit code")


def container_name(run_id: str, index: int) -> str:
    """The node's container name (run ids are safe docker names: see launcher.spec.run_spec.SAFE_NAME)."""
    return f"ddpctl-{run_id}-n{index}"


def docker_node_plan(spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str,
                     image: str | None) -> NodePlan:
    """Node `index` as a container on `host`: the wrapper around `docker run ... IMAGE torchrun ...`."""
    multi = spec.nnodes > 1
    ws = CONTAINER_WORKSPACE
    role = NodeRole(
        node_rank=index,
        out_dir=f"{ws}/out",
        log_dir=f"{ws}/logs",
        rdzv_addr=rdzv_addr if multi else None,
        local_addr=host.address if multi else None,
        data_dir=CONTAINER_DATA if spec.data_dir else None,
        snapshot_dir=f"{ws}/out/snapshots",
        wrapper=f"{ws}/{WRAPPER_FILE}",
    )
    argv = torchrun_argv(replace(spec, python=IMAGE_PYTHON), role)
    # A `-- CMD` node: ddpctl's variables, and the join hook first on its path (the world it forms is measured).
    script = {**script_env(spec, index, rdzv_addr if multi else None, f"{ws}/out"),
              JOIN_DIR_ENV: f"{ws}/logs/{JOINED_DIR}", "PYTHONPATH": f"{ws}/{HOOK_DIR}:{ws}/code"}
    env = node_env(spec, host.iface, **{"HOME": "/tmp", "PYTHONPATH": f"{ws}/code", **(script if spec.user_command
                                                                                          else {})})
    broken = [key for key, value in env if "\n" in value or "\r" in value]
    if broken:
        raise SpecError(f"--env {', '.join(broken)}: a value with a line break cannot reach a container (docker's "
                        "--env-file holds one line per variable); use --runtime native for it")
    options = [
        "--init",
        "--label", f"ddpctl.run={spec.run_id}",
        "--label", f"ddpctl.node={index}",
        "--network", "host",
        "--ipc", "host",
        "-w", f"{ws}/code" if spec.user_command else ws,
    ]  # fmt: skip
    if host.gpus:
        options += ["--gpus", "all"]
    command = ("sh", "-c", RUN_SCRIPT, "ddpctl-docker", workspace, spec.data_dir or "",
               container_name(spec.run_id, index), str(STOP_GRACE_SECONDS), ENV_FILE, *options,
               image or DEFAULT_IMAGE, *argv)
    node = NodePlan(index, host, "docker", workspace, command, env, workspace, secret_names(spec))
    return replace(node, display=display_line(node))


@dataclass(frozen=True)
class DockerRuntime:
    """Each node a container of `image`, which brings its own python and torch (see
    launcher.planning.plan.NodeRuntime)."""

    image: str = DEFAULT_IMAGE
    name: str = "docker"
    runs_host_torch: bool = False
    detach_reads_env_file: bool = False  # the wrapper hands the file to `docker run --env-file` itself
    stop_grace_seconds: int = NODE_STOP_GRACE_SECONDS

    def env_file(self, node: NodePlan) -> tuple[str, bytes]:
        """ENV_FILE in docker's --env-file format."""
        return ENV_FILE, env_file_text(node.env).encode("utf-8", "surrogateescape")

    def plan_node(self, spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
        """Node `index` as a container on `host` (docker_node_plan)."""
        return docker_node_plan(spec, index, host, rdzv_addr, workspace, self.image)


def env_file_text(env: Sequence[tuple[str, str]]) -> str:
    """`env` in docker's --env-file format: one NAME=VALUE line each, the value verbatim to the end of the line."""
    return "".join(f"{key}={value}\n" for key, value in env)
