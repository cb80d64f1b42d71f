"""trainer/run_log.py in process: what rank 0 tells per epoch, with and without the tensorboard package."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.run_log import RunLog, epoch_line


def record(epoch: int) -> dict[str, Any]:
    return {"epoch": epoch, "epochs": 3, "seconds": 2.0, "val_seconds": 0.1, "samples": 640, "samples_per_s": 320.0,
            "steps": 10, "train_loss": 1.0 / epoch, "train_acc": 0.5, "val_loss": 1.5 / epoch, "val_acc": 0.25,
            "world_size": 2, "restart_count": 0, "time": 1000.0 + epoch}


def test_without_tensorboard_the_run_says_so_once_and_keeps_its_lines_and_csv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    log = RunLog(tmp_path, lambda: 0.05)
    records = [record(1)]
    log.rewrite(records)  # a resumed run's first call: nothing new to tell
    records.append(record(2))
    log.rewrite(records)
    records.append(record(3))
    log.rewrite(records)
    out, err = capsys.readouterr()
    assert out.splitlines() == [epoch_line(record(2)), epoch_line(record(3))]
    assert epoch_line(record(2)) == ("epoch 2/3  train loss 0.5000  acc 50.00%  val loss 0.7500  acc 25.00%  "
                                     "320 samples/s  2.0 s")
    assert err.count("no TensorBoard event files for this run") == 1 and "pip install tensorboard" in err
    assert not (tmp_path / "tensorboard").exists()
    with (tmp_path / "scalars.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]  # the resumed epoch's row is kept, not told again
    assert {float(r["lr"]) for r in rows} == {0.05} and {float(r["step_seconds"]) for r in rows} == {0.2}
