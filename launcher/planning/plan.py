"""The plan step: spec + hosts -> what each node will run. Pure: no connections, files or processes.

`ddpctl up --dry-run` prints a RunPlan; execution (launcher/execute/: local.py, on_hosts.py) only carries one out.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import launcher
from launcher.errors import PlanError, SpecError
from launcher.planning.facts import HostFacts
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
from launcher.spec.torchrun import WRAPPER_FILE, NodeRole, node_argv, shown_command
from launcher.spec.user_command import node_command

LOCAL = "local"
# Per-run workspace on a host, relative to the login user's home directory.
REMOTE_RUNS_ROOT = ".ddpctl/runs"
# plan.json's shape: RunPlan.from_json reads this version and older ones, and refuses a newer one.
PLAN_VERSION = 1


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
        return f"{cd}{'env ' + env + ' ' if env else ''}{shown_command(self.command)}"


@dataclass(frozen=True)
class Shipment:
    """What a run on hosts sends every node before it starts, decided with the plan (launcher/execute/ship/contents.py):
    the local directory (the trainer package, or the user's directory with `-- CMD`), where it goes in the node's
    workspace `code` directory, the digest of its files, and for a docker run streaming the local image, that
    image's ID. The executor sends exactly this, and refuses files or an image changed since."""

    source: str  # absolute local directory
    dest: str  # "/trainer" (the trainer package) or "" (the user's directory)
    digest: str  # "sha256:<hex>" over every file sent: path, size, content, mode (launcher.transport.sync)
    image_id: str | None = None  # the local image's ID when the image is streamed from here; None: none shipped

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "dest": self.dest, "digest": self.digest, "image_id": self.image_id}


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
    rdzv_addr: str | None = None  # node 0's address the others reach its store at (None: one node)
    ship: Shipment | None = None  # None: nothing is shipped (a run on this machine)

    def to_json(self) -> dict[str, Any]:
        """The plan as `up --dry-run --json` prints it and plan.json keeps it (from_json reads it back); --env
        values as ***."""
        multi = self.spec.nnodes > 1
        return {
            "plan_version": PLAN_VERSION, "ddpctl": launcher.__version__,
            "run_id": self.spec.run_id, "nnodes": self.spec.nnodes, "nproc_per_node": self.spec.nproc_per_node,
            "runtime": self.runtime, "launcher": self.spec.launcher, "image": self.image,
            "pull_image": self.pull_image,
            "rdzv_port": self.spec.rdzv_port if multi else None, "rdzv_addr": self.rdzv_addr,
            "unknown": list(self.unknown), "spec": self.spec.to_json(),
            "ship": self.ship.to_json() if self.ship else None,
            "node_facts": [f.to_json() for f in self.node_facts],
            "nodes": [{"index": n.index, "host": n.host.label, "address": n.host.address, "iface": n.host.iface,
                       "gpus": n.host.gpus, "runtime": n.runtime, "workspace": n.workspace, "cwd": n.cwd,
                       "command": list(n.command), "env": {k: MASKED if k in n.secret_names else v for k, v in n.env},
                       "secret_names": list(n.secret_names), "display": n.display} for n in self.nodes],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> RunPlan:
        """The plan to_json wrote (plan.json, `up --dry-run --save-plan`); PlanError saying what is wrong with
        one that is not a plan, is malformed, or was made by a newer ddpctl. --env values come back as *** and
        their names as the spec's `withheld_env` (a plan never holds them)."""
        if not isinstance(data, dict) or not isinstance(data.get("plan_version"), int):
            raise PlanError("it is not a ddpctl plan (no plan_version): save one with `up --dry-run --save-plan FILE`")
        if data["plan_version"] > PLAN_VERSION:
            raise PlanError(f"it was made by a newer ddpctl ({data.get('ddpctl')}, plan version "
                            f"{data['plan_version']}; this one, {launcher.__version__}, reads up to {PLAN_VERSION}): "
                            "make it again with this ddpctl's `up --dry-run --save-plan`")
        if data["plan_version"] < PLAN_VERSION:
            raise PlanError(f"it was made by an older ddpctl (plan version {data['plan_version']}; this one reads "
                            f"version {PLAN_VERSION}): make it again with this ddpctl's `up --dry-run --save-plan`")
        try:
            ship = data["ship"]
            plan = cls(
                spec=RunSpec.from_json(_typed(data, "spec", dict)),
                nodes=tuple(_node_from_json(n, f"nodes[{i}].") for i, n in enumerate(_typed(data, "nodes", list))),
                runtime=_typed(data, "runtime", str), image=data["image"], pull_image=_typed(data, "pull_image", bool),
                unknown=tuple(_typed(data, "unknown", list)),
                node_facts=tuple(HostFacts.from_json(f) for f in _typed(data, "node_facts", list)),
                rdzv_addr=data["rdzv_addr"],
                ship=None if ship is None else Shipment(_typed(ship, "source", str, "ship."),
                                                        _typed(ship, "dest", str, "ship."),
                                                        _typed(ship, "digest", str, "ship."), ship["image_id"]),
            )  # fmt: skip
        except KeyError as e:
            raise PlanError(f"it is malformed: its field {e.args[0]!r} is missing") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"it is malformed: {_spec_field_problem(data.get('spec')) or e}") from None
        except SpecError as e:
            raise PlanError(f"its spec is not valid: {e}") from None
        difference = _spec_field_problem(data["spec"]) or _difference({**data, "ddpctl": launcher.__version__},
                                                                       plan.to_json())
        if difference:
            raise PlanError(f"it is malformed: {difference}")
        return plan

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
        if self.ship is not None:
            lines.append(f"ships {self.ship.source} ({self.ship.digest[:19]}...) to each node's code{self.ship.dest}"
                         + (f", and image {self.image} ({self.ship.image_id[:19]}...) from here" if self.ship.image_id
                            else ""))
        if self.unknown:
            lines.append("not known without probing the hosts or renting the machines (shown with placeholders "
                         "above):")
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
        """Whether the node's supervisor exports its environment file (else the node's wrapper reads it)."""
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


