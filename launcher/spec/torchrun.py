"""torchrun's argument list, built from a RunSpec by pure functions (quoting happens later, at the boundary)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.spec import attempt_logs, strategies
from launcher.spec.launchers import MPI_PEER_SCRIPT, MPIRUN_SCRIPT, SPAWN_SCRIPT
from launcher.spec.run_spec import RunSpec
from launcher.spec.user_command import node_command

# What runs torchrun on a node: torch.distributed.run with every attempt's worker logs kept. Written as
# WRAPPER_FILE into the node's workspace and run from there (so `ps` shows a file, not 3 KB of source; a Slurm job
# runs it as torchrun_attempts.py beside its batch script); a role without `wrapper` gives its source to `python -c`.
TORCHRUN_SOURCE = Path(attempt_logs.__file__).read_text()
TORCHRUN_SHOWN = '"$(cat launcher/spec/attempt_logs.py)"'
WRAPPER_FILE = "ddpctl_torchrun.py"


@dataclass(frozen=True)
class NodeRole:
    """Where one node sits in the rendezvous and where its files go (paths as seen on that node)."""

    node_rank: int
    out_dir: str
    log_dir: str
    # None for a single-node run: torchrun --standalone then picks a free local port itself.
    rdzv_addr: str | None = None
    local_addr: str | None = None
    data_dir: str | None = None
    snapshot_dir: str | None = None
    wrapper: str | None = None  # WRAPPER_FILE's path on the node (from its cwd); None: `python -c` its source


def trainer_argv(spec: RunSpec, role: NodeRole) -> list[str]:
    """Our trainer's module and options (what follows torchrun's own options)."""
    argv = [
        "-m", "trainer",
        "--model", spec.model,
        "--dataset", spec.dataset,
        "--epochs", str(spec.epochs),
        "--batch-size", str(spec.batch_size),
        "--lr", repr(spec.lr),
        "--save-every", str(spec.save_every),
        "--seed", str(spec.seed),
        "--backend", spec.backend,
        "--out-dir", role.out_dir,
    ]  # fmt: skip
    data_dir = role.data_dir or spec.data_dir
    if data_dir:
        argv += ["--data-dir", data_dir]
    if role.snapshot_dir:
        argv += ["--snapshot-dir", role.snapshot_dir]
    return argv + strategy_argv(spec) + list(spec.trainer_args)


def strategy_argv(spec: RunSpec) -> list[str]:
    """The trainer's strategy options; none for plain ddp in fp32 (the trainer's defaults)."""
    argv: list[str] = []
    if spec.strategy != "ddp":
        argv += ["--strategy", spec.strategy]
    processes = strategies.trainer_processes(spec.strategy, spec.nproc_per_node)
    if processes is not None:
        argv += ["--processes", str(processes)]
    devices = strategies.default_devices(spec.strategy, spec.devices, spec.nproc_per_node)
    if devices is not None:
        argv += ["--devices", devices]
    if spec.average_every is not None:
        argv += ["--average-every", spec.average_every]
    if spec.threads_per_process is not None:
        argv += ["--threads-per-process", str(spec.threads_per_process)]
    if spec.precision != "fp32":
        argv += ["--precision", spec.precision]
    return argv


def torchrun_argv(spec: RunSpec, role: NodeRole) -> list[str]:
    """The whole command a node runs: `PYTHON -c TORCHRUN_SOURCE OPTIONS (-m trainer ... | --no-python CMD)`,
    torch.distributed.run keeping each attempt's logs (launcher/spec/attempt_logs.py)."""
    argv = [spec.python, role.wrapper] if role.wrapper else [spec.python, "-c", TORCHRUN_SOURCE]
    if spec.nnodes == 1 and role.rdzv_addr is None:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        if role.rdzv_addr is None:
            raise ValueError("a multi-node run needs node 0's rendezvous address")
        argv += [
            "--nnodes", str(spec.nnodes),
            "--node-rank", str(role.node_rank),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{_bracket(role.rdzv_addr)}:{spec.rdzv_port}",
            "--rdzv-id", spec.run_id,
            # Hostname matching decides who hosts the store; behind NAT or with shared hostnames nobody
            # matches, so say it outright.
            "--rdzv-conf", f"is_host={1 if role.node_rank == 0 else 0}",
        ]  # fmt: skip
        if role.local_addr:
            argv += ["--local-addr", role.local_addr]
    argv += [
        "--nproc-per-node", str(strategies.torchrun_workers(spec.strategy, spec.nproc_per_node)),
        "--max-restarts", str(spec.max_restarts),
        "--log-dir", role.log_dir,
        "--redirects", "3",
    ]  # fmt: skip
    if spec.user_command:
        return argv + ["--no-python", *node_command(spec.user_command, spec.python)]
    # Our trainer prints one line per epoch on rank 0's stdout: teed into the node's torchrun output (`ddpctl logs`)
    # as well as its file. A script's output is its own: it stays in the files only.
    return argv + ["--tee", "1"] + trainer_argv(spec, role)


