"""The end-of-session check (tests/session_leaks.py), on real pytest sessions that leave real things behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.session_leaks import docker_containers

REPO = Path(__file__).resolve().parent.parent
CONFTEST = ("from tests.session_leaks import pytest_sessionfinish, pytest_sessionstart, pytest_testnodedown  "
            "# noqa: F401\n")


def run_session(tmp_path: Path, test_source: str, *pytest_args: str) -> subprocess.CompletedProcess[str]:
    """`pytest` on one test file with the check's hooks, in a directory of its own."""
    project = tmp_path / "inner"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_inner.py").write_text(test_source)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DDPCTL_LEAK_SETTLE_SECONDS": "2"}
    env.pop("DDPCTL_SKIP_LEAK_CHECK", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           f"--basetemp={tmp_path / 'basetemp'}", *pytest_args, "test_inner.py"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=180)


def test_a_clean_session_passes(tmp_path: Path) -> None:
    result = run_session(tmp_path, "import subprocess\n\ndef test_ok(tmp_path):\n"
                                   "    subprocess.run(['true'], check=True)\n    (tmp_path / 'f').write_text('x')\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left behind" not in result.stdout


def test_a_process_left_running_fails_the_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    result = run_session(tmp_path, f"""
import subprocess, sys
def test_leaks_a_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "pretend-torchrun"])
    open({str(pid_file)!r}, "w").write(str(proc.pid))
""")
    pid = int(pid_file.read_text())
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert "1 passed" in result.stdout  # the test itself passed: the session check failed it
        assert f"process {pid}: " in result.stdout and "pretend-torchrun" in result.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_under_workers_each_names_what_it_left_and_not_what_another_still_runs(tmp_path: Path) -> None:
    """`pytest -n 2`: one worker's test leaves a process; the other's test still runs one of its own while the
    first worker ends (then stops it). The run fails naming the first process only."""
    left, live = tmp_path / "left.pid", tmp_path / "live.pid"
    result = run_session(tmp_path, f"""
import subprocess, sys, time
import pytest

@pytest.mark.xdist_group("a")
def test_leaks_a_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "pretend-torchrun"])
    open({str(left)!r}, "w").write(str(proc.pid))

@pytest.mark.xdist_group("b")
def test_runs_a_process_past_the_other_workers_end():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "still-running"])
    open({str(live)!r}, "w").write(str(proc.pid))
    time.sleep(12)  # the other worker's end-of-session check (2 s settle) runs meanwhile
    proc.kill()
    proc.wait()
""", "-n", "2", "--dist", "loadgroup")
    pid = int(left.read_text())
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert "2 passed" in result.stdout
        assert "left 1 thing(s)" in result.stdout and f"process {pid}: " in result.stdout, result.stdout
        assert "pretend-torchrun" in result.stdout and "(worker gw" in result.stdout
        assert "still-running" not in result.stdout and f"process {live.read_text()}:" not in result.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_mount_left_in_the_sessions_temporary_directory_fails_the_session(tmp_path: Path) -> None:
    mounted = tmp_path / "basetemp" / "test_leaks_a_mount0" / "mnt"
    result = run_session(tmp_path, """
import subprocess
def test_leaks_a_mount(tmp_path):
    (tmp_path / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "leaktest", str(tmp_path / "mnt")], check=True)
""")
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"mount {mounted}" in result.stdout
    finally:
        subprocess.run(["umount", "-l", str(mounted)], capture_output=True)


@pytest.mark.skipif(docker_containers() is None, reason="no Docker engine answers here")
def test_a_container_of_the_session_left_behind_fails_the_session(tmp_path: Path) -> None:
    """A created (never started) container bind-mounting the session's temporary directory; the image is empty."""
    image = "ddpctl-leakcheck:empty"
    subprocess.run(f"tar cf - --files-from /dev/null | docker import - {image}", shell=True, check=True,
                   capture_output=True, timeout=120)
    id_file = tmp_path / "container"
    result = run_session(tmp_path, f"""
import subprocess
def test_leaks_a_container(tmp_path):
    out = subprocess.run(["docker", "create", "-v", f"{{tmp_path}}:/data", {image!r}, "/nothing"],
                         check=True, capture_output=True, text=True).stdout.strip()
    open({str(id_file)!r}, "w").write(out)
""")
    container = id_file.read_text().strip()
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"({container[:12]}, created, image {image})" in result.stdout
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)
        subprocess.run(["docker", "image", "rm", image], capture_output=True, timeout=60)
