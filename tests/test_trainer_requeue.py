"""The trainer's side of a requeue (trainer/requeue.py, trainer/snapshot.py): armed only by the job's environment,
told by the signal or by the flag file of a signal that came before it listened; mid-epoch snapshots named and
ordered after their epoch's, pruned with the rest."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from trainer import requeue
from trainer.snapshot import list_positions, list_snapshots, newest_valid_position, save_snapshot, snapshot_path


@pytest.fixture
def usr1_restored():
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_not_armed_without_the_jobs_environment(monkeypatch: pytest.MonkeyPatch, usr1_restored: None) -> None:
    monkeypatch.delenv(requeue.SIGNAL_ENV, raising=False)
    before = signal.getsignal(signal.SIGUSR1)
    assert requeue.arm_from_environment() is None and signal.getsignal(signal.SIGUSR1) is before


def test_the_signal_asks_for_the_stop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, usr1_restored: None) -> None:
    monkeypatch.setenv(requeue.SIGNAL_ENV, "USR1")
    monkeypatch.setenv(requeue.FLAG_ENV, str(tmp_path / "signalled"))
    stop = requeue.arm_from_environment()
    assert stop is not None and not stop.asked and requeue.current() is stop
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.asked
    requeue.disarm()  # as the process ends: ignored again, never the default action
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN


def test_a_signal_that_came_before_the_process_listened_is_read_from_the_flag(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, usr1_restored: None) -> None:
    (tmp_path / "signalled").write_text("1700000000\n")
    monkeypatch.setenv(requeue.SIGNAL_ENV, "USR1")
    monkeypatch.setenv(requeue.FLAG_ENV, str(tmp_path / "signalled"))
    stop = requeue.arm_from_environment()
    assert stop is not None and stop.asked


def test_a_stop_asks_for_the_requeue_by_the_jobs_mark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(requeue.MARK_ENV, str(tmp_path / "resume"))
    requeue.ask_for_requeue()
    requeue.ask_for_requeue()  # every rank asks: one file
    assert (tmp_path / "resume").is_file()
    monkeypatch.delenv(requeue.MARK_ENV)
    requeue.ask_for_requeue()  # not in a requeued job: nothing to say, nowhere to say it


def test_a_bad_signal_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(requeue.SIGNAL_ENV, "NOPE")
    with pytest.raises(ValueError, match="is not a signal name"):
        requeue.arm_from_environment()


def test_mid_epoch_snapshots_sort_after_their_epoch_and_are_pruned_with_the_rest(tmp_path: Path) -> None:
    for epoch, step in ((1, 0), (1, 40), (2, 0), (2, 10)):
        save_snapshot(tmp_path, epoch, {"epochs_done": epoch, "step": step}, keep=3, step=step)
    assert snapshot_path(tmp_path, 2, 10).name == "snapshot-epoch-000002-step-00000010.pt"
    assert [pos for pos, _ in list_positions(tmp_path)] == [(2, 10), (2, 0), (1, 40)]  # the oldest pruned
    assert [epoch for epoch, _ in list_snapshots(tmp_path)] == [2]  # end-of-epoch ones only
    found = newest_valid_position(tmp_path, print, at_most=(2, 0))
    assert found is not None and found[0] == (2, 0) and found[1]["step"] == 0
