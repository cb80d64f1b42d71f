"""The state `ddpctl status` shows for a run on this machine, measured from its recorded torchrun (pid and start
time) and what its `up` recorded; and the one stall rule both the local and the host path follow. In process: the
"torchrun" is this test's own process, read through /proc."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from launcher.errors import RunStopRequested
from launcher.execute.following.outside_stops import DOWN_EVENT
from launcher.execute.following.stall_watch import StallWatch, stall_line
from launcher.execute.this_machine.state import local_state, local_status_rows
from launcher.remote.proctree import start_time
from launcher.results.progress import FreshestProgress
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec


def local_run(tmp_path: Path, **record: object) -> RunDir:
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="here"), {"hosts": [], "provider": "local"})
    run_dir.update_record(**record)
    return run_dir


def this_process() -> dict[str, object]:
    return {"local_pid": os.getpid(), "local_pid_start": start_time(os.getpid())}


def test_a_run_whose_torchrun_lives_is_running_with_its_progress(tmp_path: Path) -> None:
    run_dir = local_run(tmp_path, **this_process())
    (run_dir.path / "progress.json").write_text(json.dumps({"epoch": 3, "epochs": 9, "loss": 0.25, "step": 2}))
    [row] = local_status_rows(run_dir)
    assert row == {"node": 0, "host": "local", "state": "running", "exit_code": None, "epoch": 3, "epochs": 9,
                   "loss": 0.25, "restarts": 0}


def test_the_loss_falls_back_to_the_last_ended_epochs_training_loss(tmp_path: Path) -> None:
    run_dir = local_run(tmp_path, **this_process())
    (run_dir.path / "progress.json").write_text(json.dumps({"epoch": 2, "epochs": 9}))
    (run_dir.path / "timing.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 1.5}) + "\n" +
                                               json.dumps({"epoch": 2, "train_loss": 0.75}) + "\n")
    assert local_status_rows(run_dir)[0]["loss"] == 0.75


def test_a_pid_the_system_gave_to_another_process_is_not_the_run(tmp_path: Path) -> None:
    started = start_time(os.getpid())
    assert started is not None
    run_dir = local_run(tmp_path, local_pid=os.getpid(), local_pid_start=str(int(started) - 7))
    assert local_state(run_dir) == ("lost", None)  # gone, and nothing recorded how it ended


@pytest.mark.parametrize("events, expected", [
    ([("exited", {"exit_code": 0})], ("finished", 0)),
    ([("exited", {"exit_code": 3})], ("failed (exit 3)", 3)),
    ([("exited", {"exit_code": None, "error": "could not start torchrun"})], ("failed", None)),
    ([("stopped", {"exit_code": 1})], ("stopped", 1)),
    ([(DOWN_EVENT, {}), ("exited", {"exit_code": 1})], ("stopped", 1)),
])  # fmt: skip
def test_an_ended_run_is_told_by_what_its_up_recorded(tmp_path: Path, events: list[tuple[str, dict[str, object]]],
                                                      expected: tuple[str, int | None]) -> None:
    run_dir = local_run(tmp_path, local_pid=999_999_999)  # no such process
    for kind, fields in events:
        run_dir.event(kind, node=0, **fields)
    assert local_state(run_dir) == expected


def test_a_run_without_a_pid_is_starting_then_not_started(tmp_path: Path) -> None:
    assert local_state(local_run(tmp_path, created=time.time()))[0] == "starting"
    assert local_state(local_run(tmp_path / "old", created=time.time() - 3600))[0] == "not started"


def test_the_stall_rule_tells_once_and_ends_the_run_past_its_timeout(tmp_path: Path) -> None:
    run_dir = local_run(tmp_path)
    freshest = FreshestProgress(1)
    watch = StallWatch(run_dir, freshest, timeout=4.0)
    assert watch.check(0.0) is None  # no record yet: start-up is not a stall
    freshest.observe(0, {"epoch": 1, "step": 1}, now=10.0)
    assert watch.check(13.0) is None
    with pytest.raises(RunStopRequested) as stopped:
        watch.check(14.5)
    assert str(stopped.value) == stall_line(4.0, "here") and stopped.value.reason == "stalled"
    assert str(stopped.value).startswith("--stall-timeout: no training step for 4 s (a hung collective or data "
                                         "loader); see `ddpctl logs here`")
    hint = StallWatch(run_dir, freshest)  # no timeout: a `stalled` event once past the hint's 300 s, then quiet
    assert hint.check(400.0) == pytest.approx(390.0) and hint.check(401.0) == pytest.approx(391.0)
    assert [e["event"] for e in run_dir.events()] == ["stalled"]
    freshest.observe(0, {"epoch": 1, "state": "done"}, now=402.0)
    assert hint.check(900.0) is None  # a finished run never stalls