def _difference(given: Any, written: Any, where: str = "") -> str | None:
    """The first field where a plan file's JSON is not what ddpctl writes (`written`), named by its
    path (`nodes[0].gpus`) with what it holds and what was expected; None when they agree."""
    if isinstance(given, dict) and isinstance(written, dict):
        for key in given:
            if key not in written:
                return f"it has a field {where}{key} that ddpctl does not write (remove it, or make the plan again)"
        for key in written:
            if key not in given:
                return f"its field {where}{key} is missing"
            found = _difference(given[key], written[key], f"{where}{key}.")
            if found:
                return found
        return None
    if isinstance(given, list) and isinstance(written, list) and len(given) == len(written):
        for i, (a, b) in enumerate(zip(given, written, strict=True)):
            found = _difference(a, b, f"{where[:-1]}[{i}].")
            if found:
                return found
        return None
    if given != written or type(given) is not type(written):
        field = where[:-1] or "the plan"
        return (f"its field {field} is {json.dumps(given)[:60]} ({type(given).__name__}), where ddpctl writes "
                f"{type(written).__name__} values such as {json.dumps(written)[:60]}")
    return None


def _spec_field_problem(spec: Any) -> str | None:
    """The first field of a plan's spec whose JSON type is not the one its declaration says (str, int, ...)."""
    kinds: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,)}
    for name, declared in RunSpec.__dataclass_fields__.items():
        kind = kinds.get(str(declared.type).removesuffix(" | None"))
        value = spec.get(name) if isinstance(spec, dict) else None
        if kind and value is not None and (type(value) not in kind or kind[0] is int and type(value) is bool):
            return (f"its field spec.{name} is {json.dumps(value)[:60]} ({type(value).__name__}), where ddpctl "
                    f"writes {kind[0].__name__}")
    return None


def _typed(data: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
    value = data[key]
    if not isinstance(value, kind):
        raise TypeError(f"its field {where}{key} is {type(value).__name__}, where ddpctl writes {kind.__name__}")
    return value


def _node_from_json(data: dict[str, Any], where: str) -> NodePlan:
    def typed(key: str, kind: type) -> Any:
        return _typed(data, key, kind, where)

    host = NodeHost(typed("host", str), data["address"], data["iface"], typed("gpus", bool))
    return NodePlan(index=typed("index", int), host=host, runtime=typed("runtime", str),
                    workspace=typed("workspace", str), command=tuple(typed("command", list)),
                    env=tuple(typed("env", dict).items()), cwd=typed("cwd", str),
                    secret_names=tuple(typed("secret_names", list)), display=typed("display", str))


def plan_local(spec: RunSpec, run_dir: str, cwd: str) -> RunPlan:
    """A single-node run on this machine; outputs go straight into the run directory."""
    role = NodeRole(node_rank=0, out_dir=run_dir, log_dir=f"{run_dir}/logs", snapshot_dir=f"{run_dir}/snapshots",
                    wrapper=f"{run_dir}/{WRAPPER_FILE}")
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
    rdzv = addr0 if spec.nnodes > 1 else None
    if runtime is None:
        return RunPlan(spec, nodes, rdzv_addr=rdzv)
    return RunPlan(spec, nodes, runtime=runtime.name, image=runtime.image, rdzv_addr=rdzv)


def native_node_plan(spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
    """Node `index` as torchrun started by the host's own python, in the run's workspace on that host."""
    role = NodeRole(
        node_rank=index,
        out_dir="out",
        log_dir="logs",
        rdzv_addr=rdzv_addr if spec.nnodes > 1 else None,
        local_addr=host.address if spec.nnodes > 1 else None,
        snapshot_dir="out/snapshots",
        wrapper=WRAPPER_FILE,
    )
    cwd = f"{workspace}/code" if spec.user_command else workspace
    env = node_env(spec, host.iface, **(launcher_env(spec, index, rdzv_addr) if spec.user_command else {}))
    if spec.user_command:
        # The user's command runs in its shipped directory; outputs are still collected from the workspace.
        role = NodeRole(node_rank=role.node_rank, out_dir="../out", log_dir="../logs",
                        rdzv_addr=role.rdzv_addr, local_addr=role.local_addr, snapshot_dir="../out/snapshots",
                        wrapper=f"../{WRAPPER_FILE}")
    node = NodePlan(index, host, "native", workspace, tuple(node_argv(spec, role)), env, cwd, secret_names(spec))
    return shown_launch(spec, node)


def shown_launch(spec: RunSpec, node: NodePlan) -> NodePlan:
    """A spawn node as --dry-run shows it: the script's own command line, not the wrapper around it (node.command
    keeps the whole argv, as --json shows it)."""
    if spec.launcher == "spawn":
        line = replace(node, command=node_command(spec.user_command, spec.python)).shell_line()
        return replace(node, display=f"{line}   # once on this node (--launcher spawn); output in "
                                     "logs/spawn/attempt_0/0/")
    if spec.launcher == "mpirun" and spec.nnodes == 1:  # MPIRUN_SCRIPT's arguments from "mpirun" on
        line = replace(node, command=node.command[node.command.index("mpirun"):]).shell_line()
        return replace(node, display=f"{line}   # --launcher mpirun; output in logs/mpirun/attempt_0/0/")
    return node


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
