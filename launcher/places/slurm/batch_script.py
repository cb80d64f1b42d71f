"""The batch script of a run, built from the plan by pure functions and tested as text (like torchrun's argv).

One task per node: `srun` starts torchrun once on every allocated node; the allocation's first node (the first
of `scontrol show hostnames "$SLURM_JOB_NODELIST"`) hosts the c10d store, the rendezvous id is the job id and the
port is derived from it, so two jobs sharing a node never share a port (unless their ids differ by a multiple
of PORT_SPAN). Every node works in `nodes/$SLURM_NODEID/` of the run's folder on the shared file system, laid
out as a host's workspace (out/, logs/, torchrun.out), so pulling it gives the run directory of a host run.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from launcher.places.slurm import mpi_job, requeue
from launcher.places.slurm.prelude import prelude_lines
from launcher.spec import strategies
from launcher.spec.launchers import (
    HOOK_DIR,
    JOIN_DIR_ENV,
    JOINED_DIR,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    NNODES_ENV,
    NODE_RANK_ENV,
    NPROC_ENV,
)
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest
from launcher.spec.torchrun import NodeRole, trainer_argv
from launcher.spec.user_command import node_command

SCRIPT_NAME = "job.sbatch"
# --env's values: a file of mode 0600 beside the script, written over SFTP and sourced by the batch shell, so every
# rank gets them (srun passes the batch environment on) while they stay off every command line and out of the
# script's text, which --dry-run prints and Slurm keeps (`scontrol write batch_script`).
ENV_FILE = "ddpctl.env"
# torchrun's wrapper (launcher/spec/attempt_logs.py), a file beside the script: the script stays short enough to read
# in a dry run, and every node reads the same source from the shared file system.
TORCHRUN_FILE = "torchrun_attempts.py"
SPAWN_FILE = "spawn.sh"  # --launcher spawn: launcher/remote/spawn.sh, which runs the script once on each node
PORT_BASE, PORT_SPAN = 20000, 20000
# GPU requests as the cluster understands them: cons_tres clusters take --gpus-per-node, others only --gres.
GPUS_PER_NODE, GRES = "--gpus-per-node", "--gres"
# In the node script, where the shell gives values only known once the job runs.
_RDZV_ENDPOINT, _JOB_ID = '"$DDPCTL_RDZV_ENDPOINT"', '"$SLURM_JOB_ID"'
_TORCHRUN_PATH = '"$DDPCTL_TORCHRUN"'  # TORCHRUN_FILE's path in the job's folder: `ps` shows a file, not its source


@dataclass(frozen=True)
class SlurmJob:
    """Everything the batch script says: the run, the allocation and where the run's folder is on the cluster."""

    spec: RunSpec
    request: SlurmRequest
    remote_dir: str  # the run's folder on the shared file system (absolute)
    gpu_flag: str | None  # GPUS_PER_NODE or GRES; None: the nodes' CPUs run --gpus processes each
    cpus_per_task: int | None = None

    @property
    def script_path(self) -> str:
        return f"{self.remote_dir}/{SCRIPT_NAME}"

    @property
    def output_path(self) -> str:
        """The batch script's own output (sbatch's %j is the job id)."""
        return f"{self.remote_dir}/slurm-%j.out"


def sbatch_argv(job: SlurmJob) -> list[str]:
    """The submission: every option is in the script, so what runs is the script's text and nothing else."""
    return ["sbatch", "--parsable", job.script_path]


