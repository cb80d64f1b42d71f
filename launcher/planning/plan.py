"""The plan step: spec + hosts -> what each node will run. Pure: no connections, files or processes.

`ddpctl up --dry-run` prints a RunPlan; execution (launcher/execute/: local.py, on_hosts.py) only carries one out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import SpecError
from launcher.spec.launchers import (
    JOIN_DIR_ENV,
    JOINED_DIR,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    NNODES_ENV,
    NODE_RANK_ENV,
    NPROC_ENV,
)
from launcher.spec.run_spec import MASKED, RunSpec
from launcher.spec.torchrun import NodeRole, node_argv
from launcher.spec.user_command import node_command

if TYPE_CHECKING:
    from launcher.planning.facts import HostFacts

LOCAL = "local"
# Per-run workspace on a host, relative to the login user's home directory.
REMOTE_RUNS_ROOT = ".ddpctl/runs"


@dataclass(frozen=True)
class NodeHost:
    """A host as the plan needs it. `address` is the one the other nodes reach it at."""

    label: str
    address: str | None = None
    iface: str | None = None
    # The host's Docker engine has the NVIDIA runtime: containers get `--gpus all` (--runtime docker only).
    gpus: bool = False


@dataclass(frozen=True)
class NodePlan:
    """What one node runs: the command, its environment and working directory, where its files go.

    `env` reaches a local node as its process environment, a host's node in a 0600 file in its workspace
    (launcher/runtimes/native.py; for docker, the container's --env-file), never on a command line. The values of
    `secret_names` (the user's --env) are never shown: shell_line() gives them as NAME=***."""

    index: int
    host: NodeHost
    runtime: str  # "native" or "docker"
    workspace: str  # the run's directory on that host (relative to home for remote hosts)
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    secret_names: tuple[str, ...] = ()
    # The runtime's own display of the command (docker shows its `docker run` line); empty: shell_line builds one.
    display: str = ""

    def shown_env(self) -> str:
        """The environment as NAME=VALUE words for display, secret values as ***."""
        return " ".join(f"{k}={MASKED if k in self.secret_names else shlex.quote(v)}" for k, v in self.env)

    def shell_line(self) -> str:
        """The command as one quoted shell line (for --dry-run and logs)."""
        if self.display:
            return self.display
        env = self.shown_env()
        cd = f"cd {shlex.quote(self.cwd)} && " if self.cwd else ""
        return f"{cd}{'env ' + env + ' ' if env else ''}{shlex.join(self.command)}"


@dataclass(frozen=True)
class RunPlan:
    """Everything a run will do, decided before it starts: the executor carries out exactly this.

    `unknown` names what could not be decided because the hosts were not probed (a dry run that could not, or
    was told not to, reach them); a plan with unknowns is shown, never run. `image` is what docker nodes run
    (`pull_image`: the hosts pull it from a registry instead of receiving ours); `node_facts` what the probe saw."""

    spec: RunSpec
    nodes: tuple[NodePlan, ...]
    runtime: str = "native"
    image: str | None = None
    pull_image: bool = False
    unknown: tuple[str, ...] = ()
    node_facts: tuple[HostFacts, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        """The plan as `up --dry-run --json` prints it; --env values as ***."""
        multi = self.spec.nnodes > 1
        return {
            "run_id": self.spec.run_id, "nnodes": self.spec.nnodes, "nproc_per_node": self.spec.nproc_per_node,
            "runtime": self.runtime, "launcher": self.spec.launcher, "image": self.image, "pull_image": self.pull_image,
            "rdzv_port": self.spec.rdzv_port if multi else None, "unknown": list(self.unknown),
            "node_facts": [f.to_json() for f in self.node_facts],
            "nodes": [{"index": n.index, "host": n.host.label, "address": n.host.address, "runtime": n.runtime,
                       "workspace": n.workspace, "cwd": n.cwd, "command": list(n.command),
                       "env": {k: MASKED if k in n.secret_names else v for k, v in n.env}} for n in self.nodes],
        }  # fmt: skip

    def describe(self) -> str:
        """The plan for people: one header, then each node's command; then what is not known, if anything."""
        port = f", rendezvous port {self.spec.rdzv_port}" if self.spec.nnodes > 1 else ""
        lines = [f"run {self.spec.run_id}: {self.spec.nnodes} node(s) x {self.spec.nproc_per_node} process(es), "
                 f"runtime {self.runtime}, launcher {self.spec.launcher}{port}"]
        for node, facts in zip(self.nodes, self.node_facts or [None] * len(self.nodes), strict=True):
            lines.append(f"node {node.index} [{node.host.label}, {node.runtime}]:")
            if facts is not None:
                gpus = ", ".join(facts.gpu_names) or "no GPU"
                lines.append(f"  # python {facts.python}, torch {facts.torch or 'none'}, {facts.cpus} cores, {gpus}")
            lines.append(f"  {node.shell_line()}")
        if self.unknown:
            lines.append("not known without probing the hosts (shown with placeholders above):")
            lines += [f"  {item}" for item in self.unknown]
        return "\n".join(lines)


class NodeRuntime(Protocol):
    """How a node runs on a host: what planning needs of a runtime (launcher/runtimes/ implements it: `native`,
    `docker`), so adding a runtime adds a module there instead of another `if runtime == ...` here."""

    @property
    def name(self) -> str:
        """The name recorded in run.json and shown by --dry-run: "native" or "docker"."""
        ...

    @property
    def image(self) -> str | None:
        """The image its nodes run (None: the host's own python)."""
        ...

    @property
    def runs_host_torch(self) -> bool:
        """Whether the host's own python and torch run the trainer (so preflight must check their versions)."""
        ...

    @property
    def detach_reads_env_file(self) -> bool:
        """Whether the detach script exports the node's environment file (else the node's wrapper reads it)."""
        ...

    @property
    def stop_grace_seconds(self) -> int:
        """How long stopping a node waits before killing what is left of it."""
        ...

    def env_file(self, node: NodePlan) -> tuple[str, bytes]:
        """The file that carries the node's environment to its host: its name in the workspace, and its bytes."""
        ...

    def plan_node(self, spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
        """Node `index` of `spec` on `host`: its command, environment and working directory (pure)."""
        ...


def plan_local(spec: RunSpec, run_dir: str, cwd: str) -> RunPlan:
    """A single-node run on this machine; outputs go straight into the run directory."""
    role = NodeRole(node_rank=0, out_dir=run_dir, log_dir=f"{run_dir}/logs", snapshot_dir=f"{run_dir}/snapshots")
    node = NodePlan(
        index=0,
        host=NodeHost(LOCAL),
        runtime="native",
        workspace=run_dir,
        command=tuple(node_argv(spec, role)),
        env=node_env(spec, None, **({**script_env(spec, 0, None, f"{run_dir}/out"),
                                      JOIN_DIR_ENV: f"{run_dir}/logs/{JOINED_DIR}"} if spec.user_command else {})),
        cwd=cwd,
        secret_names=secret_names(spec),
    )
    return RunPlan(spec, (shown_launch(spec, node),))


def remote_workspace(run_id: str) -> str:
    return f"{REMOTE_RUNS_ROOT}/{run_id}"


def plan_remote(spec: RunSpec, hosts: list[NodeHost], rdzv_addr: str | None = None,
                runtime: NodeRuntime | None = None) -> RunPlan:
    """One torchrun node per host, node 0 hosting the c10d store at `rdzv_addr` (default: its address);
    each node as `runtime` runs it (default: native torchrun on the host)."""
    if len(hosts) != spec.nnodes:
        raise ValueError(f"spec has {spec.nnodes} nodes but {len(hosts)} hosts were given")
    addr0 = rdzv_addr or hosts[0].address or hosts[0].label
    workspace = remote_workspace(spec.run_id)
    plan_node = runtime.plan_node if runtime is not None else native_node_plan
    nodes = tuple(plan_node(spec, index, host, addr0, workspace) for index, host in enumerate(hosts))
    if runtime is None:
        return RunPlan(spec, nodes)
    return RunPlan(spec, nodes, runtime=runtime.name, image=runtime.image)


def native_node_plan(spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
    """Node `index` as torchrun started by the host's own python, in the run's workspace on that host."""
    role = NodeRole(
        node_rank=index,
        out_dir="out",
        log_dir="logs",
        rdzv_addr=rdzv_addr if spec.nnodes > 1 else None,
        local_addr=host.address if spec.nnodes > 1 else None,
        snapshot_dir="out/snapshots",
    )
    cwd = f"{workspace}/code" if spec.user_command else workspace
    env = node_env(spec, host.iface, **(launcher_env(spec, index, rdzv_addr) if spec.user_command else {}))
    if spec.user_command:
        # The user's command runs in its shipped directory; outputs are still collected from the workspace.
        role = NodeRole(node_rank=role.node_rank, out_dir="../out", log_dir="../logs",
                        rdzv_addr=role.rdzv_addr, local_addr=role.local_addr, snapshot_dir="../out/snapshots")
    node = NodePlan(index, host, "native", workspace, tuple(node_argv(spec, role)), env, cwd, secret_names(spec))
    return shown_launch(spec, node)


def shown_launch(spec: RunSpec, node: NodePlan) -> NodePlan:
    """A spawn node as --dry-run shows it: the script's own command line, not the wrapper around it (node.command
    keeps the whole argv, as --json shows it)."""
    if spec.launcher != "spawn":
        return node
    script = node_command(spec.user_command, spec.python)
    line = replace(node, command=script).shell_line()
    return replace(node, display=f"{line}   # once on this node (--launcher spawn); output in logs/spawn/attempt_0/0/")


def script_env(spec: RunSpec, node_rank: int, master_addr: str | None, output_dir: str) -> dict[str, str]:
    """What a `-- CMD` node's script is told beyond torchrun's variables: where its outputs go and the launcher's
    DDPCTL_* variables (launcher/spec/launchers.py)."""
    return {"DDPCTL_OUTPUT_DIR": output_dir, **launcher_env(spec, node_rank, master_addr)}


def launcher_env(spec: RunSpec, node_rank: int, master_addr: str | None) -> dict[str, str]:
    """The DDPCTL_* variables a `-- CMD` node gets: its rank and the node count for any launcher; for spawn also
    the processes per node and, on several nodes, node 0's address and port (one node: SPAWN_SCRIPT picks them)."""
    env = {NODE_RANK_ENV: str(node_rank), NNODES_ENV: str(spec.nnodes)}
    if spec.launcher == "spawn":
        env[NPROC_ENV] = str(spec.nproc_per_node)
        if spec.nnodes > 1 and master_addr:
            env.update({MASTER_ADDR_ENV: master_addr, MASTER_PORT_ENV: str(spec.rdzv_port)})
    return env


def node_env(spec: RunSpec, iface: str | None, **base: str) -> tuple[tuple[str, str], ...]:
    """The environment torchrun starts with on a node, whatever runs it (a process or a container): `base`,
    then ours, then the spec's own variables, each overriding the one before."""
    if spec.withheld_env:
        names = ", ".join(spec.withheld_env)
        raise SpecError(f"the values of --env {names} were not stored (run.json and sweep.json keep names only): "
                        "start a new run with --env NAME=VALUE for each")
    # A restarted worker must not reuse the dead attempt's addresses from torchrun's shared store
    # (pytorch/pytorch#135712): gloo then fails with "connectFullMesh ... Connection refused", or ranks whose
    # agents count restarts differently wait for each other forever.
    env: dict[str, str] = {**base, "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
        env["NCCL_SOCKET_IFNAME"] = iface
    env.update(dict(spec.extra_env))
    return tuple(sorted(env.items()))


def secret_names(spec: RunSpec) -> tuple[str, ...]:
    """The names whose values are shown as ***: the user's --env variables."""
    return tuple(k for k, _ in spec.extra_env)
