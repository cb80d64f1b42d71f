"""How a `-- CMD` is started on each node (`--launcher`): torchrun (the default: one worker per --gpus), `spawn`
(the script starts its own processes, e.g. with `torch.multiprocessing.spawn`: ddpctl runs it once per node and
tells it where it sits through the DDPCTL_* variables below) or `mpirun` (an MPI job). Pure functions of the spec.
"""

from __future__ import annotations

from launcher.errors import SpecError
from launcher.remote import shell_text
from launcher.spec.script_look import Finding, first

LAUNCHERS = ("torchrun", "spawn", "mpirun")
# What to do with an MPI script (its own refusals: `-- mpiexec ...`, an mpi4py script under torchrun or spawn).
MPI_INSTEAD = ("give the script itself with --launcher mpirun (ddpctl runs one MPI job across the nodes, --gpus "
               "processes per node), e.g. `ddpctl up --launcher mpirun -- python parallel_sgd.py`")

# What a `--launcher spawn` script is told (docs/guides/launchers.md). Every launcher's node gets NODE_RANK and
# NNODES; spawn's also the processes per node and node 0's address and port for its process group.
NODE_RANK_ENV = "DDPCTL_NODE_RANK"
NNODES_ENV = "DDPCTL_NNODES"
NPROC_ENV = "DDPCTL_NPROC_PER_NODE"
MASTER_ADDR_ENV = "DDPCTL_MASTER_ADDR"
MASTER_PORT_ENV = "DDPCTL_MASTER_PORT"

# The join records every `-- CMD` run's processes write (launcher/runtimes/join_hook.py, read back by
# launcher/results/joined_worlds.py): the hook's folder in a node's workspace (first on PYTHONPATH), the variable
# naming the records' folder, and that folder under the node's logs/.
HOOK_DIR = "hook"
JOIN_DIR_ENV = "DDPCTL_JOIN_DIR"
JOINED_DIR = "joined"

# Where a spawn node's output goes, laid out as torchrun's --log-dir is (logs/<group>/attempt_<N>/<local rank>/),
# so following, pulling, `ddpctl logs` and failure attribution read it the same way: one "worker" per node.
SPAWN_LOG_GROUP = "spawn"

# The nodes' commands (shell: they also run inside containers, around the user's command): spawn runs the script
# once, its output into the log layout above; mpirun runs on node 0, its output in logs/mpirun/attempt_0/0/; the
# other nodes of an mpirun run only say that node 0's mpirun starts their processes. Fixed scripts: every value
# arrives as an argument.
SPAWN_SCRIPT = shell_text("spawn.sh")  # launcher/remote/spawn.sh: LOG_DIR PYTHON COMMAND...
MPIRUN_SCRIPT = shell_text("mpirun.sh")  # launcher/remote/mpirun.sh: LOG_DIR MPIRUN ARGS...
MPI_PEER_SCRIPT = shell_text("mpi_peer.sh")  # launcher/remote/mpi_peer.sh: NODE PROCESSES
# How node 0's ssh config names node k (its host key is pinned under that name: HostKeyAlias).
MPI_HOST_ALIAS = "ddpctl-node-{}"
MPI_DIR = "mpi"  # in node 0's workspace: the run's key, ssh config, known_hosts and hostfile


def check_launcher(launcher: str, *, user_command: bool, max_restarts: int) -> None:
    """Raise SpecError (one line) when `--launcher` cannot run this spec."""
    if launcher not in LAUNCHERS:
        raise SpecError(f"--launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    if launcher == "torchrun":
        return
    if not user_command:
        raise SpecError(f"--launcher {launcher} starts your own script (`-- python train.py`); our trainer runs "
                        "under torchrun (its --strategy spawn starts its own processes): drop --launcher")
    if max_restarts:
        raise SpecError(f"--max-restarts is torchrun's (it restarts its workers); --launcher {launcher} starts "
                        "the script once: drop --max-restarts, or rerun the run (`ddpctl up --from RUN`)")


def check_script(findings: list[Finding], launcher: str, *, explicit: bool, nnodes: int, nproc_per_node: int
                 ) -> list[str]:
    """Refuse (SpecError, one line: the line found and the option to use) a script the launcher would run as
    something other than planned; return warnings where the user chose the launcher outright (`--launcher
    torchrun` given: they may know better)."""
    problems = []
    spawns, mpi, pinned = first(findings, "spawns"), first(findings, "mpi"), first(findings, "localhost")
    if launcher == "torchrun" and spawns is not None:
        problems.append(f"{spawns.where} starts its own processes: under torchrun each of the {nproc_per_node} "
                        "worker(s) per node would start them again (clashing ports, worlds nobody planned); run it "
                        "with --launcher spawn (ddpctl then runs it once per node)")
    if launcher in ("torchrun", "spawn") and mpi is not None:
        problems.append(f"{mpi.where}: an MPI script; under {launcher} each process would be an MPI world of its own "
                        f"({MPI_INSTEAD})")
    if launcher == "spawn" and nnodes > 1 and pinned is not None:
        raise SpecError(f"{pinned.where} pins the process group to this machine: on {nnodes} nodes each would train "
                        f"alone, in a world of its own; take node 0's address and port from ${MASTER_ADDR_ENV} and "
                        f"${MASTER_PORT_ENV}, and the global rank from ${NODE_RANK_ENV} x ${NPROC_ENV} + the local "
                        f"rank (world size ${NNODES_ENV} x ${NPROC_ENV})")
    if problems and not (explicit and launcher == "torchrun"):
        raise SpecError(problems[0])
    return problems