def sbatch_directives(job: SlurmJob) -> list[str]:
    """The #SBATCH options, in a fixed order."""
    spec, request = job.spec, job.request
    # One task per node, which runs torchrun (or a spawn script); an MPI job's tasks are its ranks (mpi_job.py).
    tasks = spec.nproc_per_node if spec.launcher == "mpirun" else 1
    options = [f"--job-name=ddpctl-{spec.run_id}", f"--nodes={spec.nnodes}", f"--ntasks-per-node={tasks}"]
    if job.cpus_per_task is not None:
        options.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.gpu_flag == GPUS_PER_NODE:
        options.append(f"--gpus-per-node={spec.nproc_per_node}")
    elif job.gpu_flag == GRES:
        options.append(f"--gres=gpu:{spec.nproc_per_node}")
    for flag, value in (("--time", request.time), ("--partition", request.partition), ("--account", request.account),
                        ("--qos", request.qos), ("--constraint", request.constraint)):
        if value is not None:
            options.append(f"{flag}={value}")
    options += [f"--chdir={job.remote_dir}", f"--output={job.output_path}", "--open-mode=append"]
    options += requeue.directives(request) if request.requeue else ["--no-requeue"]
    return options + list(request.sbatch_options)


def node_launch_line(spec: RunSpec) -> str:
    """The shell line a node runs for the spec's --launcher: torchrun, or (spawn) the user's script once, its own
    processes started by itself, its output in logs/spawn/attempt_0/0/ as on hosts (launcher/remote/spawn.sh)."""
    if spec.launcher == "spawn":  # the script beside the batch script (SPAWN_FILE), as `sh -c` runs it on hosts
        words = ["../logs", spec.python, *node_command(spec.user_command, spec.python)]
        return 'sh "$spawn" ' + " ".join(shlex.quote(w) for w in words)
    return node_torchrun_line(spec)


