"""compose.yaml: a 2-node DDP cluster on the real Docker engine with docker-compose (gloo, synthetic data)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker_fixtures import REPO, base_image, requires_docker  # noqa: F401

COMPOSE_FILE = REPO / "compose.yaml"


def compose_works(command: tuple[str, ...]) -> bool:
    if shutil.which(command[0]) is None:
        return False
    return subprocess.run([*command, "version"], capture_output=True, timeout=60).returncode == 0


def compose_variant(command: tuple[str, ...], name: str) -> Any:
    reason = f"`{' '.join(command)}` does not work here: run `bash infra/setup.sh --test`"
    return pytest.param(command, id=name, marks=pytest.mark.skipif(not compose_works(command), reason=reason))


# Compose v2 (`docker compose`) is what users have; Debian's docker-compose 1.29 is what many CI machines have.
COMPOSES = [compose_variant(("docker-compose",), "v1"), compose_variant(("docker", "compose"), "v2")]


def test_compose_file_is_portable_and_publishes_no_port() -> None:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert "version" not in data  # Compose v2 warns about it; the Compose spec has none
    assert set(data["services"]) == {"node0", "node1"}
    for name, service in data["services"].items():
        assert "ports" not in service, f"{name} publishes a port: the c10d store has no authentication"
        assert service["build"]["args"]["BASE_IMAGE"].startswith("${BASE_IMAGE:-pytorch/pytorch:")
    assert data["services"]["node0"]["environment"]["IS_HOST"] == "1"
    assert data["services"]["node1"]["environment"]["IS_HOST"] == "0"


@requires_docker
@pytest.mark.docker
@pytest.mark.parametrize("compose_command", COMPOSES)
def test_two_nodes_train_to_the_end_and_leave_nothing_behind(compose_command: tuple[str, ...], base_image: str,  # noqa: F811
                                                             tmp_path: Path) -> None:
    project = f"ddpctl-test-{uuid.uuid4().hex[:8]}"
    nproc = 2
    env = {
        **os.environ,
        "BASE_IMAGE": base_image,
        "DDPCTL_RUNS_DIR": str(tmp_path),
        "EPOCHS": "2",
        "NPROC_PER_NODE": str(nproc),
        "SYNTHETIC_TRAIN_SIZE": "256",
        "SYNTHETIC_TEST_SIZE": "64",
        "BATCH_SIZE": "16",
    }
    compose = [*compose_command, "-f", str(COMPOSE_FILE), "-p", project]
    try:
        config = subprocess.run([*compose, "config"], env=env, capture_output=True, text=True, timeout=60)
        assert config.returncode == 0, config.stderr
        up = subprocess.run([*compose, "up", "--build", "--abort-on-container-exit", "--exit-code-from", "node0"],
                            env=env, capture_output=True, text=True, timeout=480)
        assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
    finally:
        down = subprocess.run([*compose, "down", "-v", "--rmi", "local", "--remove-orphans"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    label = f"label=com.docker.compose.project={project}"
    for kind in ("container", "network"):
        left = subprocess.run(["docker", kind, "ls", "-q", *(["-a"] if kind == "container" else []),
                               "--filter", label], capture_output=True, text=True, check=True).stdout
        assert left.strip() == "", f"{kind}s of {project} left behind: {left}"

    summary = json.loads((tmp_path / "node0" / "summary.json").read_text())
    assert summary["world_size"] == 2 * nproc and summary["nnodes"] == 2 and summary["epochs"] == 2
    timing = [json.loads(line) for line in (tmp_path / "node0" / "timing.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in timing] == [1, 2]
    assert all(record["world_size"] == 2 * nproc for record in timing)
    for node in ("node0", "node1"):
        assert sorted(p.name for p in (tmp_path / node / "snapshots").glob("*.pt")), f"{node} wrote no snapshot"
    assert not (tmp_path / "node1" / "summary.json").exists()  # global rank 0 lives on node0
