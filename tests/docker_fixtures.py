"""Session fixtures for tests on the real Docker engine: the offline CPU base image and the test image.

Use them from a test module with `from tests.docker_fixtures import base_image, test_image  # noqa: F401`.
Both are cached: the base by a content hash (infra/base_image.sh), the test image by Docker's layer cache.
"""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_IMAGE = "ddpctl:test"


def docker_available() -> bool:
    """True when a Docker engine answers on this machine (CI starts one with infra/dockerd.sh)."""
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


requires_docker = pytest.mark.skipif(not docker_available(),
                                     reason="no Docker engine answers here: start one with `bash infra/dockerd.sh`")


def base_image_tag() -> str:
    """The tag infra/base_image.sh builds (the base image's repository and content hash), built or not."""
    return subprocess.run(["bash", str(REPO / "infra" / "base_image.sh"), "--tag"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def offline_build_lock(tag: str) -> str:
    """tests/test_base_image_offline.py builds the suite's base image itself where it is not built yet (a fresh
    machine, as in CI): it holds this lock of the image's tag, exclusively, from its start until that build is done.
    The fixture waits for it (at once where nobody holds it), then finds the image instead of building it a second
    time (about 1.5 minutes of both cores); where the test started later than the fixture, the test builds an image
    of its own instead."""
    return f"/tmp/ddpctl-base-offline-build-{tag.replace('/', '_').replace(':', '_')}.lock"


@pytest.fixture(scope="session")
def base_image() -> str:
    """The offline CPU base (Debian, python3, CPU torch, numpy), built once per content hash."""
    with open(offline_build_lock(base_image_tag()), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
    done = subprocess.run(["bash", str(REPO / "infra" / "base_image.sh")], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        pytest.fail(f"infra/base_image.sh failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def test_image(base_image: str) -> str:
    """The real Dockerfile built on the offline base, tagged ddpctl:test."""
    from launcher.runtimes.image import build_image

    # Workers of one run (pytest -n) build it one after the other: the first builds, the rest hit the layer cache.
    with open("/tmp/ddpctl-test-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_image(REPO, TEST_IMAGE, base_image, show_progress=False, cuda="none (CPU)")
    return TEST_IMAGE
