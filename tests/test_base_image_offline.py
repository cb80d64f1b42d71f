"""The suite's set-up, then the suite cut off from the internet: the offline Docker base image still builds.

A fresh machine has no local wheel folder and no pip configuration of ours. `infra/setup.sh --test` downloads the
base image's wheels (`infra/base_image.sh --wheels-only`) before the suite points HTTPS at a refusing proxy
(tests/network_isolation.py); the image is then built from them. Here both steps run as on such a machine: pip's
configuration files and PIP_FIND_LINKS are out of the picture for the build, HTTPS goes to the refusing proxy.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.docker_fixtures import REPO, base_image_tag, offline_build_lock, requires_docker
from tests.network_isolation import REFUSING_PROXY, environment_before_isolation

pytestmark = [requires_docker, pytest.mark.docker,
              pytest.mark.skipif(shutil.which("mmdebstrap") is None,
                                 reason="mmdebstrap is missing: run `bash infra/setup.sh --test`")]
SCRIPT = str(REPO / "infra" / "base_image.sh")


def cut_off(env: dict[str, str]) -> dict[str, str]:
    """As the suite runs on a fresh machine: HTTPS refused, no wheel folder, no pip configuration file, no retries."""
    env = {name: value for name, value in env.items() if not name.startswith("PIP_")}
    env.update(HTTPS_PROXY=REFUSING_PROXY, https_proxy=REFUSING_PROXY, PIP_CONFIG_FILE=os.devnull,
               PIP_RETRIES="0", PIP_DEFAULT_TIMEOUT="5")
    return env


def run_script(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """infra/base_image.sh in a process group of its own: on a timeout, mmdebstrap and pip go with it."""
    proc = subprocess.Popen(["bash", SCRIPT, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"infra/base_image.sh {' '.join(args)} ran over {timeout:g} s:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# Set-up's download and a whole image build: about 3 minutes on an idle 2-core machine, many more on a busy one.
@pytest.mark.timeout(1800)
def test_setup_is_not_cut_off_and_the_base_image_builds_from_what_it_downloaded(tmp_path: Path) -> None:
    # Where the suite's own base image is not built yet (a fresh machine, as in CI), the build below is that image,
    # and the Docker tests' fixture waits for it (offline_build_lock) instead of building it a second time.
    suite_tag = base_image_tag()
    with open(offline_build_lock(suite_tag), "a") as lock:
        if subprocess.run(["docker", "image", "inspect", suite_tag], capture_output=True).returncode != 0:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            download_then_build_cut_off(tmp_path, suite_tag)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def download_then_build_cut_off(tmp_path: Path, suite_tag: str) -> None:
    cache = tmp_path / "cache"
    assert "bash infra/base_image.sh --wheels-only" in (REPO / "infra" / "setup.sh").read_text()

    # Without set-up's download, the cut-off suite cannot get the CPU torch: the cut is real.
    empty = cut_off({**environment_before_isolation(), "DDPCTL_CACHE_DIR": str(tmp_path / "empty")})
    refused = run_script(["--wheels-only"], empty, timeout=300)
    assert refused.returncode != 0
    assert "no CPU build of torch" in refused.stderr and "infra/setup.sh --test" in refused.stderr
    assert not any((tmp_path / "empty" / "base-wheels").glob("*/complete"))

    # Set-up's step, in the environment the suite had before it isolated itself.
    setup_env = {**environment_before_isolation(), "DDPCTL_CACHE_DIR": str(cache)}
    downloaded = run_script(["--wheels-only"], setup_env, timeout=600)
    assert downloaded.returncode == 0, downloaded.stderr[-2000:]
    [folder] = (cache / "base-wheels").iterdir()
    assert (folder / "complete").exists()
    assert list(folder.glob("torch-*+cpu-cp311-*.whl")) and list(folder.glob("numpy-*-cp311-*.whl")) \
        and list(folder.glob("tensorboard-*.whl"))  # the trainer's event files

    # The suite's build, cut off: the suite's own base image where it is not built yet; where it is there already
    # (or a fixture built it meanwhile: the script then only names it), a repository name of its own, so that it
    # really builds.
    repo_name = f"ddpctl-base-offline-{uuid.uuid4().hex[:8]}"
    build_env = cut_off({**os.environ, "DDPCTL_CACHE_DIR": str(cache)})
    try:
        built = run_script([], build_env, timeout=1200)
        assert built.returncode == 0, built.stderr[-3000:]
        if "already built" in built.stderr:
            built = run_script([], {**build_env, "DDPCTL_BASE_REPO": repo_name}, timeout=1200)
            assert built.returncode == 0, built.stderr[-3000:]
        assert "already built" not in built.stderr and "importing into Docker as" in built.stderr, built.stderr
        tag = built.stdout.strip()
        assert tag.startswith(f"{repo_name}:cpu-") or tag == suite_tag, (tag, suite_tag)
        assert f"already in {folder}" in built.stderr
        versions = subprocess.run(["docker", "run", "--rm", tag, "python", "-c",
                                   "import torch, numpy, tensorboard; print(torch.__version__, numpy.__version__)"],
                                  capture_output=True, text=True, timeout=300)
        assert versions.returncode == 0, versions.stderr
        assert versions.stdout.split()[0].endswith("+cpu")
    finally:  # the suite's own base image stays: the Docker tests' fixture uses it
        images = subprocess.run(["docker", "image", "ls", "-q", repo_name], capture_output=True, text=True).stdout
        if images.split():
            subprocess.run(["docker", "image", "rm", "-f", *set(images.split())], capture_output=True)
