"""What a run reports while and after it trains: timing.jsonl (one line per finished epoch), progress.json
(rewritten about once a second) and summary.json (at the end). Written by global rank 0 only.
"""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from trainer.files import atomic_write_bytes, atomic_write_json

PROGRESS_INTERVAL_S = 1.0


class TimingLog:
    """timing.jsonl: appended once per epoch; rewritten whole on resume so no epoch appears twice."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        atomic_write_bytes(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode())

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


class ProgressReporter:
    """progress.json, rewritten at most about once a second; `due` is a cheap clock check for the hot loop."""

    def __init__(self, path: Path, epochs: int, steps_per_epoch: int) -> None:
        self.path = path
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.next_write = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self.next_write

    def write(self, *, epoch: int, step: int, samples_per_s: float, state: str) -> None:
        self.next_write = time.monotonic() + PROGRESS_INTERVAL_S
        atomic_write_json(
            self.path,
            {
                "epoch": epoch,
                "epochs": self.epochs,
                "step": step,
                "steps_per_epoch": self.steps_per_epoch,
                "samples_per_s": samples_per_s,  # as measured: a rounded one rounds again to another whole number
                "time": time.time(),
                "state": state,
            },
        )


def build_summary(
    records: list[dict[str, Any]], *, wall_start: float, restarts: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """summary.json's content from the epochs' records (the last epoch's metrics are the final ones)."""
    last = records[-1] if records else {}
    train_seconds = sum(r["seconds"] for r in records)
    samples = sum(r["samples"] for r in records)
    return {
        "wall_seconds": time.time() - wall_start,
        "train_seconds": train_seconds,
        "epochs": len(records),
        "final_train_acc": last.get("train_acc"),
        "final_val_acc": last.get("val_acc"),
        "final_train_loss": last.get("train_loss"),
        "final_val_loss": last.get("val_loss"),
        "samples_per_s": samples / train_seconds if train_seconds > 0 else None,
        "restarts": restarts,
        **extra,
    }


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    atomic_write_json(path, summary)


def versions() -> dict[str, str | None]:
    """What produced the numbers: python, torch, torchvision (None when it cannot be imported), ddpctl."""
    try:
        import torchvision  # noqa: PLC0415 - optional

        vision: str | None = torchvision.__version__
    except Exception:  # a torchvision built for another torch raises RuntimeError
        vision = None
    try:
        ddpctl: str | None = metadata.version("ddpctl")
    except metadata.PackageNotFoundError:  # the trainer shipped as plain code to a host
        ddpctl = None
    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": vision, "ddpctl": ddpctl}
