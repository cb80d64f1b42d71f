"""The pure seams: RunSpec validation, torchrun's argv, and the plan (what each node runs)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.planning.plan import NodeHost, NodePlan, plan_local, plan_remote
from launcher.runtimes.native import read_state, stop_node
from launcher.runtimes.start import env_file, start_argv
from launcher.spec.hosts import parse_host, parse_hosts
from launcher.spec.run_spec import RunSpec, check_name, new_run_id
from launcher.spec.torchrun import TORCHRUN_SOURCE, NodeRole, torchrun_argv
from launcher.transport.ssh import CommandResult


def test_torchrun_argv_multinode_node1() -> None:
    spec = RunSpec(run_id="exp1", nnodes=2, nproc_per_node=2, max_restarts=1, epochs=2, lr=0.05, seed=7)
    role = NodeRole(node_rank=1, out_dir="out", log_dir="logs", rdzv_addr="10.0.0.5", local_addr="10.0.0.6",
                    snapshot_dir="out/snapshots")
    assert torchrun_argv(spec, role) == [
        "python3", "-c", TORCHRUN_SOURCE,
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.5:29400",
        "--rdzv-id", "exp1", "--rdzv-conf", "is_host=0", "--local-addr", "10.0.0.6",
        "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", "logs", "--redirects", "3", "--tee", "1",
        "-m", "trainer", "--model", "mnist-cnn", "--dataset", "synthetic", "--epochs", "2", "--batch-size", "32",
        "--lr", "0.05", "--save-every", "1", "--seed", "7", "--backend", "auto", "--out-dir", "out",
        "--snapshot-dir", "out/snapshots",
    ]  # fmt: skip


def test_torchrun_argv_node0_hosts_store_and_ipv6_endpoint() -> None:
    spec = RunSpec(run_id="exp1", nnodes=3)
    argv = torchrun_argv(spec, NodeRole(node_rank=0, out_dir="o", log_dir="l", rdzv_addr="fd00::1"))
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=1"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd00::1]:29400"


def test_torchrun_argv_standalone_and_user_command() -> None:
    spec = RunSpec(run_id="r", nproc_per_node=4, user_command=("python", "my train.py", "--x", "$(id)"))
    argv = torchrun_argv(spec, NodeRole(node_rank=0, out_dir="/o", log_dir="/o/logs"))
    assert argv[3:6] == ["--standalone", "--nnodes", "1"]
    # `python` is the node's interpreter, the one running torchrun (spec.python)
    assert argv[argv.index("--no-python") + 1:] == [spec.python, "my train.py", "--x", "$(id)"]


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 0}, "--epochs must be an integer >= 1"),
    ({"batch_size": 0}, "--batch-size must be an integer >= 1"),
    ({"model": "vgg"}, "unknown model 'vgg'"),
    ({"dataset": "imagenet"}, "unknown data set 'imagenet'"),
    ({"nproc_per_node": 0}, "--gpus must be an integer >= 1"),
    ({"lr": 0.0}, "--lr must be positive"),
    ({"lr": float("inf")}, "--lr must be positive and finite, got inf"),
    ({"lr": float("nan")}, "--lr must be positive and finite, got nan"),
    ({"rdzv_port": 0}, "--rdzv-port must be between 1024 and 65535, got 0"),
    ({"python": ""}, "--python '' names no interpreter"),
    ({"python": " python3"}, "--python ' python3' names no interpreter"),
    ({"backend": "mpi"}, "unknown backend"),
    ({"run_id": "a/b"}, "is not a valid name"),
    ({"run_id": ".."}, "is not a valid name"),
])  # fmt: skip
def test_spec_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        RunSpec(**{"run_id": "ok", **kwargs})


def test_spec_round_trips_through_json_without_env_values() -> None:
    spec = RunSpec(run_id="r1", user_command=("a", "b"), trainer_args=("--x", "1"),
                   extra_env=(("HF_TOKEN", "hf_secret"), ("K", "v")))
    data = spec.to_json()
    assert data["extra_env"] == {"HF_TOKEN": "***", "K": "***"}
    back = RunSpec.from_json(data)
    assert back.to_json() == data
    assert replace(back, extra_env=spec.extra_env, withheld_env=()) == spec
    # A spec read back cannot be run as if its values were "***": it names what to give again.
    with pytest.raises(SpecError, match=r"^the values of --env HF_TOKEN, K were not stored .*--env NAME=VALUE"):
        plan_remote(back, [NodeHost("h", "10.0.0.2")])


def test_run_ids_are_safe_and_unique() -> None:
    # Five draws in the same second: 4 random hex digits make a collision 1 in ~6,500 (20 draws made it 1 in 340,
    # and it was seen); RunDir.create refuses an existing id, so a real collision is an error, never an overwrite.
    ids = {new_run_id(None, "mnist-cnn", "synthetic") for _ in range(5)}
    assert len(ids) == 5
    assert all(i.startswith("mnist-cnn-synthetic-") for i in ids)
    with pytest.raises(SpecError):
        new_run_id("bad name", "m", "d")


@pytest.mark.parametrize("command, stem", [
    (("python", "multinode.py", "50", "10"), "multinode"),  # the PyTorch DDP tutorial's script
    (("python3", "-u", "examples/train_cifar.py", "--epochs", "1"), "train_cifar"),
    (("python", "-m", "mypkg.train", "--lr", "0.1"), "train"),
    (("./run experiment.sh",), "run-experiment.sh"),
    (("bash", "-c", "echo hi"), "bash"),
])
def test_a_command_run_is_named_after_its_script(command: tuple[str, ...], stem: str) -> None:
    run_id = new_run_id(None, "mnist-cnn", "synthetic", command)
    assert run_id.startswith(stem + "-") and check_name(run_id) == run_id
    assert run_id[len(stem) + 1:].count("-") == 2  # NAME-YYYYmmdd-HHMMSS-xxxx
    assert new_run_id("mine", "mnist-cnn", "synthetic", command).startswith("mine-")  # --name still wins


@pytest.mark.parametrize("text, user, host, port", [
    ("gpu2", None, "gpu2", None),
    ("alice@10.0.0.5", "alice", "10.0.0.5", None),
    ("root@1.2.3.4:22022", "root", "1.2.3.4", 22022),
    ("bob@[fd00::2]:2222", "bob", "fd00::2", 2222),
])  # fmt: skip
def test_parse_host(text: str, user: str | None, host: str, port: int | None) -> None:
    parsed = parse_host(text)
    assert (parsed.user, parsed.hostname, parsed.port) == (user, host, port)


@pytest.mark.parametrize("text", ["", "a b", "-oProxyCommand=x", "host:99999", "u@h;rm", " h", "h ", "h\n",
                                  "u@-oProxyJump", "-h:22"])
def test_parse_host_rejects(text: str) -> None:
    with pytest.raises(SpecError):
        parse_host(text)


@pytest.mark.parametrize("texts, message", [
    (["a", "a"], "--host 'a' is given twice"),
    (["u@a:2222", "b", "u@A:2222"], "--host 'u@a:2222' and --host 'u@A:2222' are the same host"),
])  # fmt: skip
def test_parse_hosts_refuses_one_host_twice(texts: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_hosts(texts)


def test_parse_hosts_keeps_hosts_that_differ_in_user_or_port() -> None:
    hosts = parse_hosts(["a", "u@a", "a:2222", "b"])
    assert [h.text for h in hosts] == ["a", "u@a", "a:2222", "b"]


def test_new_run_id_refuses_an_empty_name() -> None:
    with pytest.raises(SpecError, match="--name '' is not a valid name"):
        new_run_id("", "mnist-cnn", "synthetic")


def test_plan_remote_gives_each_node_its_address_and_interface() -> None:
    spec = RunSpec(run_id="r2", nnodes=2, nproc_per_node=2)
    hosts = [NodeHost("a", "10.1.0.2", "eth0"), NodeHost("b", "10.1.0.3", "eth1")]
    plan = plan_remote(spec, hosts)
    node1 = plan.nodes[1]
    assert node1.workspace == ".ddpctl/runs/r2"
    assert dict(node1.env)["GLOO_SOCKET_IFNAME"] == "eth1"
    assert dict(node1.env)["NCCL_SOCKET_IFNAME"] == "eth1"
    assert "--local-addr" in node1.command and node1.command[node1.command.index("--local-addr") + 1] == "10.1.0.3"
    assert node1.command[node1.command.index("--rdzv-endpoint") + 1] == "10.1.0.2:29400"
    assert "node 1 [b, native]" in plan.describe()


def test_plan_local_writes_into_the_run_directory() -> None:
    plan = plan_local(RunSpec(run_id="r3"), "/runs/r3", cwd="/home/me")
    node = plan.nodes[0]
    assert node.cwd == "/home/me"
    assert node.command[node.command.index("--out-dir") + 1] == "/runs/r3"
    assert node.command[node.command.index("--log-dir") + 1] == "/runs/r3/logs"


def test_detach_script_passes_hostile_arguments_intact(tmp_path: Path) -> None:
    """The start command, quoted once and run by a shell as sshd would, runs exactly our argv."""
    home = tmp_path
    (home / "ws" / "code").mkdir(parents=True)
    marker = tmp_path / "pwned"
    hostile = f"x'; touch {marker}; echo \"$(touch {marker})\" `touch {marker}`"
    value = hostile + "\nline 2 \\n \\0101 %s \\"  # a newline, and backslashes printf %b would take
    probe = "import json,os,sys; print(json.dumps([sys.argv[1:], os.environ['K'], os.getcwd()]))"
    plan = plan_remote(RunSpec(run_id="r4", nnodes=1, extra_env=(("K", value),)), [NodeHost("h", "127.0.0.1")])
    node = replace(plan.nodes[0], workspace="ws", command=(sys.executable, "-c", probe, hostile, "a b"), cwd="ws")
    assert value not in " ".join(start_argv(node))
    env = {**os.environ, "HOME": str(home)}
    started = _start_locally(node, home, env)
    assert started.stdout.strip().isdigit()
    for _ in range(600):  # up to 30 s on a loaded machine
        if (home / "ws" / "exit_code").exists():
            break
        time.sleep(0.05)
    assert (home / "ws" / "exit_code").read_text().strip() == "0"
    import json

    argv, k, cwd = json.loads((home / "ws" / "torchrun.out").read_text())
    assert argv == [hostile, "a b"] and k == value and cwd == str(home / "ws")
    assert not marker.exists()
    assert not (home / "ws" / env_file(node)[0]).exists(), "the environment file is deleted once read"
    state = read_state(_HereAt(home), "ws", python=sys.executable)
    assert (state.pid, state.exit_code) == (int(started.stdout), 0)


def test_stop_kills_workers_that_left_the_process_group(tmp_path: Path) -> None:
    """torchrun puts each worker in a session of its own; a stop must still end them all."""
    home = tmp_path
    (home / "ws" / "code").mkdir(parents=True)
    # A "torchrun" that ignores SIGTERM and starts a "worker" in a new session that ignores it too.
    agent = ("import signal, subprocess, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "w = subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, "
             "signal.SIG_IGN); open(\"worker.pid\",\"w\").write(str(__import__(\"os\").getpid())); time.sleep(600)'],"
             " start_new_session=True)\n"
             "time.sleep(600)\n")
    plan = plan_remote(RunSpec(run_id="r5", nnodes=1), [NodeHost("h", "127.0.0.1")])
    node = replace(plan.nodes[0], workspace="ws", command=(sys.executable, "-c", agent), cwd="ws")
    env = {**os.environ, "HOME": str(home)}
    _start_locally(node, home, env)
    for _ in range(600):  # up to 30 s on a loaded machine
        if (home / "ws" / "worker.pid").exists() and (home / "ws" / "worker.pid").read_text():
            break
        time.sleep(0.05)
    worker = int((home / "ws" / "worker.pid").read_text())
    agent_pid = int((home / "ws" / "pid").read_text())
    stop_node(_HereAt(home), "ws", sys.executable, grace_seconds=1)

    def gone(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        return state == "Z"

    assert gone(worker) and gone(agent_pid)
    assert (home / "ws" / "exit_code").read_text().strip() == "143"


class _HereAt:
    """A connection that runs argv on this machine, in `home` as the user's home (as sshd would on a host)."""

    label = "here"

    def __init__(self, home: Path) -> None:
        self.home = home

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        done = subprocess.run(["sh", "-c", shlex.join(argv)], cwd=self.home, env={**os.environ, "HOME": str(self.home)},
                              capture_output=True, timeout=timeout, input=stdin or b"")
        out, err = (stream.decode(errors="replace") for stream in (done.stdout, done.stderr))
        return CommandResult(done.returncode, out, err)


