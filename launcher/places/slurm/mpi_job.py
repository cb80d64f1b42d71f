"""`--launcher mpirun` as a Slurm job, its ranks started one of two ways, chosen in the job (after the prelude, which
may load the cluster's MPI module): `srun --mpi=pmix` where Slurm has its pmix plugin (`srun --mpi=list`) and Open
MPI can be a PMIx client (4.x built with a PMIx component, `ompi_info`; 5 and later always), so Slurm starts, tracks
and signals every rank itself; else Open MPI's mpirun inside the allocation, which starts its daemons on the other
nodes through srun (its Slurm support: plm/ras slurm). `DDPCTL_SLURM_MPI=pmix|mpirun` (e.g. `--env`) decides
instead. Either way --gpus ranks on every node: the job asks for --gpus tasks per node, so each node's slots are its
ranks. Built from the spec by pure functions and tested as text, like the torchrun job (batch_script.py).

Every node's folder is made by the batch shell (the file system is shared): `nodes/<k>/` with its copy of the code,
out/ and logs/, as on hosts. Each rank finds its node's folder from its rank (`--map-by ppr:P:node`, as srun's block
distribution of P tasks per node, puts ranks kP..kP+P-1 on the allocation's k-th node; mpirun tells it as
OMPI_COMM_WORLD_RANK, srun as SLURM_PROCID) and runs there with the join hook first on its path; mpirun's own output
goes to node 0's logs/mpirun/attempt_0/0/ (launcher/remote/mpirun.sh, beside the batch script as MPIRUN_FILE), and
srun's there too."""

from __future__ import annotations

import shlex

from launcher.remote import shell_text
from launcher.spec.launchers import HOOK_DIR, JOIN_DIR_ENV, JOINED_DIR, NNODES_ENV, NODE_RANK_ENV
from launcher.spec.run_spec import RunSpec
from launcher.spec.torchrun import mpi_command

MPIRUN_FILE = "mpirun.sh"
STARTER_ENV = "DDPCTL_SLURM_MPI"  # pmix | mpirun: how the ranks start; unset, the job chooses (module docstring)
SRUN_PMIX_SAID = "ddpctl: the MPI ranks are started by srun --mpi=pmix"  # in the job's output; read back at its end

# Run by every rank (bash -c RANK_SCRIPT ddpctl-rank COMMAND...): its node's folder, variables and code.
RANK_SCRIPT = ('node=$((${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID} / DDPCTL_NPROC)); ws="$DDPCTL_RUN/nodes/$node"; '
               f'export DDPCTL_OUTPUT_DIR="$ws/out" {NODE_RANK_ENV}="$node" {JOIN_DIR_ENV}="$ws/logs/{JOINED_DIR}" '
               f'PYTHONPATH="$DDPCTL_RUN/{HOOK_DIR}:$ws/code${{PYTHONPATH:+:$PYTHONPATH}}"; '
               'cd "$ws/code" && exec "$@"')


def mpirun_argv(spec: RunSpec) -> list[str]:
    """mpirun's options and the ranks' command: P ranks on each of the allocation's nodes, no binding (the
    script's threads use the task's CPUs)."""
    ranks = spec.nnodes * spec.nproc_per_node
    return ["mpirun", "-np", str(ranks), "--map-by", f"ppr:{spec.nproc_per_node}:node", "--bind-to", "none",
            "bash", "-c", RANK_SCRIPT, "ddpctl-rank", *mpi_command(spec)]


# Prints the network between the nodes (launcher/remote/mpi_network.sh), run by the batch shell on the first node.
NETWORK_SCRIPT = shell_text("mpi_network.sh")