def shown_command(argv: Sequence[str]) -> str:
    """A command as one quoted shell line for people (--dry-run, events): torchrun's wrapper source is shown as
    the file it comes from, `"$(cat launcher/spec/attempt_logs.py)"`."""
    return " ".join(TORCHRUN_SHOWN if arg == TORCHRUN_SOURCE else shlex.quote(arg) for arg in argv)


def shown_argv(argv: Sequence[str]) -> list[str]:
    """A command's arguments for records people read (events.jsonl): torchrun's wrapper source as its file."""
    return [TORCHRUN_SHOWN if arg == TORCHRUN_SOURCE else arg for arg in argv]


def node_argv(spec: RunSpec, role: NodeRole) -> list[str]:
    """What a node runs for the spec's --launcher: torchrun (torchrun_argv) or the script itself (spawn)."""
    if spec.launcher == "spawn":
        return spawn_argv(spec, role, node_command(spec.user_command, spec.python))
    if spec.launcher == "mpirun":
        n = str(spec.nproc_per_node)
        if spec.nnodes > 1:  # node 0's mpirun is planned from the hosts' facts (planning/mpi_plan.py)
            return ["sh", "-c", MPI_PEER_SCRIPT, "ddpctl-mpi-node", str(role.node_rank), n]
        return mpirun_argv(role.log_dir, ["-np", n, "--host", f"localhost:{n}", "--bind-to", "none",
                                          *mpi_command(spec)])
    return torchrun_argv(spec, role)


def mpi_command(spec: RunSpec) -> tuple[str, ...]:
    """What each MPI rank runs: `python script.py ARGS` as `python -m mpi4py script.py ARGS`, mpi4py's runner, which
    aborts the whole job when a rank raises (otherwise the others wait for it in their next collective forever)."""
    command = node_command(spec.user_command, spec.python)
    python = os.path.basename(command[0]) if command else ""
    if re.fullmatch(r"python[0-9.]*", python) and len(command) > 1 and command[1].endswith(".py"):
        return (command[0], "-m", "mpi4py", *command[1:])
    return command


def mpirun_argv(log_dir: str, mpirun_args: list[str]) -> list[str]:
    """Node 0's command for --launcher mpirun: launchers.MPIRUN_SCRIPT around `mpirun MPIRUN_ARGS`."""
    return ["sh", "-c", MPIRUN_SCRIPT, "ddpctl-mpirun", log_dir, "mpirun", *mpirun_args]


def spawn_argv(spec: RunSpec, role: NodeRole, command: tuple[str, ...]) -> list[str]:
    """A spawn node's command: launchers.SPAWN_SCRIPT running `command` once, its output into role.log_dir."""
    return ["sh", "-c", SPAWN_SCRIPT, "ddpctl-spawn", role.log_dir, spec.python, *command]


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
