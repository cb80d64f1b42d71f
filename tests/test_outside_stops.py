"""A followed run ended from outside `up`, on the test bed (one host, a tiny long run each): `ddpctl down` from a
second terminal makes `up` say the run was stopped by down; a workspace deleted on its host ends `up` with a line
that says so (not "not started" for ever); a host key that changes mid-run is named HOST KEY CHANGED by `up`,
`status`, `logs` and `down` (which stops nothing it cannot reach, and says so); a ship that fails leaves no run
directory and says nothing was started. Each asserts the user's line and, where ddpctl can know them, that no run
process is left."""

from __future__ import annotations

import contextlib
import os
import re
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
    rank_0_hangs_at,
    running_processes,
    wait_for,
)
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
# Runs that only what the test does ends, and that wait for it without training: the one rank stops at step 2, once
# its first progress record (what `training` waits for) is written.
LONG = [*TINY, "--epochs", "500", *rank_0_hangs_at(2)]


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


def delete_while_written(folder: Path) -> None:
    """rm -r of a folder a run writes to: a file added meanwhile fails one pass (not empty), not the deletion."""
    while folder.exists():
        shutil.rmtree(folder, ignore_errors=True)


def test_a_workspace_deleted_mid_run_ends_up_with_a_stated_outcome(bed: Testbed, tmp_path: Path) -> None:
    """The node's pid file went with its workspace: its processes are found by the run's marks (the supervisor's
    command line, the output folder in their environment), stopped, and the line says so."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    training(up)
    assert running_processes(bed.hosts[0])  # the node runs
    # The built-in trainer writes to its workspace each step and so ends by itself (at once) once it is gone; its
    # workers are frozen first, as a script that writes elsewhere would keep running: the stop is what ends them.
    bed.hosts[0].run_as_user(["pkill", "-STOP", "-u", bed.hosts[0].user, "-f", "m trainer --model"], check=False)
    delete_while_written(up.workspace(0))
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
    assert re.fullmatch(rf"error: lost contact with node 0 \({re.escape(host.spec)}\): no answer since "
                        r"\d\d:\d\d:\d\d \(5 s\), so what it does is unknown \(it may have ended, or run on\); "
                        rf"see `ddpctl status {run}`, fetch what was written with `ddpctl pull {run}`, or stop every "
                        rf"node with `ddpctl down {run}`", last_line(err)), err
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
        with contextlib.suppress(ProcessLookupError):  # a session that ended since pgrep listed it
            os.kill(int(pid), signal.SIGTERM)
    code, err = up.finish(timeout=120)
    assert code == 1, err
    assert "HOST KEY CHANGED" in last_line(err) and "the run goes on there unseen" in last_line(err), err
    run = up.run.name
    try:
        status = ddpctl(bed, "status", str(up.run))
        assert status.returncode == 0, status.stderr
        told = " ".join((status.stdout + status.stderr).split())  # the state, then host, refusal, what to do
        assert f"node 0: {host.spec}: HOST KEY CHANGED for " in told and "ssh-keygen -R" in told, status.stderr
        assert f"Until then ddpctl does not talk to it: the node's state is unknown and `ddpctl down {run}` cannot " \
               "stop it" in told
        status_json = ddpctl(bed, "status", str(up.run), "--json")
        assert '"state": "HOST KEY CHANGED"' in status_json.stdout and "HOST KEY CHANGED for" in status_json.stdout
        logs = ddpctl(bed, "logs", str(up.run))
        assert logs.returncode == 1 and last_line(logs.stderr).startswith(f"error: {host.spec}: HOST KEY CHANGED "
                                                                          "for "), logs.stderr
        assert "ssh-keygen -R" in logs.stderr
        down = ddpctl(bed, "down", str(up.run))
        assert down.returncode == 1, down.stderr
        line = " ".join(last_line(down.stderr).split())
        assert line.startswith(f"error: could not stop 1 of 1 node(s) of run {run}: node 0: {host.spec}: HOST KEY "
                               "CHANGED for "), down.stderr
        assert line.endswith(f"such a node may still run: `ddpctl down {run}` again stops it once it can be reached; "
                             f"nothing could be pulled from it: `ddpctl pull {run}` fetches it later"), down.stderr
        assert running_processes(host), "down must not claim a stop it could not make"
        bed.write_known_hosts()  # what the line says: the host was reinstalled, its new key is checked and pinned
        down = ddpctl(bed, "down", str(up.run))
        assert down.returncode == 0, down.stderr
        assert_nothing_left_running(bed.hosts)
    finally:
        for pid in [int(line.split()[0]) for line in running_processes(bed.hosts[0]).splitlines()]:
            os.kill(pid, signal.SIGKILL)  # a failed assertion above must leave nothing behind