def network_lines() -> list[str]:
    """Open MPI's TCP (its daemons' and the ranks') on the network between the nodes, named by its subnet: never a
    docker0 or other bridge with the same address on every node, where a rank reaches one of its own node's instead
    of its peer and the job hangs to its time limit. Through OMPI_MCA_* (srun passes them on to mpirun's daemons),
    only where the user set none; Open MPI's own choice where the first node finds no such network."""
    return [
        "# Open MPI's TCP on the network between the nodes only (not a docker0 alike on every node)",
        f'mpi_net=$(sh -c {shlex.quote(NETWORK_SCRIPT)} ddpctl-mpi-network '
        '$(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'if [ -n "$mpi_net" ]; then',
        '  export OMPI_MCA_btl_tcp_if_include="${OMPI_MCA_btl_tcp_if_include:-$mpi_net}" '
        'OMPI_MCA_oob_tcp_if_include="${OMPI_MCA_oob_tcp_if_include:-$mpi_net}"',
        "fi",
    ]



def srun_argv(spec: RunSpec) -> list[str]:
    """srun starting every rank itself, Open MPI's ranks wiring up through Slurm's PMIx server."""
    return ["srun", "--mpi=pmix", f"--nodes={spec.nnodes}", f"--ntasks-per-node={spec.nproc_per_node}",
            "--kill-on-bad-exit=1", "bash", "-c", RANK_SCRIPT, "ddpctl-rank", *mpi_command(spec)]


def starter_lines() -> list[str]:
    """The choice of how the ranks start (STARTER_ENV, chosen here unless given), said in the job's output."""
    ompi5 = "ompi_info --version 2>/dev/null | grep -Eq 'v([5-9]|[1-9][0-9])\\.'"
    client = "ompi_info 2>/dev/null | grep -Eq 'MCA pmix: (ext|pmix)[0-9]'"
    return [
        f'if [ -z "${{{STARTER_ENV}:-}}" ]; then',
        f"  {STARTER_ENV}=mpirun",
        f"  if srun --mpi=list 2>&1 | grep -qw pmix && {{ {ompi5} || {client}; }}; then {STARTER_ENV}=pmix; fi",
        "fi",
        f'case "${STARTER_ENV}" in',
        f"  pmix) echo \"{SRUN_PMIX_SAID} ({STARTER_ENV}=pmix)\" ;;",
        f"  mpirun) echo \"ddpctl: the MPI ranks are started by Open MPI's mpirun ({STARTER_ENV}=mpirun)\" ;;",
        f'  *) echo "ddpctl: {STARTER_ENV}=${STARTER_ENV}: give pmix or mpirun" >&2; exit 2 ;;',
        "esac",
    ]


def run_lines(spec: RunSpec) -> list[str]:
    """The batch script's lines after the common part: the nodes' folders, how the ranks start, then srun or
    mpirun and its status kept."""
    last = spec.nnodes - 1
    ranks = " ".join(shlex.quote(w) for w in srun_argv(spec))
    mpirun = " ".join(shlex.quote(w) for w in mpirun_argv(spec))
    run = f'sh "$PWD/{MPIRUN_FILE}" nodes/0/logs'
    output = "> nodes/0/torchrun.out 2>&1 < /dev/null || code=$?"
    return [
        "# --launcher mpirun: every node's folder here (shared file system); the ranks, "
        f"{spec.nproc_per_node} on each node, started by",
        "# srun --mpi=pmix where Slurm and Open MPI both speak PMIx, else by Open MPI's mpirun (its daemons through "
        "srun).",
        f'for k in $(seq 0 {last}); do mkdir -p "nodes/$k/out" "nodes/$k/logs" && rm -rf "nodes/$k/code" && '
        'cp -R code "nodes/$k/code"; done',
        f'export DDPCTL_RUN="$PWD" DDPCTL_NPROC={spec.nproc_per_node} {NNODES_ENV}={spec.nnodes}',
        *network_lines(),
        *starter_lines(),
        "code=0",
        f'if [ "${STARTER_ENV}" = pmix ]; then',
        f"  {run} {ranks} {output}",
        "else",
        f"  {run} {mpirun} {output}",
        "fi",
        'echo "$code" > nodes/0/exit_code.tmp && mv nodes/0/exit_code.tmp nodes/0/exit_code',
        'exit "$code"',
    ]
