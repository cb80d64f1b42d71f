"""sshd killed on the host while `up` pulls at the end of a run that finished: `up` ends within a bound with one
line that says how the training ended, why the pull failed and what to run once the host answers (exit status 1,
as docs/guides/when-things-go-wrong.md says), and that `ddpctl pull RUN` then fetches everything, verified.

The pull is slowed so that it is surely under way when sshd goes: the host's egress is limited with `tc` (the
training's own traffic is small), and a 24 MiB output file takes about 12 s to come back."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from infra.testbed_host import TestHost
from launcher.transport.sync import PART_MARK
from tests.faults.fault_support import Up, assert_nothing_left_running, ddpctl, last_line, wait_for
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)

BIG = 24 * 2**20
WRITE_BIG = f"""import os
with open(os.path.join(os.environ["DDPCTL_OUTPUT_DIR"], "big.bin"), "wb") as f:
    f.write(os.urandom({BIG}))
print("wrote big.bin")
"""
# Seconds `up` may take, once sshd is gone, to say how the run ended: the pull's connection is gone at once (its
# sshd killed), and nothing should wait on it.
BOUND = 20


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


@contextlib.contextmanager
def slow_egress(host: TestHost, rate: str = "16mbit") -> Iterator[None]:
    """The host's outgoing traffic (what a pull reads) limited to `rate`, as tc's token bucket does it."""
    subprocess.run([*host.nsenter(), "tc", "qdisc", "add", "dev", host.iface, "root", "tbf", "rate", rate,
                    "burst", "32kbit", "latency", "400ms"], check=True)
    try:
        yield
    finally:
        subprocess.run([*host.nsenter(), "tc", "qdisc", "del", "dev", host.iface, "root"], check=False)


def kill_sshd(host: TestHost) -> None:
    """The host's sshd and every session it serves (the launcher's open connection among them) killed."""
    host.stop_sshd()
    sessions = subprocess.run(["pgrep", "-u", host.user, "-x", "sshd"], capture_output=True, text=True).stdout
    for pid in sessions.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("moment", ["transfer", "finished"])
def test_sshd_killed_mid_pull_ends_up_in_bounded_time_naming_how_training_ended_and_what_to_run(
        bed: Testbed, tmp_path: Path, moment: str) -> None:
    """`transfer`: while big.bin comes back; `finished`: as soon as `up` has recorded the end of training (the
    pull's first round trips)."""
    host = bed.hosts[0]
    project = tmp_path / "project"
    project.mkdir()
    (project / "write_big.py").write_text(WRITE_BIG)
    with slow_egress(host):
        up = Up(bed, [host], tmp_path / "runs", "--gpus", "1", "--", "python3", "write_big.py", cwd=project)
        local_out = up.run / "nodes" / "0" / "out"
        if moment == "transfer":  # big.bin's temporary file is growing here
            wait_for("the pull of big.bin", lambda: any(PART_MARK in p.name for p in local_out.glob("*"))
                     if local_out.is_dir() else False, timeout=240, every=0.05)
        else:
            wait_for("the finished event", lambda: any(e.get("event") == "finished" for e in up.events()),
                     timeout=240, every=0.02)
        kill_sshd(host)
        killed = time.monotonic()
        try:
            code, err = up.finish(timeout=BOUND + 60)
        finally:
            host.start_sshd()
        took = time.monotonic() - killed
    print(f"up ended {took:.1f} s after sshd was killed ({moment})")
    assert took <= BOUND, f"up took {took:.0f} s to end after sshd was killed:\n{err}"
    assert code == 1, err
    run = up.run.name
    line = last_line(err)
    assert line.startswith("error: the training finished on every node (exit status 0), but the pull did not: "
                           f"{host.spec}: "), err
    assert "the SSH connection dropped" in line or "connection" in line.lower(), line
    assert line.endswith(f"`ddpctl pull {run}` fetches what the nodes wrote into {up.run} once the host answers "
                         "again"), line
    assert "Traceback" not in err
    assert_nothing_left_running([host])

    pulled = ddpctl(bed, "pull", str(up.run))  # the host answers again: everything comes back, verified
    assert pulled.returncode == 0, pulled.stderr
    on_host = up.workspace(0) / "out" / "big.bin"
    assert sha256(local_out / "big.bin") == sha256(on_host)
    assert not [p for p in up.run.rglob("*") if PART_MARK in p.name]
