"""`ddpctl up --runtime docker` on SSH test-bed hosts that each run their own Docker engine: the image really
travels over SSH, and `--network host` containers really sit on each host's address."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.testbed_docker import HostEngine, start_engine
from infra.testbed_host import shared_python_env
from launcher.spec.hosts import parse_host
from tests.cli_runner import ddpctl_on_bed
from tests.docker_fixtures import base_image, requires_docker, test_image  # noqa: F401
from tests.place_contract import keeps_the_contract
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, comparable_plan

pytestmark = [pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON), requires_docker,
              pytest.mark.docker]
SMALL = ["--synthetic-train-size", "1024", "--synthetic-test-size", "256"]


@pytest.fixture(scope="module")
def docker_hosts() -> Iterator[tuple[Testbed, list[HostEngine]]]:
    """Three hosts without torch; the first two have a Docker engine of their own, the third none."""
    cleanup_stale("ddpdk")
    bed = Testbed("ddpdk", n_hosts=3)
    engines: list[HostEngine] = []
    try:
        engines = [start_engine(host) for host in bed.hosts[:2]]
        yield bed, engines
    finally:
        for engine in engines:
            engine.stop()
        bed.stop()


def ddpctl(bed: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    return ddpctl_on_bed(bed, *args, timeout=420)


def image_events(run: Path) -> list[dict]:
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "image"]


def test_docker_runtime_trains_on_two_hosts_and_ships_the_image_once(
        docker_hosts: tuple[Testbed, list[HostEngine]], test_image: str, tmp_path: Path) -> None:  # noqa: F811
    bed, engines = docker_hosts
    hosts = [arg for h in bed.hosts[:2] for arg in ("--host", h.spec)]
    first = ddpctl(bed, "up", "--runtime", "docker", "--image", test_image, *hosts, "--gpus", "1", "--epochs", "2",
                   "--runs-dir", str(tmp_path / "a"), "--json", *SMALL)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    run = Path(out["run_dir"])
    assert out["summary"]["world_size"] == 2 and out["summary"]["epochs"] == 2
    shipped = image_events(run)
    assert len(shipped) == 2 and all(e["bytes_sent"] > 10_000_000 and not e["skipped"] for e in shipped)
    local_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", test_image],
                              capture_output=True, text=True, check=True).stdout.strip()
    for engine in engines:
        remote_id = engine.docker("image", "inspect", "--format", "{{.Id}}", test_image).stdout.decode().strip()
        assert remote_id == local_id
        assert engine.docker("ps", "-aq", "--filter", f"label=ddpctl.run={run.name}").stdout.strip() == b""
    record = json.loads((run / "run.json").read_text())
    assert record["image_id"] == local_id, "run.json names the image the nodes ran"
    assert "image_digest" not in record  # streamed, not pulled from a registry
    assert [e["image_id"] for e in shipped] == [local_id, local_id]
    for k in (0, 1):
        assert list((run / "nodes" / str(k) / "out" / "snapshots").iterdir())

    second = ddpctl(bed, "up", "--runtime", "docker", "--image", test_image, *hosts, "--gpus", "1",
                    "--epochs", "1", "--runs-dir", str(tmp_path / "b"), "--json", *SMALL,
                    "--max-restarts", "1", "--trainer-arg=--fault-kill", "--trainer-arg=1:5")
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["summary"]["restarts"] == 1, "a worker killed inside its container is restarted by torchrun"
    assert [e["bytes_sent"] for e in image_events(Path(out["run_dir"]))] == [0, 0]
    assert json.loads((Path(out["run_dir"]) / "run.json").read_text())["image_id"] == local_id  # skipped: same ID


@pytest.mark.parametrize("runtime", ["docker", "auto"])
def test_the_dry_run_plan_is_the_docker_plan_that_runs(docker_hosts: tuple[Testbed, list[HostEngine]],
                                                       test_image: str, tmp_path: Path,  # noqa: F811
                                                       runtime: str) -> None:
    """Both hosts have an engine (and no torch of their own): auto is docker, decided by the dry run's probe
    exactly as by the run's, with the process count and rendezvous port the hosts gave. The plan of `--runtime
    docker` is checked by its dry run; `auto`, whose plan is that same docker plan, also runs it."""
    bed, _ = docker_hosts
    hosts = [arg for h in bed.hosts[:2] for arg in ("--host", h.spec)]
    args = ["--runtime", runtime, "--image", test_image, *hosts, "--epochs", "1", *SMALL]
    dry = ddpctl(bed, "up", *args, "--runs-dir", str(tmp_path / "dry"), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["runtime"] == "docker" and planned["image"] == test_image and planned["unknown"] == []
    assert all(n["runtime"] == "docker" for n in planned["nodes"]) and planned["nproc_per_node"] == 2
    assert [f["torch"] for f in planned["node_facts"]] == [None, None]  # the image brings torch
    if runtime == "docker":
        return  # the same docker plan runs in the `auto` case (and in the tests above)
    ran = ddpctl(bed, "up", *args, "--runs-dir", str(tmp_path / "runs"), "--json")
    assert ran.returncode == 0, ran.stderr
    run = Path(json.loads(ran.stdout)["run_dir"])
    assert comparable_plan(json.loads((run / "plan.json").read_text())) == comparable_plan(planned)
    assert json.loads((run / "run.json").read_text())["runtime"] == "docker"


def test_a_host_without_docker_is_named_in_one_line(docker_hosts: tuple[Testbed, list[HostEngine]],
                                                     tmp_path: Path) -> None:
    bed, _ = docker_hosts
    result = ddpctl(bed, "up", "--runtime", "docker", "--host", bed.hosts[0].spec, "--host", bed.hosts[2].spec,
                    "--runs-dir", str(tmp_path), *SMALL)
    assert result.returncode == 1
    assert bed.hosts[2].spec in result.stderr and "no usable Docker engine" in result.stderr
    assert bed.hosts[0].spec not in result.stderr
    assert not any(tmp_path.iterdir())


def test_docker_runs_where_the_hosts_own_torch_differs(docker_hosts: tuple[Testbed, list[HostEngine]],
                                                        test_image: str, tmp_path: Path) -> None:  # noqa: F811
    """The container brings its own python and torch, so preflight compares the hosts' only for --runtime native:
    host 0 has no torch (Debian's python3), host 1 this machine's python with torch."""
    bed, _ = docker_hosts
    with_torch = bed.hosts[1]
    saved = with_torch.ssh_environment()
    with_torch.update_ssh_environment(shared_python_env())
    try:
        hosts = [arg for h in bed.hosts[:2] for arg in ("--host", h.spec)]
        native = ddpctl(bed, "up", *hosts, "--gpus", "1", "--epochs", "1", "--runs-dir", str(tmp_path / "n"), *SMALL)
        assert native.returncode == 1
        assert "preflight failed" in native.stderr and "torch" in native.stderr
        docker = ddpctl(bed, "up", "--runtime", "docker", "--image", test_image, *hosts, "--gpus", "1",
                        "--epochs", "1", "--runs-dir", str(tmp_path / "d"), "--json", *SMALL)
        assert docker.returncode == 0, docker.stderr
        assert json.loads(docker.stdout)["summary"]["world_size"] == 2
    finally:
        with_torch.set_ssh_environment(saved)


def test_docker_hosts_keep_the_places_contract(docker_hosts: tuple[Testbed, list[HostEngine]],
                                               test_image: str, tmp_path: Path,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The contract every place keeps (tests/place_contract.py) on two SSH hosts with the Docker runtime (last in
    this module: the hosts' engines hold the image by then), and no container of its runs left on either engine."""
    bed, engines = docker_hosts
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCTL_KNOWN_HOSTS", str(bed.known_hosts_path))
    on_bed = tuple(arg for h in bed.hosts[:2] for arg in ("--host", h.spec))
    keeps_the_contract("ssh", tmp_path, capsys, bed, hosts=tuple(parse_host(h.spec) for h in bed.hosts[:2]),
                             extra={"runtime": "docker", "image": test_image},
                             stall_args=(*on_bed, "-i", bed.client_key_path, "--gpus", "1", "--runtime", "docker",
                                         "--image", test_image))
    for engine in engines:
        assert engine.docker("ps", "-aq", "--filter", "label=ddpctl.run").stdout.strip() == b""  # of either run
