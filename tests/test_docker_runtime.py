"""The Docker runtime: the pure node plan, its wrapper run on the real local engine, and shipping images over SSH
to test-bed hosts that each have their own Docker engine."""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.testbed_docker import HostEngine, start_engine
from launcher.errors import DdpctlError, HostError
from launcher.planning.plan import NodeHost, NodePlan, plan_remote
from launcher.runtimes.docker import (
    RUN_SCRIPT,
    STOP_GRACE_SECONDS,
    DockerRuntime,
    container_name,
    docker_node_plan,
)
from launcher.runtimes.docker_hosts import ensure_image, host_docker_info, registry_digest
from launcher.runtimes.image import docker_client
from launcher.runtimes.native import stop_node
from launcher.runtimes.start import env_file, node_files, start_argv
from launcher.spec.run_spec import RunSpec
from launcher.spec.torchrun import NodeRole, torchrun_argv
from launcher.transport.parallel import raise_for_errors
from launcher.transport.ssh import CommandResult
from tests.docker_fixtures import REPO, base_image, requires_docker, test_image  # noqa: F401
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, connect

# ---- the pure plan -------------------------------------------------------------------------------------------


def test_docker_node_plan_wraps_the_native_torchrun_argv() -> None:
    spec = RunSpec(run_id="r1", nnodes=2, nproc_per_node=2, epochs=1, python="/opt/venv/bin/python",
                   extra_env=(("FOO", "bar baz"),))
    hosts = [NodeHost("h0", "10.0.0.2", "eth0"), NodeHost("h1", "10.0.0.3", "eth1")]
    plan = plan_remote(spec, hosts, runtime=DockerRuntime("ddpctl:1"))
    node = plan.nodes[1]
    assert (node.runtime, node.workspace, node.cwd) == ("docker", ".ddpctl/runs/r1", ".ddpctl/runs/r1")
    assert dict(node.env) == {"FOO": "bar baz", "GLOO_SOCKET_IFNAME": "eth1", "HOME": "/tmp",
                              "NCCL_SOCKET_IFNAME": "eth1", "PYTHONPATH": "/workspace/code", "PYTHONUNBUFFERED": "1",
                              "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    role = NodeRole(node_rank=1, out_dir="/workspace/out", log_dir="/workspace/logs", rdzv_addr="10.0.0.2",
                    local_addr="10.0.0.3", snapshot_dir="/workspace/out/snapshots",
                    wrapper="/workspace/ddpctl_torchrun.py")  # torchrun's wrapper, written in the workspace
    assert list(node.command) == [
        "sh", "-c", RUN_SCRIPT, "ddpctl-docker", ".ddpctl/runs/r1", "", "ddpctl-r1-n1", str(STOP_GRACE_SECONDS),
        "docker.env",
        "--init", "--label", "ddpctl.run=r1", "--label", "ddpctl.node=1", "--network", "host", "--ipc", "host",
        "-w", "/workspace",
        "ddpctl:1",
        *torchrun_argv(replace(spec, python="python3"), role),
    ]  # fmt: skip
    assert "--gpus" not in node.command


def test_a_container_gets_the_environment_a_native_node_gets() -> None:
    """What torchrun needs to restart safely (a fresh store per attempt) must not depend on the runtime."""
    spec = RunSpec(run_id="r3", nnodes=2, nproc_per_node=1, extra_env=(("NCCL_DEBUG", "INFO"),))
    hosts = [NodeHost("h0", "10.0.0.2", "eth0"), NodeHost("h1", "10.0.0.3", "eth0")]
    native = plan_remote(spec, hosts).nodes[1]
    docker = plan_remote(spec, hosts, runtime=DockerRuntime()).nodes[1]
    passed = set(env_file(docker)[1].decode().splitlines())
    assert {f"{key}={value}" for key, value in native.env} <= passed
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in passed


