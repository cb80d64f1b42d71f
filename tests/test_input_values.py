"""Values that cross into a path, an argv, an environment, a plot or a file name are checked where they enter, with
one line: a config file nested thousands deep or that is a FIFO or a device, a NUL byte in any option value
(`--env`, `host`, paths) from a config file or a recorded run, JSON nested too deeply in a run record or on a
script's output, numbers a script reports that no figure can use (inf, nan, 1e308) on their way to `report`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.config import read_config
from launcher.cli.options import declared_options
from launcher.errors import SpecError
from launcher.results.progress import progress_record, summary_table
from launcher.results.record import RecordError, load_json_file
from launcher.results.report import write_report
from launcher.results.run_figures import build_report
from launcher.results.script_progress import (
    out_of_range,
    progress_from_printed,
    progress_from_protocol,
    protocol_message,
    timing_from_protocol,
)
from tests.testbed_fixtures import REPO


def declared() -> dict:
    from launcher.cli.app import up

    return declared_options(up)


NUL_CONFIGS = {
    "env": 'env = ["TOKEN=ab\\u0000cd"]\n',
    "host": 'host = ["node\\u0000one"]\n',
    "python": 'python = "python3\\u0000x"\n',
}


@pytest.mark.parametrize("key", sorted(NUL_CONFIGS))
def test_a_nul_byte_in_any_config_value_is_one_line(tmp_path: Path, key: str) -> None:
    config = tmp_path / "run.toml"
    config.write_text(NUL_CONFIGS[key])
    with pytest.raises(SpecError) as refused:
        read_config(config, declared())
    assert str(refused.value) == (f"--config {config}: {key} holds a NUL byte (\\0), which no path, argument or "
                                  "environment value can carry: remove it")


def test_a_config_nested_thousands_deep_or_not_a_file_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SpecError, match="nested too deeply to be a file of launch options"):
        read_config(deep, declared())
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError) as refused:
        read_config(fifo, declared())  # never waits for a writer
    assert str(refused.value) == f"--config {fifo} is a FIFO (named pipe), not a regular file: give a TOML file"
    with pytest.raises(SpecError, match="is a character device, not a regular file"):
        read_config(Path("/dev/zero"), declared())  # never reads without end


def test_a_run_record_nested_too_deeply_is_a_record_error(tmp_path: Path) -> None:
    record = tmp_path / "run.json"
    record.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecordError, match="run.json: nested too deeply to be a run record"):
        load_json_file(record)


def test_numbers_a_script_reports_that_no_figure_can_use_are_left_out() -> None:
    for extreme in (1e308, float("inf"), float("nan"), -1.0):
        assert timing_from_protocol({"ddpctl": "epoch", "epoch": 1, "seconds": extreme}) is None
    assert timing_from_protocol({"ddpctl": "epoch", "epoch": 1e308, "seconds": 1.0}) is None
    kept = timing_from_protocol({"ddpctl": "epoch", "epoch": 2, "seconds": 1e-320, "samples": 1e308,
                                 "train_loss": float("nan"), "val_acc": 0.5})
    assert kept == {"epoch": 2, "seconds": 1e-320, "val_acc": 0.5}  # samples out of range: no samples_per_s either
    assert progress_from_protocol({"ddpctl": "progress", "epoch": 1e300, "step": 3, "loss": 1e308}) == {"step": 3}
    assert progress_from_printed("epoch 10000000000000000000000000/3") is None
    assert protocol_message('{"ddpctl": ' + "[" * 100_000 + "]" * 100_000 + "}") is None  # no RecursionError


def test_integers_too_large_for_a_float_are_left_out_wherever_they_are_read() -> None:
    """JSON integers have no size limit: 10**400 is no float (OverflowError), yet it reached `up`'s display."""
    huge = int("1" + "0" * 400)
    line = f'{{"ddpctl": "progress", "epoch": {huge}, "epochs": {huge}, "step": 2}}'
    message = protocol_message(line)
    assert message is not None and progress_from_protocol(message) == {"step": 2}
    assert timing_from_protocol({"ddpctl": "epoch", "epoch": huge, "seconds": 1.0}) is None
    assert timing_from_protocol({"ddpctl": "epoch", "epoch": 1, "seconds": 1.0, "samples": huge}) == {
        "epoch": 1, "seconds": 1.0}
    assert out_of_range("samples", huge) == "samples=an integer of 1329 bits is outside 0..1e+12"
    assert out_of_range("time", huge) == "time=an integer of 1329 bits is too large"  # no range, still no float
    assert progress_record({"epoch": huge, "step": 3, "loss": huge}) == {"step": 3}
    table = summary_table({"train_seconds": huge, "samples_per_s": "fast", "cost_usd": huge, "epochs": [huge]}, "r")
    assert table.row_count == 8  # drawn, no cost row: numbers it cannot show are left out, nothing raised


def test_report_leaves_out_records_it_cannot_draw_saying_so_in_one_line(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = {"epoch": 1, "epochs": 2, "seconds": 2.0, "samples": 640, "samples_per_s": 320.0, "world_size": 2,
            "val_acc": 0.5}
    bad = {**good, "epoch": 2, "seconds": 1e308, "samples_per_s": float("inf")}
    (run / "timing.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")  # Infinity: Python's JSON
    report = build_report([run])
    err = capsys.readouterr().err
    assert err == (f"warning: {run / 'timing.jsonl'}: 1 record(s) left out of the report (seconds=1e+308 is outside "
                   "0..1e+08, samples_per_s=inf is not finite)\n")
    files = write_report(report, tmp_path / "out")
    assert all(path.stat().st_size > 0 for path in files)


@pytest.mark.integration
def test_a_nul_byte_in_an_env_value_starts_nothing_and_leaves_no_run_directory(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('epochs = 1\nenv = ["TOKEN=ab\\u0000cd"]\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--config", str(config), "--runs-dir",
                             str(tmp_path / "runs")], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    assert result.stderr == (f"error: --config {config}: env holds a NUL byte (\\0), which no path, argument or "
                             "environment value can carry: remove it\n")
    assert not (tmp_path / "runs").exists()
