"""`--launcher mpirun` on Slurm: the batch shell names the network between the nodes for Open MPI's TCP
(launcher/remote/mpi_network.sh, run with `ip` and `getent` standing in for the node's), so that a docker0 with the
same address on every node is never taken. On the test cluster, whose nodes each have such a docker0 (the varied test
bed), tests/test_slurm_plain_script.py's mpirun tests hung to their time limit without it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from launcher.places.slurm.batch_script import SlurmJob, batch_script
from launcher.places.slurm.mpi_job import NETWORK_SCRIPT
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest

# `ip -o -4 addr show` of a node with a docker0 alike on every node, the route between the nodes on ens5 (/20).
IP_ADDR = ("1: lo    inet 127.0.0.1/8 scope host lo\n"
           "3: docker0    inet 10.232.1.1/24 brd 10.232.1.255 scope global docker0\n"
           "4: ens5    inet 192.168.77.5/20 brd 192.168.79.255 scope global ens5\n")


def network(tmp_path: Path, names: dict[str, str], *nodes: str, ip: bool = True) -> str:
    """What the script prints on a node whose `getent ahostsv4 NAME` gives names[NAME] (nothing for a name left out)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    table = "\n".join(f'  {name}) echo "{addr}     STREAM {name}";;' for name, addr in names.items())
    (bin_dir / "getent").write_text(f'#!/bin/sh\ncase "$2" in\n{table}\n  *) exit 2;;\nesac\n')
    if ip:
        (bin_dir / "ip").write_text(f"#!/bin/sh\nprintf '%s' '{IP_ADDR}'\n")
    for tool in ("getent", "ip"):
        if (bin_dir / tool).exists():
            (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    if not ip:
        env["PATH"] = f"{bin_dir}:{tmp_path / 'nothing'}"
        for tool in ("awk", "sh"):  # the rest of what the script needs, without `ip`
            (bin_dir / tool).symlink_to(f"/usr/bin/{tool}" if os.path.exists(f"/usr/bin/{tool}") else f"/bin/{tool}")
    done = subprocess.run(["/bin/sh", "-c", NETWORK_SCRIPT, "ddpctl-mpi-network", *nodes], capture_output=True,
                          text=True, env=env, timeout=30, check=True)
    return done.stdout.strip()


@pytest.mark.integration
def test_the_network_holding_every_other_node_is_named_by_its_subnet(tmp_path: Path) -> None:
    names = {"n1": "192.168.77.5", "n2": "192.168.70.9", "n3": "192.168.64.1"}
    assert network(tmp_path, names, "n1", "n2", "n3") == "192.168.64.0/20"


@pytest.mark.integration
def test_a_node_whose_own_name_is_loopback_here_is_judged_by_the_others(tmp_path: Path) -> None:
    assert network(tmp_path, {"n1": "127.0.1.1", "n2": "192.168.70.9"}, "n1", "n2") == "192.168.64.0/20"


@pytest.mark.integration
@pytest.mark.parametrize("names", [{"n1": "192.168.77.5", "n2": "10.9.0.3"},  # on no common network of this node's
                                   {"n1": "127.0.1.1"},  # nothing but loopback
                                   {}])  # names that do not resolve
def test_no_network_is_named_where_none_holds_the_nodes(tmp_path: Path, names: dict[str, str]) -> None:
    assert network(tmp_path, names, "n1", "n2") == ""


@pytest.mark.integration
def test_without_ip_nothing_is_named_and_open_mpi_chooses(tmp_path: Path) -> None:
    assert network(tmp_path, {"n1": "192.168.77.5", "n2": "192.168.70.9"}, "n1", "n2", ip=False) == ""


def test_the_mpi_job_gives_open_mpi_the_network_unless_the_user_set_one() -> None:
    spec = RunSpec(run_id="r", nnodes=2, nproc_per_node=2, launcher="mpirun", user_command=("python", "mp.py"))
    script = batch_script(SlurmJob(spec, SlurmRequest(nodes=2), "/runs/r", gpu_flag=None))
    run = (f"mpi_net=$(sh -c {shlex.quote(NETWORK_SCRIPT)} ddpctl-mpi-network "
           '$(scontrol show hostnames "$SLURM_JOB_NODELIST"))\nif [ -n "$mpi_net" ]; then\n'
           '  export OMPI_MCA_btl_tcp_if_include="${OMPI_MCA_btl_tcp_if_include:-$mpi_net}" '
           'OMPI_MCA_oob_tcp_if_include="${OMPI_MCA_oob_tcp_if_include:-$mpi_net}"\nfi\n')
    assert run in script
    assert script.index(run) < script.index("mpirun.sh")  # before mpirun starts
