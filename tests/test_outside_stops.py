"""A followed run ended from outside `up`, on the test bed (one host, a tiny long run each): `ddpctl down` from a
second terminal makes `up` say the run was stopped by down; a workspace deleted on its host ends `up` with a line
that says so (not "not started" for ever); a host key that changes mid-run is named HOST KEY CHANGED by `up` and
by `status`; a ship that fails leaves no run directory and says nothing was started. Each asserts the user's line
and, where ddpctl can know them, that no run process is left."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from tests.faults.fault_support import (
    TINY,
    Up,
    assert_nothing_left_running,
    ddpctl,
    last_line,
    running_processes,
    wait_for,
)
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
LONG = [*TINY, "--epochs", "500"]


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    cleanup_stale("ddpext")
    testbed = Testbed("ddpext", n_hosts=1, host_python=True)
    try:
        yield testbed
    finally:
        testbed.stop()


def training(up: Up) -> None:
    wait_for("training to start", lambda: (up.workspace(0) / "out" / "progress.json").exists(), timeout=120)


def test_down_from_another_terminal_is_named_by_up(bed: Testbed, tmp_path: Path) -> None:
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    training(up)
    down = ddpctl(bed, "down", str(up.run))
    assert down.returncode == 0, down.stderr
    code, err = up.finish(timeout=120)
    assert code == 1, err
    assert last_line(err).startswith(f"error: run {up.run.name} was stopped by `ddpctl down` (from another "
                                     "terminal); every node was stopped and what it wrote pulled to"), err
    assert "training failed" not in err and "SIGTERM" not in err
    assert_nothing_left_running(bed.hosts)


def test_a_workspace_deleted_mid_run_ends_up_with_a_stated_outcome(bed: Testbed, tmp_path: Path) -> None:
    """The node's pid file went with its workspace: its processes are found by the run's marks (the supervisor's
    command line, the output folder in their environment), stopped, and the line says so."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    training(up)
    assert running_processes(bed.hosts[0])  # the node runs
    shutil.rmtree(up.workspace(0))
    code, err = up.finish(timeout=120)
    assert code == 1, err
    line = last_line(err)
    assert line.startswith(f"error: the workspace of node 0 ({bed.hosts[0].spec}) was deleted from its host "
                           f"(~/.ddpctl/runs/{up.run.name}): nothing more can be read or pulled there; node 0 "
                           f"({bed.hosts[0].spec}): its "), err
    assert "process(es) of the run, found by the run's marks (command line and environment), were stopped" in line
    assert running_processes(bed.hosts[0]) == ""  # nothing of the run is left on that host, at once
    status = ddpctl(bed, "status", str(up.run))
    assert "workspace gone" in status.stdout + status.stderr
    assert_nothing_left_running(bed.hosts)


def test_lost_contact_says_what_is_unknown_and_how_to_stop_every_node(bed: Testbed, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_LOST_CONTACT", "5")  # instead of 180 s
    host = bed.hosts[0]
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    training(up)
    host.link_down()
    try:
        code, err = up.finish(timeout=150)
    finally:
        host.link_up()
    assert code == 1, err
    run = up.run.name
    assert last_line(err) == (f"error: lost contact with node 0 ({host.spec}) for 5 s: whether it still runs is "
                              f"unknown (it may have ended); see `ddpctl status {run}`, fetch what was written with "
                              f"`ddpctl pull {run}`, or stop every node with `ddpctl down {run}`"), err
    down = ddpctl(bed, "down", str(up.run))  # what the line says to do
    assert down.returncode == 0, down.stderr
    assert_nothing_left_running(bed.hosts)


def test_the_run_directory_deleted_while_up_follows_stops_every_node(bed: Testbed, tmp_path: Path) -> None:
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    training(up)
    run = up.run
    shutil.rmtree(run)
    code, err = up.finish(timeout=120)
    assert code == 1, err
    assert last_line(err) == (f"error: the run directory {run} was deleted while `up` followed the run: every node "
                              "was stopped; nothing was pulled (there is nowhere to put it): what the nodes wrote "
                              f"stays on the hosts, in ~/.ddpctl/runs/{run.name}/"), err
    assert_nothing_left_running(bed.hosts)


def test_a_ship_that_fails_leaves_no_run_directory_and_says_nothing_started(bed: Testbed, tmp_path: Path) -> None:
    host = bed.hosts[0]
    code_cache = Path(host.home, ".ddpctl", "code")
    moved = code_cache.with_name("code.kept")
    if code_cache.exists():
        code_cache.rename(moved)
    made_top = not code_cache.parent.exists()
    code_cache.mkdir(mode=0o555, parents=True)  # root's, not writable by the login: the host cannot take the code
    try:
        up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, "--epochs", "1")
        code, err = up.finish(timeout=120)
    finally:
        code_cache.rmdir()
        if made_top:
            shutil.rmtree(code_cache.parent)
        if moved.exists():
            moved.rename(code_cache)
    assert code == 1, err
    assert last_line(err) == ("shipping the code to the hosts failed: nothing was started on any host; no run "
                              "directory kept (it held only the plan)"), err
    assert [p.name for p in (tmp_path / "runs").iterdir()] == []  # `status`, `logs -f` have no run to wait on
    assert_nothing_left_running(bed.hosts)


def test_a_host_key_changed_mid_run_is_named_by_up_and_status(bed: Testbed, tmp_path: Path) -> None:
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    training(up)
    host = bed.hosts[0]  # last in this module: the bed's pinned key is no longer the host's afterwards
    host.regenerate_host_key()  # sshd restarted with a new key (the machine reinstalled, or another one)
    sessions = subprocess.run(["pgrep", "-u", host.user, "-f", "^sshd: "], capture_output=True, text=True).stdout
    for pid in sessions.split():  # the connections to the old sshd end with it: `up` connects again
        os.kill(int(pid), signal.SIGTERM)
    code, err = up.finish(timeout=120)
    assert code == 1, err
    assert "HOST KEY CHANGED" in last_line(err) and "the run goes on there unseen" in last_line(err), err
    status = ddpctl(bed, "status", str(up.run))
    assert "HOST KEY CHANGED" in status.stdout + status.stderr
    for pid in [int(line.split()[0]) for line in running_processes(bed.hosts[0]).splitlines()]:
        os.kill(pid, signal.SIGKILL)  # ddpctl rightly refuses to talk to the host now: ended here, by pid

