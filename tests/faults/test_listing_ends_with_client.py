"""A program ddpctl runs on a host ends when ddpctl goes: `up` SIGKILLed while its final pull lists the node's
workspace (a listing that hashes a 16 GiB sparse file, tens of seconds of full CPU) leaves no listing process on
the host a few seconds later; before, it ran to its end after its client had gone (sshd does not end a command
without a terminal when the connection drops)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from infra.testbed_host import TestHost
from tests.faults.fault_support import Up, wait_for
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)

WRITE_SPARSE = """import os
with open(os.path.join(os.environ["DDPCTL_OUTPUT_DIR"], "sparse.bin"), "wb") as f:
    f.truncate(16 * 2**30)
print("made sparse.bin")
"""
GONE_WITHIN = 5.0  # seconds: the host program checks for its client twice a second


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


def listings(host: TestHost, workspace: Path) -> list[int]:
    """The host's processes (its user's, read from /proc) listing `workspace`: `python -c PROGRAM manifest WS`."""
    uid = os.stat(host.home).st_uid
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if len(argv) >= 2 and argv[-2] == b"manifest" and argv[-1].rstrip(b"/").endswith(
                os.fsencode(str(workspace.relative_to(host.home)))):
            found.append(int(entry.name))
    return found


def test_up_killed_mid_listing_leaves_no_listing_on_the_host(bed: Testbed, tmp_path: Path) -> None:
    host = bed.hosts[0]
    project = tmp_path / "project"
    project.mkdir()
    (project / "write_sparse.py").write_text(WRITE_SPARSE)
    up = Up(bed, [host], tmp_path / "runs", "--gpus", "1", "--", "python3", "write_sparse.py", cwd=project)
    workspace = up.workspace(0)
    pids = wait_for("the final pull's listing on the host", lambda: listings(host, workspace), timeout=240, every=0.05)
    time.sleep(1)  # well into its hashing
    assert listings(host, workspace) == pids, "the listing ended by itself before ddpctl was killed"
    up.proc.send_signal(signal.SIGKILL)
    up.proc.wait()
    killed = time.monotonic()
    wait_for("the listing to end once its client is gone", lambda: not listings(host, workspace),
             timeout=GONE_WITHIN, every=0.1)
    assert time.monotonic() - killed <= GONE_WITHIN
