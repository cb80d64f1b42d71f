"""`--launcher mpirun` on several hosts, as planned (pure): node 0's mpirun names the nodes' network by its subnet,
which means the same on every host whatever its interfaces are called, and gives every application context (one
per node) the user's --env and the DDPCTL_* variables."""

from __future__ import annotations

from launcher.planning.facts import HostAddress, HostFacts
from launcher.planning.mpi_plan import mpi_networks, mpi_nodes
from launcher.planning.plan import NodeHost, plan_remote
from launcher.spec.run_spec import RunSpec


def spec(**kwargs: object) -> RunSpec:
    fields: dict[str, object] = {"run_id": "exp1", "nnodes": 2, "nproc_per_node": 2, "launcher": "mpirun",
                                 "user_command": ("python3", "job.py"), **kwargs}
    return RunSpec(**fields)  # type: ignore[arg-type]


def facts(label: str, home: str, *addrs: tuple[str, str, int | None]) -> HostFacts:
    return HostFacts(label, home=home, addrs=tuple(HostAddress(i, a, p) for i, a, p in addrs))


HOSTS = [NodeHost("a@10.79.0.5", "10.79.0.5", "ens5"), NodeHost("b@10.79.0.6:2222", "10.79.0.6", "enp1s0")]
FACTS = (facts("a", "/home/a", ("lo", "127.0.0.1", 8), ("docker0", "172.17.0.1", 16), ("ens5", "10.79.0.5", 24)),
         facts("b", "/srv/b", ("lo", "127.0.0.1", 8), ("enp1s0", "10.79.0.6", 24)))


def mpirun_args(run: RunSpec, hosts: list[NodeHost] = HOSTS, found: tuple[HostFacts, ...] = FACTS) -> list[str]:
    nodes = mpi_nodes(run, plan_remote(run, hosts).nodes, found)
    command = list(nodes[0].command)
    return command[command.index("mpirun") + 1:]


def contexts(args: list[str]) -> list[list[str]]:
    """mpirun's application contexts (`A : B`), the global options before the first -np left out."""
    first = args.index("-np")
    out: list[list[str]] = [[]]
    for arg in args[first:]:
        if arg == ":":
            out.append([])
        else:
            out[-1].append(arg)
    return out


def test_hosts_with_differently_named_interfaces_get_their_subnet_not_the_names() -> None:
    args = mpirun_args(spec())
    include = [args[i + 2] for i, a in enumerate(args) if a == "--mca" and args[i + 1].endswith("_tcp_if_include")]
    assert include == ["10.79.0.0/24", "10.79.0.0/24"]  # btl and oob alike
    assert "ens5" not in " ".join(args) and "enp1s0" not in " ".join(args)


def test_every_application_context_gets_the_env_and_the_ddpctl_variables() -> None:
    run = spec(extra_env=(("FAIL_RANK", "3"), ("WANDB_API_KEY", "s3cret")), nnodes=3)
    hosts = [*HOSTS, NodeHost("c@10.80.1.9", "10.80.1.9", "eth0")]
    found = (*FACTS, facts("c", "/opt/c", ("eth0", "10.80.1.9", 16)))
    args = mpirun_args(run, hosts, found)
    assert "s3cret" not in " ".join(args)  # values come from mpirun's environment, never a command line
    per_node = contexts(args)
    assert len(per_node) == 3
    for index, (context, home) in enumerate(zip(per_node, ("/home/a", "/srv/b", "/opt/c"), strict=True)):
        exported = [context[i + 1] for i, a in enumerate(context) if a == "-x"]
        assert exported == ["PYTHONUNBUFFERED", "FAIL_RANK", "WANDB_API_KEY"], context
        told = context[context.index("env") + 1:]
        assert {"DDPCTL_NODE_RANK=" + str(index), "DDPCTL_NNODES=3", "DDPCTL_NPROC_PER_NODE=2",
                f"DDPCTL_OUTPUT_DIR={home}/.ddpctl/runs/exp1/out"} <= set(told), told
    assert args[args.index("btl_tcp_if_include") + 1] == "10.79.0.0/24,10.80.0.0/16"


def test_no_prefix_from_the_probe_counts_each_address_alone() -> None:
    """An older record or a dry run without a probe: each node's own address as /32 still matches only that
    host's interface, whatever its name."""
    assert mpi_networks(plan_remote(spec(), HOSTS).nodes, ()) == "10.79.0.5/32,10.79.0.6/32"
    older = tuple(facts(f.label, "/h", *((a.iface, a.addr, None) for a in f.addrs)) for f in FACTS)
    assert mpi_networks(plan_remote(spec(), HOSTS).nodes, older) == "10.79.0.5/32,10.79.0.6/32"


def test_host_names_without_addresses_fall_back_to_one_shared_interface_name_or_nothing() -> None:
    named = [NodeHost("gpu1", None, "eth0"), NodeHost("gpu2", None, "eth0")]
    assert mpi_networks(plan_remote(spec(), named).nodes, ()) == "eth0"
    differ = [NodeHost("gpu1", None, "eth0"), NodeHost("gpu2", None, "ens5")]
    assert mpi_networks(plan_remote(spec(), differ).nodes, ()) is None
    assert "btl_tcp_if_include" not in mpirun_args(spec(), differ, ())


def test_the_probes_prefix_survives_run_json() -> None:
    again = HostFacts.from_json(FACTS[0].to_json())
    assert again == FACTS[0] and again.addrs[2].prefix == 24
    old = FACTS[0].to_json()
    old["addrs"] = [{"iface": a["iface"], "addr": a["addr"]} for a in old["addrs"]]  # a record made before
    assert HostFacts.from_json(old).addrs[2] == HostAddress("ens5", "10.79.0.5", None)
