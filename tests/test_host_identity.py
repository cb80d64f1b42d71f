"""A host is what it is, not how it was typed; a pid is no identity. On the test bed: the same host given twice in
other spellings (`user@addr` and `user@addr:22`, an ssh config alias and its address) is refused in one line
before anything is written; `down` of a run whose recorded pid now belongs to another process of the same user
(the run ended, the system handed the pid on) signals nothing, whether or not the node recorded its exit."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from tests.testbed_fixtures import REPO, TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, run_ddpctl

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    """One host (port 22) with this machine's python and torch."""
    cleanup_stale("ddpid")
    testbed = Testbed("ddpid", n_hosts=1, host_python=True)
    try:
        yield testbed
    finally:
        testbed.stop()


def up_dry_run(bed: Testbed, home: Path, *hosts: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    host_args = [arg for host in hosts for arg in ("--host", host)]
    return subprocess.run([sys.executable, "-m", "launcher", "up", "-i", bed.client_key_path, *host_args, "--gpus",
                           "1", "--dry-run", "--runs-dir", str(home / "runs")], capture_output=True, text=True,
                          timeout=120, env=env, cwd=home)


def test_one_host_spelled_two_ways_is_refused(bed: Testbed, tmp_path: Path) -> None:
    host = bed.hosts[0]
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(f"Host nodezero\n  HostName {host.address}\n  User {host.user}\n")
    for first, second in [(f"{host.user}@{host.address}", f"{host.user}@{host.address}:22"),
                          ("nodezero", f"{host.user}@{host.address}")]:
        refused = up_dry_run(bed, tmp_path, first, second)
        assert refused.returncode == 1
        assert refused.stderr == (f"error: --host {first!r} and --host {second!r} are the same host (user {host.user}, "
                                  f"{host.address} port 22): each node needs a host of its own (two nodes would share "
                                  "one run workspace there); for more processes on one host, raise --gpus\n")
        assert not (tmp_path / "runs").exists()


def test_down_never_signals_a_process_that_took_a_finished_runs_pid(bed: Testbed, tmp_path: Path) -> None:
    host = bed.hosts[0]
    project = tmp_path / "project"
    project.mkdir()
    (project / "hello.py").write_text("print('hello')\n")
    runs = tmp_path / "runs"
    done = run_ddpctl(bed, "up", "--host", host.spec, "--gpus", "1", "--runs-dir", str(runs), "--", "python3",
                      "hello.py", cwd=project)
    assert done.returncode == 0, done.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    workspace = Path(host.home, ".ddpctl", "runs", run.name)
    uid, gid = os.stat(host.home).st_uid, os.stat(host.home).st_gid
    victim = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sleep", "300"],
                              start_new_session=True)  # the host user's own process, leader of its group
    try:
        (workspace / "pid").write_text(f"{victim.pid}\n")  # the system handed the node's pid to it
        for exit_recorded in (True, False):  # ended with its exit status; or killed before it could write it
            if not exit_recorded:
                (workspace / "exit_code").unlink()
            down = run_ddpctl(bed, "down", str(run))
            assert down.returncode == 0, down.stderr
            assert victim.poll() is None, f"down signalled pid {victim.pid}, which is not the run's"
        status = run_ddpctl(bed, "status", str(run))
        assert "running" not in status.stdout.lower()
    finally:
        victim.kill()
        victim.wait()