def test_gpus_data_dir_and_user_command() -> None:
    spec = RunSpec(run_id="r2", nnodes=1, nproc_per_node=1, data_dir="data/mnist", user_command=("python3", "my.py"))
    node = docker_node_plan(spec, 0, NodeHost("g", "10.0.0.9", gpus=True), "10.0.0.9", ".ddpctl/runs/r2", None)
    argv = list(node.command)
    assert argv[4:9] == [".ddpctl/runs/r2", "data/mnist", container_name("r2", 0), str(STOP_GRACE_SECONDS),
                         "docker.env"]
    assert argv[argv.index("--gpus") + 1] == "all"
    assert argv[argv.index("-w") + 1] == "/workspace/code"
    assert "ddpctl:latest" in argv  # the default image
    assert argv[-3:] == ["--no-python", "python3", "my.py"]
    assert "--standalone" in argv  # one node: no rendezvous address


def test_dry_run_shows_the_docker_run_line() -> None:
    spec = RunSpec(run_id="r3", nnodes=2, nproc_per_node=1, data_dir="/srv/data")
    hosts = [NodeHost("a", "10.0.0.2"), NodeHost("b", "10.0.0.3", gpus=True)]
    plan = plan_remote(spec, hosts, runtime=DockerRuntime("img:2"))
    lines = plan.describe().splitlines()
    assert lines[1] == "node 0 [a, docker]:"
    assert lines[2].startswith('  docker run -d --name ddpctl-r3-n0 --user "$(id -u):$(id -g)" '
                               '-v "$HOME/.ddpctl/runs/r3:/workspace" -v "/srv/data:/data" '
                               '--env-file "$HOME/.ddpctl/runs/r3/docker.env" --init ')
    assert "# docker.env: HOME=/tmp PYTHONPATH=/workspace/code PYTHONUNBUFFERED=1 " in lines[2]
    assert " img:2 python3 /workspace/ddpctl_torchrun.py --nnodes 2 --node-rank 0 " in lines[2]
    assert "--gpus all" in lines[4] and "--gpus" not in lines[2]
    assert RUN_SCRIPT not in plan.describe()


