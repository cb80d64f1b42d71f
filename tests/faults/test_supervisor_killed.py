"""The node's supervisor (ddpctl's process on the host that runs torchrun and records its exit status) killed from
outside mid-run: `up` names that, not the SIGTERM its own stop then sends the torchrun left running without it, and
leaves nothing running."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from tests.faults.fault_support import (
    TINY,
    Up,
    assert_nothing_left_running,
    last_line,
    rank_0_hangs_at,
    tiny_steps_per_epoch,
)
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


# On two nodes the other node's stop follows the failure anyway; on one, ddpctl must stop the node whose supervisor
# went, or its torchrun and workers would train on with nobody to record them.
@pytest.mark.parametrize(("signal_name", "nodes"), [("SIGKILL", 2), ("SIGTERM", 1)])
def test_a_killed_supervisor_is_named_as_the_cause(bed: Testbed, tmp_path: Path, signal_name: str,
                                                   nodes: int) -> None:
    hosts = bed.hosts[:nodes]
    # rank 0 stops at the first step after epoch 1's snapshot: the run goes on, without training, until ddpctl
    # finds its supervisor gone and stops it
    up = Up(bed, hosts, tmp_path / "runs", *TINY, "--epochs", "300", *rank_0_hangs_at(tiny_steps_per_epoch(nodes) + 1))
    up.wait_snapshots(1)
    killed = nodes - 1
    os.kill(up.node_pid(killed), getattr(signal, signal_name))
    code, err = up.finish(timeout=180)
    assert code == 1, err
    line = last_line(err)
    assert line.startswith(f"error: training failed: the supervisor of node {killed} ({hosts[killed].spec}), "
                           "ddpctl's process that runs torchrun there and records how it ends, was ended from outside "
                           "(killed?) before torchrun ended; torchrun and its workers, left running without it, were "
                           "stopped by ddpctl ("), line
    assert "torchrun's agent" not in line
    assert_nothing_left_running(bed.hosts)
