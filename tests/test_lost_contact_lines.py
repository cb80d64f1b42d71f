"""What `up` says about a node that stops answering (launcher/execute/following/lost_contact.py), from node states
alone: the
line when it goes silent (what every other node does, by its own poll), the line when it answers again (its
recorded exit and when), and the end once it is silent past the limit: the nodes that can only wait for it are
stopped, a run that still moves is left to go on. The test bed runs the same with a cut link
(tests/faults/test_lost_contact.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import DdpctlError
from launcher.execute.following.lost_contact import ContactWatch, GiveUp, Movement, clock, end_following
from launcher.execute.pull_record import write_pull_record
from launcher.results.rundir import RunDir
from launcher.runtimes.native import NodeState
from launcher.spec.run_spec import RunSpec

LABELS = ["u@a", "u@b"]
AT_RENDEZVOUS = NodeState(pid=10, exit_code=None, alive=True, progress=None)
TRAINING = NodeState(pid=10, exit_code=None, alive=True, attempt=0,
                     progress={"epoch": 3, "epochs": 500, "step": 4, "steps_per_epoch": 16})
EXITED_1 = NodeState(pid=11, exit_code=1, alive=False, progress=None)


def watch(tmp_path: Path, launcher: str = "torchrun", exit_time: float | None = None) -> ContactWatch:
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="r1", nnodes=2), {"nodes": []})
    return ContactWatch(run_dir, LABELS, 180.0, launcher, lambda _node: exit_time)


def events(contact: ContactWatch, kind: str) -> list[dict[str, Any]]:
    return [e for e in contact.run_dir.events() if e["event"] == kind]


def test_a_silent_node_is_told_once_with_what_every_other_node_does(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    contact = watch(tmp_path)
    since = clock(contact.answered_at[1])
    contact.observe([AT_RENDEZVOUS, None], time.monotonic(), Movement())
    contact.observe([AT_RENDEZVOUS, None], time.monotonic(), Movement())  # still silent: not told again
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf"node 1 \(u@b\) does not answer \(silent since {since}\): what it does since then is unknown; node 0 "
        r"\(u@a\), polled at \d\d:\d\d:\d\d, waits at the rendezvous \(no worker started yet\); `up` waits for it "
        r"up to 180 s in all; `ddpctl down r1` stops every node", lines[0]), lines[0]
    (lost,) = events(contact, "contact_lost")
    assert lost["node"] == 1 and "waits at the rendezvous" in lost["others"]["0"]


def test_a_node_that_answers_again_is_told_with_its_recorded_exit_and_when(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ended = time.time() - 30
    contact = watch(tmp_path, exit_time=ended)
    contact.observe([TRAINING, None], time.monotonic(), Movement())
    capsys.readouterr()
    contact.observe([TRAINING, EXITED_1], time.monotonic(), Movement())
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(rf"node 1 \(u@b\) answers again after \d+ s: it had exited 1 at {clock(ended)} while out "
                        r"of reach \(its recorded exit\)", line), line
    (back,) = events(contact, "contact_back")
    assert back["exit_code"] == 1 and back["exit_time"] == ended
    assert contact.past_limit(time.monotonic() + 1000) is None  # it answers: no limit runs for it


def test_past_the_limit_nodes_waiting_at_the_rendezvous_are_the_ones_to_stop(tmp_path: Path) -> None:
    contact = watch(tmp_path)
    contact.observe([AT_RENDEZVOUS, None], time.monotonic(), Movement())
    assert contact.past_limit(time.monotonic()) is None
    assert contact.past_limit(time.monotonic() + 181) == 1
    give_up = contact.give_up(1, [AT_RENDEZVOUS, None], Movement(), time.monotonic())
    assert give_up.waiting == [0]
    assert give_up.line.endswith("waits at the rendezvous (no worker started yet): the run cannot go on without "
                                 "node 1")


def test_past_the_limit_a_run_that_still_trains_is_left_to_go_on_and_said_so(tmp_path: Path) -> None:
    contact = watch(tmp_path)
    contact.observe([TRAINING, None], time.monotonic(), Movement())
    give_up = contact.give_up(1, [TRAINING, None], Movement(time.monotonic(), 2.0), time.monotonic())
    assert give_up.waiting == []
    assert "node 0 (u@a), polled at" in give_up.line and "is training (epoch 3/500, step 4/16)" in give_up.line
    assert "the run may go on without `up` seeing node 1" in give_up.line
    assert give_up.line.endswith("or stop every node with `ddpctl down r1`")
    with pytest.raises(DdpctlError) as raised:
        end_following(contact, give_up, lambda nodes: pytest.fail("nothing is stopped"), lambda: None)
    assert str(raised.value) == give_up.line


def test_training_that_stopped_moving_past_the_hang_rule_counts_as_waiting(tmp_path: Path) -> None:
    contact = watch(tmp_path)
    now = time.monotonic()
    give_up = contact.give_up(1, [TRAINING, None], Movement(now - 100, 5.0, hung=True), now)
    assert give_up.waiting == [0]
    assert re.search(r"node 0 \(u@a\), polled at \d\d:\d\d:\d\d, has made no training step since \d\d:\d\d:\d\d "
                     r"\(epoch 3/500, step 4/16\): the run cannot go on without node 1", give_up.line), give_up.line


def test_training_that_made_no_step_since_a_node_went_silent_waits_for_it(tmp_path: Path) -> None:
    """Not hung yet by the hang rule (its limit is five times the slowest gap), but no step since node 1 was
    found silent, and longer than any gap so far: node 0 can only be waiting for it in a collective."""
    contact = watch(tmp_path)
    start = time.monotonic()
    moving = Movement(last_move=start - 1, slowest=20.0)  # the last step came just before the poll
    contact.observe([TRAINING, None], start, moving)  # the poll that finds node 1 silent
    assert contact.give_up(1, [TRAINING, None], moving, start + 10).waiting == []  # 11 s: within a step's gap
    assert contact.give_up(1, [TRAINING, None], moving, start + 181).waiting == [0]
    moved = Movement(last_move=start + 100, slowest=20.0)  # a step after it went silent: the run moves
    assert contact.give_up(1, [TRAINING, None], moved, start + 181).waiting == []


def test_a_script_node_without_workers_yet_is_not_taken_for_a_rendezvous(tmp_path: Path) -> None:
    """An mpirun or spawn node has no torchrun rendezvous: nothing is stopped on a guess."""
    contact = watch(tmp_path, launcher="mpirun")
    give_up = contact.give_up(1, [AT_RENDEZVOUS, None], Movement(), time.monotonic())
    assert give_up.waiting == []
    assert "has not started its workers yet" in give_up.line


def test_the_stop_after_the_limit_names_what_was_stopped_pulled_and_what_stays_unknown(tmp_path: Path) -> None:
    contact = watch(tmp_path)
    contact.observe([AT_RENDEZVOUS, None], time.monotonic(), Movement())
    give_up = GiveUp(1, "lost contact ...", [0])
    run_path = contact.run_dir.path
    stopped: list[list[int]] = []

    def pull() -> None:  # node 0 comes back, the silent node's pull fails
        write_pull_record(run_path, LABELS, [{"verified": 3}, None], [None, "u@b: host unreachable"])
        raise DdpctlError("pull failed on 1 of 2 host(s)")

    with pytest.raises(DdpctlError) as raised:
        end_following(contact, give_up, lambda nodes: stopped.append(nodes) or {}, pull)
    assert stopped == [[0]]
    line = str(raised.value)
    assert re.fullmatch(
        r"lost contact with node 1 \(u@b\) since \d\d:\d\d:\d\d: 180 s without an answer; node 0 \(u@a\) waited "
        rf"for it and was stopped by ddpctl; what node 0 wrote is pulled to {re.escape(str(run_path))}; node 1's "
        r"state is unknown: once it answers, `ddpctl status r1` tells how it ended and `ddpctl down r1` stops it if "
        r"it still runs", line), line
    outcome = events(contact, "outcome")[-1]
    assert outcome["text"] == line and outcome["left_running"] == ["u@b (unknown: no answer)"]
    assert json.loads((run_path / "pull.json").read_text())["nodes"][0]["error"] is None