# ---- the wrapper on the real local engine ---------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _containers(run_id: str) -> str:
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=ddpctl.run={run_id}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _start(node: NodePlan, home: Path) -> subprocess.Popen[bytes]:
    """Run a node's command as the remote executor does: its files written (the environment file, torchrun's
    wrapper: launcher/runtimes/start.py's node_files), in its own session, from its workspace."""
    for name, data, mode in json.loads(node_files(node)):
        path = home / node.workspace / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        path.chmod(mode)
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    return subprocess.Popen(node.command, cwd=home / node.workspace, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@requires_docker
@pytest.mark.docker
def test_two_docker_nodes_train_on_the_local_engine(test_image: str, tmp_path: Path) -> None:  # noqa: F811
    sizes = ("--synthetic-train-size", "128", "--synthetic-test-size", "32")
    spec = RunSpec(run_id=f"dk-{secrets.token_hex(3)}", nnodes=2, nproc_per_node=1, epochs=1, backend="gloo",
                   rdzv_port=_free_port(), trainer_args=sizes)
    # Distinct addresses: c10d tells nodes apart by (address, pid), and torchrun has the same pid in both containers.
    hosts = [NodeHost("a", "127.0.0.1", "lo"), NodeHost("b", "127.0.0.2", "lo")]
    plan = plan_remote(spec, hosts, runtime=DockerRuntime(test_image))
    homes = [tmp_path / "home0", tmp_path / "home1"]
    for home, node in zip(homes, plan.nodes, strict=True):
        (home / node.workspace).mkdir(parents=True)
    # Node 0's shipped trainer leaves a mark: code in the workspace wins over the image's copy.
    code = homes[0] / plan.nodes[0].workspace / "code"
    shutil.copytree(REPO / "trainer", code / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    with (code / "trainer" / "__init__.py").open("a") as f:
        f.write("open('/workspace/out/shipped-code-ran', 'w').close()\n")
    procs = [_start(node, home) for home, node in zip(homes, plan.nodes, strict=True)]
    try:
        deadline = time.monotonic() + 180
        # A failed node leaves the other waiting in rendezvous: stop at the first failure.
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            assert time.monotonic() < deadline, "the nodes did not finish within 180 s"
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=60)
    outputs = [p.stdout.read().decode(errors="replace") if p.stdout else "" for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    out0 = homes[0] / plan.nodes[0].workspace / "out"
    summary = json.loads((out0 / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["nnodes"] == 2
    assert (out0 / "shipped-code-ran").exists()
    assert not (homes[1] / plan.nodes[1].workspace / "out" / "shipped-code-ran").exists()
    for home, node in zip(homes, plan.nodes, strict=True):
        assert list((home / node.workspace / "out" / "snapshots").glob("*.pt"))
        assert list((home / node.workspace / "logs").iterdir())  # torchrun's --log-dir
    assert _containers(spec.run_id) == ""  # removed once they ended


@requires_docker
@pytest.mark.docker
def test_the_wrapper_exits_with_the_container_and_stops_it_on_sigterm(test_image: str, tmp_path: Path) -> None:  # noqa: F811
    failing = RunSpec(run_id=f"dk-{secrets.token_hex(3)}", nnodes=1, nproc_per_node=1, user_command=("false",))
    node = docker_node_plan(failing, 0, NodeHost("a", "127.0.0.1"), "127.0.0.1", "ws", test_image)
    (tmp_path / "ws" / "code").mkdir(parents=True)
    proc = _start(node, tmp_path)
    out = proc.communicate(timeout=120)[0].decode(errors="replace")
    assert proc.returncode == 1, out[-2000:]  # torchrun's code for a failed worker
    assert _containers(failing.run_id) == ""

    sleeping = replace(failing, run_id=f"dk-{secrets.token_hex(3)}", user_command=("sleep", "300"))
    node = docker_node_plan(sleeping, 0, NodeHost("a", "127.0.0.1"), "127.0.0.1", "ws", test_image)
    proc = _start(node, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while "running" not in subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Status}}", container_name(sleeping.run_id, 0)],
                capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline and proc.poll() is None, "the container did not start"
            time.sleep(0.5)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # what `ddpctl down` does to a node's process group
        proc.wait(timeout=60)
        assert time.monotonic() - started < 40
        assert proc.returncode != 0
        assert _containers(sleeping.run_id) == ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["docker", "rm", "-f", container_name(sleeping.run_id, 0)], capture_output=True)


class _ThisMachine:
    """stop_node's connection to a host whose home is `home`: what would run over SSH runs here."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home)}
        done = subprocess.run(argv, cwd=self.home, env=env, capture_output=True, timeout=timeout, input=stdin or b"")
        out, err = (stream.decode(errors="replace") for stream in (done.stdout, done.stderr))
        return CommandResult(done.returncode, out, err)


@requires_docker
@pytest.mark.docker
def test_stopping_a_docker_node_lets_its_wrapper_remove_the_container(test_image: str, tmp_path: Path) -> None:  # noqa: F811
    """A container slow to stop (its worker ignores SIGTERM, torchrun waits 30 s for it) takes docker stop's whole
    grace: stopping the node (what `ddpctl down` runs on the host) must leave the wrapper the time to finish
    that stop and remove the container, instead of killing it mid-stop."""
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open('/workspace/out/up', 'w').close(); time.sleep(600)")
    spec = RunSpec(run_id=f"dk-{secrets.token_hex(3)}", nnodes=1, nproc_per_node=1,
                   user_command=("python3", "-c", stubborn))
    node = docker_node_plan(spec, 0, NodeHost("a", "127.0.0.1"), "127.0.0.1", "ws", test_image)
    (tmp_path / "ws" / "code").mkdir(parents=True)
    for name, data, mode in json.loads(node_files(node)):  # what start_node writes first
        path = tmp_path / "ws" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        path.chmod(mode)
    host = _ThisMachine(tmp_path)
    started = host.run(start_argv(node), timeout=30)
    assert started.exit_code == 0, started.stderr
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "ws" / "out" / "up").exists():
            assert time.monotonic() < deadline, (tmp_path / "ws" / "torchrun.out").read_text()[-2000:]
            time.sleep(0.5)
        began = time.monotonic()
        stop_node(host, "ws")
        took = time.monotonic() - began
        assert took >= STOP_GRACE_SECONDS, "the container stopped early: this test needs one that takes its grace"
        assert _containers(spec.run_id) == "", f"the container outlived the stop ({took:.0f} s)"
    finally:
        subprocess.run(["docker", "rm", "-f", container_name(spec.run_id, 0)], capture_output=True)


# ---- images shipped over SSH to hosts with their own engines --------------------------------------------------

@dataclass
class DockerBed:
    bed: Testbed
    engines: list[HostEngine]  # of hosts 0 and 1 (1 registers a runtime named nvidia); host 2 has no engine
    registry: str  # HOST:PORT of a real registry on the bed's bridge, trusted over HTTP by the hosts' engines


@pytest.fixture(scope="module")
def docker_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerBed]:
    """Three SSH hosts; hosts 0 and 1 have a Docker engine each, host 2 has none; a registry beside them."""
    if TESTBED_UNAVAILABLE:
        pytest.skip(TESTBED_SKIP_REASON)
    registry_binary = shutil.which("docker-registry")
    if registry_binary is None:
        pytest.skip("docker-registry is not installed: run `bash infra/setup.sh --test`")
    cleanup_stale("ddptd")
    bed = Testbed("ddptd", n_hosts=3, ports=[22, 22, 22])
    engines: list[HostEngine] = []
    registry_proc = None
    try:
        registry = f"{bed.state.bridge_address}:{_free_port()}"
        root = tmp_path_factory.mktemp("registry")
        (root / "config.yml").write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                                         f"http:\n  addr: {registry}\n")
        registry_proc = subprocess.Popen([registry_binary, "serve", str(root / "config.yml")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        engines = [start_engine(host, insecure_registries=(registry,), extra_runtimes=runtimes)
                   for host, runtimes in zip(bed.hosts[:2], [(), ("nvidia",)], strict=True)]
        yield DockerBed(bed, engines, registry)
    finally:
        for engine in engines:
            engine.stop()
        if registry_proc is not None:
            registry_proc.terminate()
            registry_proc.wait(timeout=10)
        bed.stop()


def _small_image(tag: str, size: int = 2 << 20) -> str:
    """A real image of `size` random bytes (incompressible, so bytes on the wire are meaningful); its ID."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        payload = os.urandom(size)
        info = tarfile.TarInfo("payload.bin")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    subprocess.run(["docker", "import", "-", tag], input=data.getvalue(), check=True, capture_output=True)
    return str(docker_client().images.get(tag).id)


@pytest.fixture
def small_image() -> Iterator[tuple[str, str]]:
    tag = f"ddpctl-ship:{uuid.uuid4().hex[:8]}"
    image_id = _small_image(tag)
    try:
        yield tag, image_id
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


@requires_docker
@pytest.mark.docker
def test_image_ships_to_two_hosts_once_and_replaces_a_different_one(docker_bed: DockerBed,
                                                                     small_image: tuple[str, str]) -> None:
    bed, engines = docker_bed.bed, docker_bed.engines
    tag, image_id = small_image
    conns = [connect(bed, host) for host in bed.hosts[:2]]
    try:
        info = host_docker_info(conns[0], tag)
        assert info.has_engine and not info.nvidia_runtime and info.image_id is None
        assert host_docker_info(conns[1], tag).nvidia_runtime  # --gpus all goes to this host's container only

        first = raise_for_errors(ensure_image(conns, tag, docker_client(), show_progress=False), "ship")
        assert all(r.bytes_sent > 2 << 20 and not r.skipped and not r.replaced for r in first)
        for engine in engines:
            assert engine.docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.decode().strip() == image_id

        again = raise_for_errors(ensure_image(conns, tag, docker_client(), show_progress=False), "ship")
        assert [(r.bytes_sent, r.skipped) for r in again] == [(0, True), (0, True)]

        # Host 1 gets another image under our name: it must be replaced, not reused.
        other = f"ddpctl-other:{uuid.uuid4().hex[:8]}"
        other_id = _small_image(other, 1 << 10)
        try:
            saved = subprocess.run(["docker", "save", other], capture_output=True, check=True).stdout
            engines[1].docker("load", "-q", input=saved)
            engines[1].docker("tag", other, tag)
            engines[1].docker("image", "rm", other)
        finally:
            subprocess.run(["docker", "image", "rm", "-f", other], capture_output=True)
        assert host_docker_info(conns[1], tag).image_id == other_id
        third = raise_for_errors(ensure_image(conns, tag, docker_client(), show_progress=False), "ship")
        assert third[0].skipped and third[0].bytes_sent == 0
        assert third[1].replaced and third[1].bytes_sent > 2 << 20
        assert engines[1].docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.decode().strip() == image_id
        assert engines[1].docker("image", "inspect", other_id, check=False).returncode != 0  # old one removed
    finally:
        for conn in conns:
            conn.close()
        for engine in engines:
            engine.docker("image", "rm", "-f", tag, check=False)


@requires_docker
@pytest.mark.docker
def test_a_host_without_docker_is_named_in_one_line(docker_bed: DockerBed, small_image: tuple[str, str]) -> None:
    bed, engines = docker_bed.bed, docker_bed.engines
    tag, _ = small_image
    conns = [connect(bed, bed.hosts[0]), connect(bed, bed.hosts[2])]
    try:
        outcomes = ensure_image(conns, tag, docker_client(), show_progress=False)
        assert outcomes[0].ok and outcomes[0].value is not None and outcomes[0].value.bytes_sent > 0
        assert isinstance(outcomes[1].error, HostError) and outcomes[1].error.host == conns[1].label
        with pytest.raises(DdpctlError) as err:
            raise_for_errors(outcomes, "ship the image")
        lines = str(err.value).splitlines()
        assert len(lines) == 2 and lines[1].startswith(f"  {conns[1].label}: no usable Docker engine")
        assert "--runtime native" in lines[1]
    finally:
        for conn in conns:
            conn.close()
        engines[0].docker("image", "rm", "-f", tag, check=False)


@requires_docker
@pytest.mark.docker
def test_with_a_registry_hosts_pull_the_image(docker_bed: DockerBed, small_image: tuple[str, str]) -> None:
    bed, engines = docker_bed.bed, docker_bed.engines
    tag, image_id = small_image
    ref = f"{docker_bed.registry}/team/{tag}"
    # The registry gets the image from host 0's engine (ours does not trust it over HTTP); we know it by ref.
    subprocess.run(["docker", "tag", tag, ref], check=True, capture_output=True)
    conns = [connect(bed, host) for host in bed.hosts[:2]]
    try:
        raise_for_errors(ensure_image(conns[:1], tag, docker_client(), show_progress=False), "ship")
        engines[0].docker("tag", tag, ref)
        engines[0].docker("push", ref)
        pulled = raise_for_errors(ensure_image(conns[1:], ref, docker_client(), pull=True, show_progress=False),
                                  "pull")
        assert pulled[0].pulled and pulled[0].bytes_sent == 0 and not pulled[0].skipped
        assert engines[1].docker("image", "inspect", "-f", "{{.Id}}", ref).stdout.decode().strip() == image_id
        assert pulled[0].image_id == image_id
        pushed = engines[0].docker("image", "inspect", "-f", "{{index .RepoDigests 0}}", ref).stdout.decode().strip()
        assert pushed.startswith(ref.rpartition(":")[0] + "@sha256:")
        assert registry_digest(ref, pulled[0].repo_digests) == pushed.partition("@")[2], "the digest pushed"
        again = raise_for_errors(ensure_image(conns[1:], ref, docker_client(), pull=True, show_progress=False),
                                 "pull")
        assert again[0].skipped
        missing = ensure_image(conns[1:], f"{docker_bed.registry}/team/nothing:here", None, pull=True,
                               show_progress=False)
        assert isinstance(missing[0].error, HostError) and "docker pull" in str(missing[0].error)
    finally:
        for conn in conns:
            conn.close()
        subprocess.run(["docker", "image", "rm", ref], capture_output=True)
        for engine in engines:
            engine.docker("image", "rm", "-f", tag, ref, check=False)


@requires_docker
@pytest.mark.docker
def test_a_missing_local_image_says_how_to_build_it() -> None:
    with pytest.raises(DdpctlError, match="ddpctl image build"):
        ensure_image([], "ddpctl-no-such:image", docker_client())
