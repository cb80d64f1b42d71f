"""A node whose link is cut right after its start, on the two-host test bed: node 1 cannot reach node 0's
rendezvous store and its torchrun exits 1 a minute or so later, unseen, while node 0's torchrun waits at the
rendezvous for it. `up` tells what is known and unknown about every node while node 1 is silent; when the link
comes back it reads node 1's recorded exit and ends the run on it (node 0 stopped); when it does not come back
within the lost-contact limit, `up` stops node 0 (it can only wait) and says what stays unknown. Each asserts the
user's lines and that nothing is left running."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from tests.faults.fault_support import (
    TINY,
    Up,
    assert_nothing_left_running,
    ddpctl,
    last_line,
    running_processes,
    wait_for,
)
from tests.plain_lines import unstamped
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
LONG = [*TINY, "--epochs", "500"]
CLOCK = r"\d\d:\d\d:\d\d"


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


def cut_node_1_right_after_start(bed: Testbed, up: Up) -> None:
    wait_for("both nodes to start", lambda: sum(e["event"] == "started" for e in up.events()) == 2, every=0.05)
    bed.hosts[1].link_down()


def silent_line(bed: Testbed, run: str, limit: int) -> str:
    node0, node1 = bed.hosts[0].spec, bed.hosts[1].spec
    return (rf"node 1 \({re.escape(node1)}\) does not answer \(silent since {CLOCK}\): what it does since then is "
            rf"unknown; node 0 \({re.escape(node0)}\), polled at {CLOCK}, waits at the rendezvous \(no worker started "
            rf"yet\); `up` waits for it up to {limit} s in all; `ddpctl down {run}` stops every node")


def test_a_node_cut_off_at_its_start_is_told_and_its_exit_is_read_when_it_answers_again(
        bed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_LOST_CONTACT", "400")  # the link comes back well before
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    cut_node_1_right_after_start(bed, up)
    try:
        exit_file = up.workspace(1) / "exit_code"
        wait_for("node 1's torchrun to give up on the rendezvous", exit_file.exists, timeout=240, every=0.5)
        ended = time.strftime("%H:%M:%S", time.localtime(exit_file.stat().st_mtime))
        assert exit_file.read_text().strip() == "1"
        assert up.proc.poll() is None, "up still follows the run"
    finally:
        bed.hosts[1].link_up()
    code, err = up.finish(timeout=180)
    lines = unstamped(err).splitlines()
    run = up.run.name
    assert code == 1, err
    assert sum(bool(re.fullmatch(silent_line(bed, run, 400), line)) for line in lines) == 1, err
    node1 = re.escape(bed.hosts[1].spec)
    back = [line for line in lines if re.fullmatch(
        rf"node 1 \({node1}\) answers again after \d+ s: it had exited 1 at {CLOCK} while out of reach \(its "
        r"recorded exit\)", line)]
    assert len(back) == 1, err
    told = time.strptime(back[0].split(" at ")[1][:8], "%H:%M:%S")
    seen = time.strptime(ended, "%H:%M:%S")
    assert abs((told.tm_hour * 3600 + told.tm_min * 60 + told.tm_sec)
               - (seen.tm_hour * 3600 + seen.tm_min * 60 + seen.tm_sec)) <= 2, (back, ended)
    assert f"node 0 ({bed.hosts[0].spec}): stopped" in lines, err
    assert last_line(err).startswith(f"error: training failed: torchrun on node 1 ({bed.hosts[1].spec}) exited with "
                                     "1, and no worker of it failed: "), err
    assert "RendezvousConnectionError" in last_line(err)
    assert "lost contact" not in err
    assert_nothing_left_running(bed.hosts)


def test_a_node_silent_past_the_limit_ends_up_stopping_the_node_that_waits_for_it(
        bed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_LOST_CONTACT", "20")
    up = Up(bed, bed.hosts, tmp_path / "runs", *LONG)
    cut_node_1_right_after_start(bed, up)
    try:
        code, err = up.finish(timeout=180)
        run = up.run.name
        node0, node1 = (re.escape(h.spec) for h in bed.hosts)
        assert code == 1, err
        lines = unstamped(err).splitlines()
        assert sum(bool(re.fullmatch(silent_line(bed, run, 20), line)) for line in lines) == 1, err
        assert re.fullmatch(
            rf"error: lost contact with node 1 \({node1}\) since {CLOCK}: 20 s without an answer; node 0 \({node0}\) "
            rf"waited for it and was stopped by ddpctl; what node 0 wrote is pulled to {re.escape(str(up.run))}; "
            rf"node 1's state is unknown: once it answers, `ddpctl status {run}` tells how it ended and `ddpctl down "
            rf"{run}` stops it if it still runs", last_line(err)), err
        assert (up.run / "nodes" / "0" / "torchrun.out").is_file()  # node 0's files came back
        assert_nothing_left_running(bed.hosts[:1])  # the waiting node was stopped by `up`
        # Unseen by ddpctl, node 1's torchrun gives up on the store by itself (it is no stray ddpctl left)
        wait_for("node 1's torchrun to end", lambda: not running_processes(bed.hosts[1]), timeout=240, every=1)
    finally:
        bed.hosts[1].link_up()
    status = ddpctl(bed, "status", str(up.run), "--json")
    assert status.returncode == 0, status.stderr
    assert '"state": "failed (exit 1)"' in status.stdout, f"{status.stdout}\n{up.nodes_told()}"  # now it answers
    down = ddpctl(bed, "down", str(up.run))
    assert down.returncode == 0, down.stderr
    assert_nothing_left_running(bed.hosts)
    assert os.path.exists(up.run / "nodes" / "1" / "exit_code")  # `down` pulled node 1 too