def _start_locally(node: NodePlan, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """What start_node does over SSH, on this machine: the environment file, then the start command, quoted
    once and run by a shell as sshd would."""
    name, data = env_file(node)
    (home / node.workspace / name).write_bytes(data)
    return subprocess.run(["sh", "-c", shlex.join(start_argv(node, sys.executable))], cwd=home, env=env,
                          capture_output=True, text=True, check=True)


def test_a_public_address_anywhere_is_refused_unless_allowed() -> None:
    """torchrun's stores listen on every address of a node, so any node's own public address counts, not
    only the rendezvous address: an IPv4 or IPv6 global address on any interface of any node."""
    from launcher.errors import DdpctlError
    from launcher.planning.facts import HostAddress, HostFacts
    from launcher.planning.preflight import check_public_rendezvous

    def host(label: str, *addrs: str) -> HostFacts:
        return HostFacts(label, addrs=tuple(HostAddress(f"eth{i}", a) for i, a in enumerate(addrs)))

    private = [host("n0", "127.0.0.1", "10.231.1.2", "fe80::1"), host("n1", "10.231.1.3", "fd00::3")]
    check_public_rendezvous("10.231.1.2", private, allow_public=False)
    check_public_rendezvous("gpu-box", private, allow_public=False)  # a name: the nodes' addresses are judged
    for addr, facts, named in (
        ("8.8.8.8", private, "8.8.8.8 (the rendezvous address)"),
        ("10.231.1.2", [private[0], host("n1", "10.231.1.3", "1.2.3.4")], "1.2.3.4 on n1"),
        ("10.231.1.2", [host("n0", "10.231.1.2", "2001:4860::1"), private[1]], "2001:4860::1 on n0"),
    ):
        with pytest.raises(DdpctlError, match="--allow-public-rendezvous") as refused:
            check_public_rendezvous(addr, facts, allow_public=False)
        assert named in str(refused.value)
        check_public_rendezvous(addr, facts, allow_public=True)