def node_torchrun_line(spec: RunSpec) -> str:
    """The shell line a node runs: torchrun joining the job's rendezvous, then our trainer or the user's command."""
    # torchrun as on hosts (launcher/spec/attempt_logs.py): every start of a node's workers in its own attempt
    # folder, numbered the same on every node; run from its file beside the batch script (DDPCTL_TORCHRUN).
    words = [shlex.quote(spec.python), _TORCHRUN_PATH] + [
        shlex.quote(w) for w in ("--nnodes", str(spec.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint")]
    words += [_RDZV_ENDPOINT, "--rdzv-id", _JOB_ID]
    logs = "../logs" if spec.user_command else "logs"
    rest = ["--nproc-per-node", str(strategies.torchrun_workers(spec.strategy, spec.nproc_per_node)),
            "--max-restarts", str(spec.max_restarts), "--log-dir", logs, "--redirects", "3"]
    if spec.user_command:
        rest += ["--no-python", *node_command(spec.user_command, spec.python)]
    else:
        rest += trainer_argv(spec, NodeRole(node_rank=0, out_dir="out", log_dir="logs", snapshot_dir="out/snapshots"))
    return " ".join(words + [shlex.quote(w) for w in rest])


def spawn_env_lines(spec: RunSpec) -> list[str]:
    """What a spawn script is told beyond every node's variables (as on hosts, launcher/planning/plan.py): the
    processes per node and, on several nodes, the first node's address and the job's port for its process group."""
    if spec.launcher != "spawn":
        return []
    lines = [f'spawn="$PWD/{SPAWN_FILE}"', f"export {NPROC_ENV}={spec.nproc_per_node}"]
    if spec.nnodes > 1:
        lines.append(f'export {MASTER_ADDR_ENV}="${{DDPCTL_RDZV_ENDPOINT%:*}}" '
                     f'{MASTER_PORT_ENV}="${{DDPCTL_RDZV_ENDPOINT##*:}}"')
    return lines


def node_script(spec: RunSpec, requeued: bool = False) -> str:
    """What `srun` runs on each node (bash -c): make the node's workspace, run torchrun in it, keep its status.
    `requeued`: the code is copied once (the script's own checkpoints beside it survive a requeue), the output is
    appended to, and the time limit's signal is passed on to the workers (requeue.py)."""
    lines = ['ws="$PWD/nodes/$SLURM_NODEID"', 'mkdir -p "$ws/out" "$ws/logs"']
    if spec.user_command:  # the script writes beside itself: each node its own copy, as on hosts
        fresh = '[ -d "$ws/code" ] ||' if requeued else 'rm -rf "$ws/code" &&'
        copy = f'{fresh} cp -R code "$ws/code"'
        # The join hook (launcher/runtimes/join_hook.py, first on the path) records the world each process joins,
        # as on hosts: the world size is measured, not planned. A requeued job's newest allocation is what counts.
        joined = [f'rm -rf "$ws/logs/{JOINED_DIR}"'] if requeued else []
        lines += [copy, *joined, f'export DDPCTL_OUTPUT_DIR="$ws/out" {NODE_RANK_ENV}="$SLURM_NODEID" '
                  f'{NNODES_ENV}={spec.nnodes} {JOIN_DIR_ENV}="$ws/logs/{JOINED_DIR}"', *spawn_env_lines(spec),
                  f'export PYTHONPATH="$PWD/{HOOK_DIR}:$ws/code${{PYTHONPATH:+:$PYTHONPATH}}"', 'cd "$ws/code"']
    else:
        lines += ['export PYTHONPATH="$PWD/code${PYTHONPATH:+:$PYTHONPATH}"', 'cd "$ws"']
    # The exit status is kept beside the output, as on a host, for the failure attribution after the pull.
    # A cancel signals every process of the step at once: this shell, which would die at once, outlives torchrun
    # (a trap runs after the command it waits for) so that torchrun is never orphaned, which a cluster tracking
    # processes by parent (proctrack/linuxproc) would take for the step's end while torchrun still writes.
    lines.append("trap : TERM")
    if requeued:
        lines += requeue.node_run_lines(node_launch_line(spec), '"$ws/torchrun.out"')
    else:
        lines += [f'{node_launch_line(spec)} > "$ws/torchrun.out" 2>&1 < /dev/null', "code=$?"]
    lines += ['echo "$code" > "$ws/exit_code.tmp" && mv "$ws/exit_code.tmp" "$ws/exit_code"', 'exit "$code"']
    return "\n".join(lines)


def env_lines(spec: RunSpec) -> list[str]:
    """The batch script's lines that export --env's variables: their names only, the values from ENV_FILE."""
    names = [name for name, _ in spec.extra_env]
    if not names:
        return []
    return [f"# --env {' '.join(names)}: the values from {ENV_FILE} beside this script (mode 0600, written by ddpctl)",
            f". ./{ENV_FILE}"]


def env_file_text(spec: RunSpec) -> str:
    """ENV_FILE's text: one `export NAME=VALUE` line per --env variable, each value quoted for the shell."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in spec.extra_env)


def batch_script(job: SlurmJob) -> str:
    """The whole batch script, byte for byte what is written to the cluster and submitted."""
    spec, requeued = job.spec, job.request.requeue
    env = sorted({"PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}.items())
    lines = [
        "#!/bin/bash",
        f"# ddpctl run {spec.run_id}: {spec.nnodes} node(s) x {spec.nproc_per_node} process(es); "
        "submitted as written here",
        *(f"#SBATCH {option}" for option in sbatch_directives(job)),
        *prelude_lines(job.request.prelude),  # a block of its own (launcher/places/slurm/prelude.py)
        "set -e",
        "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env),
        *env_lines(spec),
        "# The allocation's first node hosts the c10d store, on a port derived from the job id.",
        'rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f'export DDPCTL_RDZV_ENDPOINT="$rdzv_host:$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))"',
        'echo "ddpctl: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous at $DDPCTL_RDZV_ENDPOINT"',
        *(requeue.environment_lines(job.request) if requeued else []),
    ]
    if spec.launcher == "mpirun":
        return "\n".join(lines + mpi_job.run_lines(spec)) + "\n"
    lines += [
        "# each node's torchrun, keeping every attempt's logs: ddpctl's launcher/spec/attempt_logs.py as "
        f"{TORCHRUN_FILE}",
        f'DDPCTL_TORCHRUN="$PWD/{TORCHRUN_FILE}"',
        "export DDPCTL_TORCHRUN",
        "read -r -d '' node_script <<'NODE' || true",
        node_script(spec, requeued),
        "NODE",
    ]
    srun = f'srun --nodes={spec.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$node_script"'
    lines += requeue.batch_run_lines(srun, job.request) if requeued else [srun]
    return "\n".join(lines) + "\n"
