"""A host key that changes mid-run on one node of two: `up` ends (every retry would meet the same key) naming
that node, which goes on unseen, and stops the healthy node it still talks to rather than leaving it training
without a word; the line says which was stopped and how to fetch what it wrote."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from tests.faults.fault_support import TINY, Up, last_line, rank_0_hangs_at, running_processes, wait_for
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    cleanup_stale("ddpkey")
    testbed = Testbed("ddpkey", n_hosts=2, host_python=True)
    try:
        yield testbed
    finally:
        testbed.stop()


def test_a_key_changed_on_node_1_stops_node_0_and_names_both(bed: Testbed, tmp_path: Path) -> None:
    # rank 0 stops at step 2, once its first progress record is written: both nodes run on, without training,
    # through the key change
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, "--epochs", "500", *rank_0_hangs_at(2))
    wait_for("training to start", lambda: (up.workspace(0) / "out" / "progress.json").exists(), timeout=180)
    changed, healthy = bed.hosts[1], bed.hosts[0]
    try:
        changed.regenerate_host_key()
        sessions = subprocess.run(["pgrep", "-u", changed.user, "-f", "^sshd: "], capture_output=True,
                                  text=True).stdout
        for pid in sessions.split():  # the connections to the old sshd end with it: `up` connects again
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
        code, err = up.finish(timeout=180)
        assert code == 1, err
        line = " ".join(last_line(err).split())
        assert "HOST KEY CHANGED" in line and "node 1, so the run goes on there unseen" in line, err
        assert f"stopped the other node(s) ({healthy.spec}); `ddpctl pull {up.run.name}` fetches" in line, err
        assert not running_processes(healthy), "the healthy node must not be left training"
    finally:
        for host in (healthy, changed):
            for pid in [int(entry.split()[0]) for entry in running_processes(host).splitlines()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # nothing left behind, whatever failed above

