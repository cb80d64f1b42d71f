"""What global rank 0 tells about each finished epoch, beside timing.jsonl: one line on stdout (what `ddpctl logs`
and the live display show), scalars.csv (the same numbers for pandas) and TensorBoard event files under
tensorboard/ (torch.utils.tensorboard, which needs the `tensorboard` package: without it the run goes on without
event files, and says so once). Samples/s is also written about once a second while an epoch trains, at the global
step it was measured at: that needs no host sync, unlike a per-step loss, which is written once per epoch.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.files import atomic_write_bytes
from trainer.records import ProgressReporter, TimingLog

TENSORBOARD_DIR = "tensorboard"
CSV_FILE = "scalars.csv"
# The CSV's columns: timing.jsonl's per-epoch numbers, and the learning rate and mean step time.
CSV_COLUMNS = ("epoch", "step", "time", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "samples_per_s",
               "step_seconds", "seconds", "world_size")  # fmt: skip
# TensorBoard tags of the per-epoch scalars, from a row of the CSV.
EPOCH_TAGS = {"train_loss": "loss/train", "val_loss": "loss/val", "train_acc": "accuracy/train",
              "val_acc": "accuracy/val", "lr": "learning_rate", "samples_per_s": "samples_per_s",
              "step_seconds": "step_time_s", "seconds": "epoch_time_s"}  # fmt: skip
LIVE_TAG = "samples_per_s_live"


def open_writer(logdir: Path) -> Any | None:
    """A SummaryWriter on `logdir`, or None (with one line on stderr) when the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional: needs `tensorboard`
    except ImportError as exc:
        print(f"trainer: no TensorBoard event files for this run ({exc}); `pip install tensorboard` to have them",
              file=sys.stderr, flush=True)
        return None
    return SummaryWriter(log_dir=str(logdir), flush_secs=10)


def epoch_line(record: dict[str, Any]) -> str:
    """One finished epoch as people read it (accuracies as percentages; timing.jsonl keeps fractions)."""
    return (f"epoch {record['epoch']}/{record['epochs']}  train loss {record['train_loss']:.4f}  "
            f"acc {100 * record['train_acc']:.2f}%  val loss {record['val_loss']:.4f}  "
            f"acc {100 * record['val_acc']:.2f}%  {record['samples_per_s']:,.0f} samples/s  "
            f"{record['seconds']:.1f} s")  # fmt: skip


def csv_row(record: dict[str, Any], lr: float) -> dict[str, Any]:
    steps = max(1, int(record["steps"]))
    return {
        "epoch": record["epoch"], "step": record["epoch"] * steps, "time": record["time"],
        "train_loss": record["train_loss"], "train_acc": record["train_acc"], "val_loss": record["val_loss"],
        "val_acc": record["val_acc"], "lr": lr, "samples_per_s": record["samples_per_s"],
        "step_seconds": record["seconds"] / steps, "seconds": record["seconds"], "world_size": record["world_size"],
    }  # fmt: skip


class RunLog(TimingLog):
    """timing.jsonl plus the epoch lines, scalars.csv and the event files; `rewrite` is called with every record
    so far after each epoch (and once at the start, with those a resumed snapshot brought, which were told by the
    attempt that trained them)."""

    def __init__(self, out_dir: Path, lr: Callable[[], float], writer: Any | None = None) -> None:
        super().__init__(out_dir / "timing.jsonl")
        self.out_dir = out_dir
        self.lr = lr
        self.writer = writer if writer is not None else open_writer(out_dir / TENSORBOARD_DIR)
        self.rows: list[dict[str, Any]] = []
        self.told: int | None = None  # records already told; None before the first rewrite

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        super().rewrite(records)
        if self.told is None:  # a resumed run's earlier epochs: their rows, told before
            self.rows = [csv_row(r, self.lr()) for r in records]
            self.told = len(records)
        self._tell(records[self.told :])

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        self._tell([record])

    def _tell(self, new: list[dict[str, Any]]) -> None:
        for record in new:
            row = csv_row(record, self.lr())
            self.rows.append(row)
            print(epoch_line(record), flush=True)
            if self.writer is not None:
                for key, tag in EPOCH_TAGS.items():
                    self.writer.add_scalar(tag, row[key], global_step=row["step"], walltime=row["time"])
                self.writer.flush()  # an epoch's scalars are on disk before the next epoch starts
        self.told = (self.told or 0) + len(new)
        self._write_csv()

    def _write_csv(self) -> None:
        text = io.StringIO()
        table = csv.DictWriter(text, fieldnames=CSV_COLUMNS, lineterminator="\n")
        table.writeheader()
        table.writerows(self.rows)
        atomic_write_bytes(self.out_dir / CSV_FILE, text.getvalue().encode())

    def live(self, global_step: int, samples_per_s: float) -> None:
        """Samples/s measured during an epoch (as often as progress.json is written: cheap)."""
        if self.writer is not None:
            self.writer.add_scalar(LIVE_TAG, samples_per_s, global_step=global_step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def progress(self, epochs: int, steps_per_epoch: int) -> ProgressReporter:
        """progress.json, whose writes during an epoch also give the live samples/s scalar."""
        return LoggedProgress(self, epochs, steps_per_epoch)


class LoggedProgress(ProgressReporter):
    def __init__(self, log: RunLog, epochs: int, steps_per_epoch: int) -> None:
        super().__init__(log.out_dir / "progress.json", epochs, steps_per_epoch)
        self.log = log

    def write(self, *, epoch: int, step: int, samples_per_s: float, state: str) -> None:
        super().write(epoch=epoch, step=step, samples_per_s=samples_per_s, state=state)
        if state == "training":
            self.log.live((epoch - 1) * self.steps_per_epoch + step, samples_per_s)
        elif state == "done":
            self.log.close()
