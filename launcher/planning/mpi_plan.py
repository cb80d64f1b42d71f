"""An MPI job across nodes (`--launcher mpirun` on several hosts): node 0 runs one `mpirun` whose app contexts
(one per node, `A : B`) start each node's --gpus ranks, over SSH for the other nodes, each in that node's own
workspace (absolute: the login users' homes may differ) with its own DDPCTL_* variables; the other nodes run
nothing themselves. Pure: the SSH access this needs (the run's key, pinned host keys) is set up by
launcher/execute/hosts/mpi_access.py from the files named here.
"""

from __future__ import annotations

import ipaddress
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
    args = ["--hostfile", f"{ws0}/{MPI_DIR}/hostfile", "--bind-to", "none",
            "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {ws0}/{MPI_DIR}/ssh_config",
            "--mca", "btl", "tcp,self"]  # fmt: skip
    networks = mpi_networks(nodes, facts)
    if networks:  # the network the nodes reach each other on, as for torchrun's rendezvous
        args += ["--mca", "btl_tcp_if_include", networks, "--mca", "oob_tcp_if_include", networks]
    command = mpi_command(spec)
    for node, name, home in zip(nodes, mpi_host_names(nodes), homes, strict=True):
        ws = f"{home}/{node.workspace}"
        if node.index:
            args.append(":")
        args += ["-np", n, "--host", f"{name}:{n}", "-wdir", f"{ws}/code", *exported_env(spec),
                 "env", f"{NODE_RANK_ENV}={node.index}", f"{NNODES_ENV}={spec.nnodes}", f"{NPROC_ENV}={n}",
                 f"DDPCTL_OUTPUT_DIR={ws}/out", f"{JOIN_DIR_ENV}={ws}/logs/{JOINED_DIR}",
                 f"PYTHONPATH={ws}/hook:{ws}/code", *command]
    first = replace(nodes[0], command=tuple(mpirun_argv("../logs", args)))
    peers = [replace(node, command=("sh", "-c", MPI_PEER_SCRIPT, "ddpctl-mpi-node", str(node.index), n))
             for node in nodes[1:]]
    shown = replace(first, display=f"{shlex.join(['mpirun', *args])}   # on node 0 (--launcher mpirun); "
                                   "output in logs/mpirun/attempt_0/0/")
    return (shown, *(replace(p, display=f"# nothing: node 0's mpirun starts its {n} process(es) over SSH")
                     for p in peers))


def exported_env(spec: RunSpec) -> list[str]:
    """`-x NAME` for each variable every rank gets from mpirun's own environment (the user's --env: values never on
    a command line). Given in each application context: Open MPI applies a context's -x to that context alone."""
    return [flag for name in ["PYTHONUNBUFFERED", *(k for k, _ in spec.extra_env)] for flag in ("-x", name)]


def mpi_networks(nodes: tuple[NodePlan, ...], facts: tuple[HostFacts, ...]) -> str | None:
    """What btl_tcp_if_include / oob_tcp_if_include get: the subnets of the addresses the nodes reach each other at
    (`10.79.0.0/24`), which mean the same on every host. Interface names do not: hosts name them differently
    (eth0, ens5, enp1s0), and Open MPI 4.1 drops a list holding a name the host lacks, then cannot connect. An
    address whose prefix the probe did not see counts alone (/32); without addresses, the interface name where
    every node has the same one, else None (Open MPI's own choice)."""
    networks: list[str] = []
    for i, node in enumerate(nodes):
        network = _network(node.host.address, facts[i] if i < len(facts) else None)
        if network is None:
            names = {node.host.iface for node in nodes}
            return names.pop() if len(names) == 1 and None not in names else None
        if network not in networks:
            networks.append(network)
    return ",".join(networks)


def _network(address: str | None, facts: HostFacts | None) -> str | None:
    """`address`'s IPv4 network as the probe saw it on the host (its prefix), else the address alone."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return None
    if ip.version != 4:
        return None
    prefix = next((a.prefix for a in facts.addrs if a.addr == address and a.prefix is not None), 32) if facts else 32
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))
