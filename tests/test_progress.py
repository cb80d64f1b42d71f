"""Which progress record `up` shows while it follows a multi-node run, and when it says nothing has moved."""

from __future__ import annotations

from rich.console import Console

from launcher.results.progress import STALL_HINT_SECONDS, FreshestProgress, stall_note, summary_table


def record(step: int, state: str = "training") -> dict[str, object]:
    return {"epoch": 1, "epochs": 2, "step": step, "steps_per_epoch": 10, "samples_per_s": 5.0, "state": state}


def test_the_record_shown_is_the_one_that_changed_last_whatever_node_writes_it() -> None:
    picker = FreshestProgress(3)
    assert picker.freshest() is None and picker.record(0) is None
    # rank 0 is on node 1 (its address sorts first): node 0 has no record at all
    picker.observe(0, None, now=1.0)
    picker.observe(1, record(3), now=1.0)
    assert picker.freshest() == 1 and picker.record(1) == record(3) and picker.record(0) is None
    # after a restart rank 0 lands on node 2; node 1's file stays behind, unchanged
    picker.observe(1, record(3), now=5.0)
    picker.observe(2, record(1), now=5.0)
    assert picker.freshest() == 2 and picker.record(1) is None and picker.record(2) == record(1)


def test_a_stall_is_noted_only_while_training_and_only_after_the_threshold() -> None:
    picker = FreshestProgress(2)
    picker.observe(0, record(4), now=100.0)
    assert picker.stalled_for(now=100.0 + STALL_HINT_SECONDS - 1) is None
    stalled = picker.stalled_for(now=100.0 + STALL_HINT_SECONDS + 60)
    assert stalled is not None and stall_note(stalled).startswith("[no progress for 6 min")
    picker.observe(0, record(5), now=100.0 + STALL_HINT_SECONDS + 61)  # it moved again
    assert picker.stalled_for(now=100.0 + STALL_HINT_SECONDS + 62) is None
    picker.observe(0, record(10, state="validating"), now=1000.0)  # a hang in validation counts too
    assert picker.stalled_for(now=1000.0 + 30, threshold=20) == 30
    picker.observe(0, record(10, state="done"), now=2000.0)
    assert picker.stalled_for(now=10_000.0) is None
    assert stall_note(None) == ""



def test_a_malformed_progress_record_is_read_as_far_as_it_can_be() -> None:
    from launcher.results.progress import progress_record

    for junk in (None, [], [1, 2], "epoch 3", 7, 1.5, True):
        assert progress_record(junk) is None
    assert progress_record({}) == {}
    assert progress_record({"epoch": "2", "epochs": 3.0, "step": "x", "steps_per_epoch": None,
                            "samples_per_s": "1e3", "state": ["training"], "note": "kept"}) == {
        "epoch": 2, "epochs": 3, "samples_per_s": 1000.0, "note": "kept"}
    assert progress_record({"epoch": float("nan"), "step": "inf", "epochs": True, "samples_per_s": {}}) == {}
    assert progress_record(record(4)) == record(4)


def test_the_live_display_survives_whatever_a_host_writes_as_progress() -> None:
    from launcher.results.progress import RunProgress

    picker = FreshestProgress(2)
    with RunProgress(["a", "b"], enabled=False) as display:
        for junk in ([1, 2], "text", 3, {"epoch": "x", "epochs": [], "step": None, "state": 5},
                     {"epoch": -4, "epochs": 0, "step": -1, "steps_per_epoch": -2, "samples_per_s": "fast"}):
            picker.observe(0, junk, now=1.0)
            display.update(0, junk, "running")
            display.update(1, picker.record(0), "running")
        assert picker.freshest() == 0 and picker.stalled_for(now=10_000.0) is not None
        picker.observe(1, ["not", "a", "record"], now=2.0)  # ignored: node 0's record stays the one shown
        assert picker.freshest() == 0
        task = display._progress.tasks[0]
        assert task.description == "" and "epoch 1/1 step 0/1" in task.fields["status"]


def test_the_summary_table_shows_the_run_id_on_one_line() -> None:
    """The id is what a user copies into `ddpctl status`: the table is made wide enough for its title."""
    run_id = "resnet18-cifar10-a-rather-long-run-name-20261123-000812-ab12"
    console = Console(width=100, record=True, color_system=None)
    console.print(summary_table({"world_size": 4, "epochs": 3, "train_seconds": 12.5}, f"run {run_id}"))
    text = console.export_text()
    assert any(run_id in line for line in text.splitlines())
    assert "12.5 s" in text
