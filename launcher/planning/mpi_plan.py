"""An MPI job across nodes (`--launcher mpirun` on several hosts): node 0 runs one `mpirun` whose app contexts
(one per node, `A : B`) start each node's --gpus ranks, over SSH for the other nodes, each in that node's own
workspace (absolute: the login users' homes may differ) with its own DDPCTL_* variables; the other nodes run
nothing themselves. Pure: the SSH access this needs (the run's key, pinned host keys) is set up by
launcher/execute/mpi_access.py from the files named here.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.spec.launchers import (
    JOIN_DIR_ENV,
    JOINED_DIR,
    MPI_DIR,
    MPI_HOST_ALIAS,
    MPI_PEER_SCRIPT,
    NNODES_ENV,
    NODE_RANK_ENV,
    NPROC_ENV,
)
from launcher.spec.torchrun import mpi_command, mpirun_argv

if TYPE_CHECKING:
    from launcher.planning.facts import HostFacts
    from launcher.planning.plan import NodePlan
    from launcher.spec.run_spec import RunSpec

UNKNOWN_HOME = "~"  # a dry run that did not probe: shown so, and named among the plan's unknowns


def mpi_host_names(nodes: tuple[NodePlan, ...]) -> list[str]:
    """What node 0's mpirun calls each node: node 0 by its own address (so mpirun knows it is local), the others
    by the alias node 0's ssh config gives them."""
    return [nodes[0].host.address or nodes[0].host.label] + [MPI_HOST_ALIAS.format(n.index) for n in nodes[1:]]


def hostfile_text(nodes: tuple[NodePlan, ...], nproc_per_node: int) -> str:
    """The job's hostfile: each node with slots = processes per node."""
    return "".join(f"{name} slots={nproc_per_node}\n" for name in mpi_host_names(nodes))


def mpi_nodes(spec: RunSpec, nodes: tuple[NodePlan, ...], facts: tuple[HostFacts, ...]) -> tuple[NodePlan, ...]:
    """The planned nodes as an MPI job: node 0's command is the mpirun of the whole job, the others' a line
    saying so. `facts` (the probe's) give each node's home; without them the homes are shown as ~."""
    homes = [f.home for f in facts] if facts else [UNKNOWN_HOME] * len(nodes)
    n = str(spec.nproc_per_node)
    ws0 = f"{homes[0]}/{nodes[0].workspace}"
    ifaces = sorted({node.host.iface for node in nodes if node.host.iface})
    args = ["--hostfile", f"{ws0}/{MPI_DIR}/hostfile", "--bind-to", "none",
            "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {ws0}/{MPI_DIR}/ssh_config",
            "--mca", "btl", "tcp,self"]  # fmt: skip
    if ifaces:  # the interfaces the nodes reach each other on, as for torchrun's rendezvous
        args += ["--mca", "btl_tcp_if_include", ",".join(ifaces), "--mca", "oob_tcp_if_include", ",".join(ifaces)]
    # Every rank gets the user's --env (values from mpirun's own environment: never on a command line).
    for name in ["PYTHONUNBUFFERED", NNODES_ENV, NPROC_ENV, *(k for k, _ in spec.extra_env)]:
        args += ["-x", name]
    command = mpi_command(spec)
    for node, name, home in zip(nodes, mpi_host_names(nodes), homes, strict=True):
        ws = f"{home}/{node.workspace}"
        if node.index:
            args.append(":")
        args += ["-np", n, "--host", f"{name}:{n}", "-wdir", f"{ws}/code",
                 "env", f"{NODE_RANK_ENV}={node.index}", f"DDPCTL_OUTPUT_DIR={ws}/out",
                 f"{JOIN_DIR_ENV}={ws}/logs/{JOINED_DIR}", f"PYTHONPATH={ws}/hook:{ws}/code", *command]
    first = replace(nodes[0], command=tuple(mpirun_argv("../logs", args)))
    peers = [replace(node, command=("sh", "-c", MPI_PEER_SCRIPT, "ddpctl-mpi-node", str(node.index), n))
             for node in nodes[1:]]
    shown = replace(first, display=f"{shlex.join(['mpirun', *args])}   # on node 0 (--launcher mpirun); "
                                   "output in logs/mpirun/attempt_0/0/")
    return (shown, *(replace(p, display=f"# nothing: node 0's mpirun starts its {n} process(es) over SSH")
                     for p in peers))
