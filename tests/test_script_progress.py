"""A script's progress read from its printed lines and the JSON protocol, the live tail's lines, the rank layout,
restarts from attempt folders, and the state poll's extra output (the real shell script, run here)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import SpecError
from launcher.execute.following.live_tail import OutputTail
from launcher.results.progress import script_status
from launcher.results.rank_layout import RankLayout, order_by_address
from launcher.results.restarts import restarts_in, restarts_phrase
from launcher.results.script_progress import ScriptProgress, progress_from_printed, script_record, script_summary
from launcher.runtimes.native import OutputRequest, read_state


@pytest.mark.parametrize(("line", "expected"), [
    ("Epoch 3", {"epoch": 3}),
    ("epoch 3/10", {"epoch": 3, "epochs": 10}),
    ("[GPU0] Epoch 3 | Batchsize: 32 | Steps: 64", {"epoch": 3, "steps_per_epoch": 64}),
    ("step 120", {"step": 120}),
    ("Step 120/1000 loss=0.25", {"step": 120, "steps_total": 1000, "loss": 0.25}),
    ("Train Epoch: 2 [640/60000 (1%)]\tLoss: 2.1", {"epoch": 2, "loss": 2.1}),
])
def test_printed_epochs_and_steps_are_recognised(line: str, expected: dict[str, Any]) -> None:
    assert progress_from_printed(line) == expected


@pytest.mark.parametrize("line", ["loading data", "Steps: 64", "epochs=10 planned", "restep 3"])
def test_lines_without_an_epoch_or_step_are_not_progress(line: str) -> None:
    assert progress_from_printed(line) is None


def test_the_latest_printed_line_wins_and_partial_lines_wait() -> None:
    script = ScriptProgress()
    script.feed("[GPU0] Epoch 0 | Batchsize: 32 | Steps: 8\n[GPU0] Ep")
    assert script.record is not None and script.record["epoch"] == 0
    script.feed("och 1 | Batchsize: 32 | Steps: 8\nstep 5\n")
    assert script.record["epoch"] == 1 and script.record["step"] == 5 and script.record["steps_per_epoch"] == 8
    assert script_status(script.record) == ("epoch 1 step 5/8", None)  # no total epochs: no bar


def test_the_protocol_gives_a_bar_and_timing_records_and_outranks_printed_lines() -> None:
    script = ScriptProgress()
    script.feed(json.dumps({"ddpctl": "progress", "epoch": 2, "epochs": 4, "step": 3, "steps": 8}) + "\n")
    assert script.record is not None
    assert script_status(script.record) == ("epoch 2/4 step 3/8", (32, 11))
    script.feed("Epoch 99\n")  # once the protocol is used, printed lines no longer move the bar
    assert script.record["epoch"] == 2
    for epoch in (1, 2, 2):  # epoch 2 again after a restart: the later record counts
        script.feed(json.dumps({"ddpctl": "epoch", "epoch": epoch, "epochs": 4, "seconds": 2.0, "samples": 100,
                                "val_acc": 0.5 + epoch / 10}) + "\n")
    assert [r["epoch"] for r in script.timing] == [1, 2, 2] and script.timing[0]["samples_per_s"] == 50.0
    summary = script_summary(script.timing, script.record)
    assert summary == {"epochs": 2, "train_seconds": 4.0, "samples_per_s": 50.0, "final_val_acc": 0.7}


@pytest.mark.parametrize("line", ['{"ddpctl": "epoch", "epoch": 0, "seconds": 1}',  # epochs are 1-based
                                  '{"ddpctl": "epoch", "epoch": 1}',  # seconds required
                                  '{"ddpctl": "epoch", "epoch": 1, "seconds": "NaN"}',
                                  '{"ddpctl": "other", "epoch": 1, "seconds": 1}', '{"ddpctl": "epoch", "epo'])
def test_malformed_epoch_messages_make_no_timing_record(line: str) -> None:
    script = ScriptProgress()
    script.feed(line + "\n")
    assert script.timing == []


def test_status_reads_the_newest_progress_from_the_end_of_a_scripts_output() -> None:
    progress = '{"ddpctl": "progress", "epoch": 4, "epochs": 9, "step": 2, "steps": 5, "loss": 0.3}'
    cut = progress[20:] + "\n" + "epoch 7 loss 0.9\n"  # a tail that begins inside a protocol line
    assert script_record(cut, whole=False) == {"epoch": 7, "loss": 0.9, "source": "printed", "line": "epoch 7 loss 0.9"}
    tail = "epoch 1 loss 2.0\n" + progress + "\nstep 3 loss 5\n"  # its last line whole: read too
    record = script_record(tail, whole=True) or {}
    assert {k: record.get(k) for k in ("epoch", "epochs", "step", "steps_per_epoch", "loss", "source")} == {
        "epoch": 4, "epochs": 9, "step": 2, "steps_per_epoch": 5, "loss": 0.3, "source": "protocol"}  # it outranks
    assert script_record(progress[:30], whole=False) is None  # no whole line yet


def test_the_tail_keeps_the_last_lines_cleaned_and_hides_protocol_lines() -> None:
    tail = OutputTail(lines=3)
    done = tail.feed("a\n\x1b[31mred\x1b[0m\n" + '{"ddpctl": "progress", "epoch": 1}\n' + "10%\r50%\r100%\nnext")
    assert done == ["a", "red", "100%"]
    assert tail.lines() == ["red", "100%", "next"]  # the unfinished line is shown too
    tail.restart()
    tail.feed("after restart\n")
    assert tail.lines() == ["100%", "next", "after restart"]


def test_global_ranks_follow_the_rendezvous_address_order() -> None:
    # c10d sorts nodes by --local-addr as text: "10.0.0.10" comes before "10.0.0.9".
    order = order_by_address(["10.0.0.9", "10.0.0.10"])
    layout = RankLayout(2, order)
    assert layout.locate(0) == (1, 0) and layout.locate(3) == (0, 1) and layout.global_rank(0, 0) == 2
    assert order_by_address(["h", "h"]) == (0, 1) and order_by_address([None, "x"]) == (0, 1)
    with pytest.raises(SpecError, match="ranks 0-3"):
        layout.locate(4)


def test_restarts_are_the_newest_attempt_folder(tmp_path: Path) -> None:
    assert restarts_in(tmp_path) == 0
    for n in (0, 1, 2, 10):
        (tmp_path / "rdzv_x" / f"attempt_{n}").mkdir(parents=True)
    (tmp_path / "rdzv_x" / "attempt_x").mkdir()
    assert restarts_in(tmp_path) == 10
    assert [restarts_phrase(n) for n in (0, 1, 2)] == ["no restart", "1 restart", "2 restarts"]


class _Shell:
    """Runs a command here, as a host would run it over SSH, for a user whose home is `home` (never this machine's
    own: the node program keeps its compilation in ~/.ddpctl where that exists)."""

    def __init__(self, home: Path) -> None:
        self.env = {**os.environ, "HOME": str(home)}

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> Any:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, input=stdin or b"",
                              env=self.env)

        class Result:
            exit_code = done.returncode
            stdout = done.stdout.decode(errors="replace")
            stderr = done.stderr.decode(errors="replace")

        return Result()


def test_the_state_poll_brings_new_output_by_offset_and_the_rest_of_an_ended_attempt(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    first = ws / "logs" / "run_a" / "attempt_0" / "0"
    first.mkdir(parents=True)
    (first / "stdout.log").write_text("one\ntwo\n")
    (ws / "out").mkdir()
    (ws / "out" / "progress.json").write_text('{"epoch": 1}')
    state = read_state(_Shell(tmp_path), str(ws), OutputRequest(0))
    assert (state.attempt, state.output, state.output_from, state.output_to) == (0, "one\ntwo\n", 0, 8)
    assert state.progress == {"epoch": 1}
    with open(first / "stdout.log", "a") as f:
        f.write("three\n")
    second = ws / "logs" / "run_a" / "attempt_1" / "0"
    second.mkdir(parents=True)
    (second / "stdout.log").write_text("resumed\n")
    state = read_state(_Shell(tmp_path), str(ws), OutputRequest(0, attempt=0, offset=8))
    assert (state.attempt, state.output_attempt, state.output) == (1, 0, "three\n")  # the old attempt's rest first
    state = read_state(_Shell(tmp_path), str(ws), OutputRequest(0, attempt=0, offset=14))
    assert (state.output_attempt, state.output, state.output_from) == (1, "resumed\n", 0)
    state = read_state(_Shell(tmp_path), str(ws), OutputRequest(0, attempt=1, offset=0, max_bytes=4))
    assert (state.output, state.output_from) == ("med\n", 4)  # only the newest bytes
    assert read_state(_Shell(tmp_path), str(ws)).output == ""  # nothing asked, nothing sent
    assert read_state(_Shell(tmp_path), str(tmp_path / "gone"), OutputRequest(0)).attempt is None
    # How attempt 0 ended (launcher/spec/attempt_logs.py's note) comes with the poll; the progress record still reads.
    note = {"time": 1.0, "failures": [{"rank": 2, "local_rank": 0, "exitcode": -9, "pid": 7, "time": 1}]}
    (ws / "logs" / "run_a" / "attempt_0" / "ended.json").write_text(json.dumps(note))
    state = read_state(_Shell(tmp_path), str(ws), OutputRequest(0))
    assert state.ended == {0: note} and state.progress == {"epoch": 1} and state.attempt == 1


def test_on_a_terminal_the_tail_is_drawn_under_the_bars() -> None:
    from rich.console import Console

    from launcher.results import progress as progress_module

    sink = open(os.devnull, "w")  # noqa: SIM115 (closed below)
    terminal = Console(force_terminal=True, width=100, record=True, file=sink)
    original = progress_module.console
    progress_module.console = terminal
    try:
        shown = progress_module.RunProgress(["hostA"])
        shown.update(0, {"epoch": 2, "epochs": 4, "source": "printed"}, "running")
        shown.show_output("rank 0 (1 restart):", ["[GPU0] Epoch 1 | Batchsize: 32", "[GPU0] Epoch 2"], [])
        for renderable in shown._progress.get_renderables():
            terminal.print(renderable)
    finally:
        progress_module.console = original
        sink.close()
    text = terminal.export_text()
    assert "epoch 2/4" in text
    assert text.index("epoch 2/4") < text.index("rank 0 (1 restart):") < text.index("  [GPU0] Epoch 2")
