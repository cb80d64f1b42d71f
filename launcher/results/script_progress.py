"""Progress of any training script, read from what its global rank 0 prints (docs/guides/your-own-script.md).

Two sources, the protocol first:
- the protocol: one JSON object on a line of its own, with `"ddpctl"` naming the kind:
  `{"ddpctl": "progress", "epoch": 3, "epochs": 10, "step": 20, "steps": 64, "loss": 0.41}` (any of the fields;
  `steps` is steps per epoch) moves the progress bar; `{"ddpctl": "epoch", "epoch": 3, "seconds": 12.5,
  "samples": 60000, ...}` reports a finished epoch (1-based) and becomes a timing.jsonl record that `ddpctl report`
  reads (`seconds` is required; `epochs`, `steps`, `samples`, `train_loss`, `train_acc`, `val_loss`, `val_acc`,
  `val_seconds` are optional);
- printed lines that look like epochs or steps: "Epoch 3", "epoch 3/10", "[GPU0] Epoch 3 | Batchsize: 32 | Steps:
  64", "step 120", "Step 120/1000": the latest one is shown as it was printed (a 0-based "Epoch 0" stays 0).

Pure functions and one small accumulator: no files, no launcher imports.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

PROTOCOL_KEY = "ddpctl"
_EPOCH = re.compile(r"\bepoch\s*[:#=]?\s*(\d+)(?:\s*(?:/|of)\s*(\d+))?", re.IGNORECASE)
_STEP = re.compile(r"\b(?:step|iter(?:ation)?)\b\s*[:#=]?\s*(\d+)(?:\s*(?:/|of)\s*(\d+))?", re.IGNORECASE)
_STEPS_PER_EPOCH = re.compile(r"\bsteps\s*[:=]\s*(\d+)", re.IGNORECASE)
_LOSS = re.compile(r"\bloss\s*[:=]?\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", re.IGNORECASE)
# The protocol's fields and the progress-record field (docs/contracts.md: progress.json) each becomes.
_PROGRESS_FIELDS = {"epoch": "epoch", "epochs": "epochs", "step": "step", "steps": "steps_per_epoch",
                    "loss": "loss", "samples_per_s": "samples_per_s"}
_EPOCH_FIELDS = ("epochs", "steps", "samples", "train_loss", "train_acc", "val_loss", "val_acc", "val_seconds")


# The range of each number a script may report (larger, smaller, inf or nan: left out, as if not given), so that
# no figure, plot or progress bar is fed a value it cannot draw (1e308 seconds, an epoch of 10**300).
COUNT_MAX = 10**12
FIELD_RANGES: dict[str, tuple[float, float]] = {
    **{name: (0, COUNT_MAX) for name in ("epoch", "epochs", "step", "steps", "samples", "world_size")},
    "seconds": (0, 1e8), "val_seconds": (0, 1e8), "samples_per_s": (0, 1e12),
    **{name: (-1e12, 1e12) for name in ("loss", "train_loss", "val_loss")},
    # Fractions, as timing.jsonl, the report and its plots take them: 0.97, not 97 (which is refused, not scaled).
    **{name: (0, 1) for name in ("train_acc", "val_acc")},
}


def out_of_range(name: str, value: object) -> str | None:
    """Why `value` cannot be field `name` of a record (not a number, not finite, outside FIELD_RANGES); None when
    it can (fields without a range need only be finite numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name}={str(value)[:40]} is not a number"
    if isinstance(value, float) and not math.isfinite(value):  # an int is finite, but may have 4,000 digits
        return f"{name}={value!r} is not finite"
    low, high = FIELD_RANGES.get(name, (-math.inf, math.inf))
    if not low <= value <= high:  # exact for ints of any size: nothing is turned into a float before it is checked
        return f"{name}={_shown(value)} is outside {low:g}..{high:g}"
    if isinstance(value, int) and abs(value) > 2**1023:  # in range only where there is no range: no float holds it
        return f"{name}={_shown(value)} is too large"
    return None


def _shown(value: float) -> str:
    """A number for a message: an int too large for `:g` (no float holds it) by its size."""
    if isinstance(value, float) or abs(value) < 2**53:
        return f"{value:g}"
    return f"an integer of {value.bit_length()} bits"


def _number(value: object, name: str = "") -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or out_of_range(name, value):
        return None
    return float(value)


def protocol_message(line: str) -> dict[str, Any] | None:
    """The protocol object on `line` (`{"ddpctl": KIND, ...}`), or None when the line is not one."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}") and PROTOCOL_KEY in text):
        return None
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        return None
    if not isinstance(message, dict) or message.get(PROTOCOL_KEY) not in ("progress", "epoch"):
        return None
    return message


def progress_from_protocol(message: dict[str, Any]) -> dict[str, Any]:
    """A progress record (progress.json's fields) from a protocol message of either kind."""
    record: dict[str, Any] = {}
    for name, field in _PROGRESS_FIELDS.items():
        number = _number(message.get(name), name)
        if number is None or (number < 0 and field != "loss"):
            continue
        record[field] = number if field in ("loss", "samples_per_s") else int(number)
    if message.get(PROTOCOL_KEY) == "epoch" and "epoch" in record:
        # A finished epoch: the bar stands at its end.
        record.pop("step", None)
        if "steps_per_epoch" in record:
            record["step"] = record["steps_per_epoch"]
        else:
            record["step"], record["steps_per_epoch"] = 1, 1
    return record


def timing_from_protocol(message: dict[str, Any]) -> dict[str, Any] | None:
    """A timing.jsonl record from an `epoch` message (None for any other message, or one without a whole
    `epoch` >= 1 and finite `seconds` >= 0)."""
    epoch, seconds = _number(message.get("epoch"), "epoch"), _number(message.get("seconds"), "seconds")
    if message.get(PROTOCOL_KEY) != "epoch" or epoch is None or seconds is None:
        return None
    if epoch < 1 or epoch != int(epoch) or seconds < 0:
        return None
    record: dict[str, Any] = {"epoch": int(epoch), "seconds": seconds}
    for name in _EPOCH_FIELDS:
        number = _number(message.get(name), name)
        if number is not None:
            record[name] = int(number) if name in ("epochs", "steps", "samples") else number
    if "samples" in record and seconds > 0 and _number(record["samples"] / seconds, "samples_per_s") is not None:
        record["samples_per_s"] = record["samples"] / seconds
    return record


def progress_from_printed(line: str) -> dict[str, Any] | None:
    """The epoch / step a printed line names ("Epoch 3", "epoch 3/10", "Step 120/1000", "[GPU0] Epoch 3 |
    Batchsize: 32 | Steps: 64"), with a loss when it shows one; None for a line that names neither."""
    epoch, step = _EPOCH.search(line), _STEP.search(line)
    if epoch is None and step is None:
        return None
    if any(len(m.group(g) or "") > 12 for m in (epoch, step) if m is not None for g in (1, 2)):
        return None  # a number beyond COUNT_MAX is not a count of epochs or steps
    record: dict[str, Any] = {}
    if epoch is not None:
        record["epoch"] = int(epoch.group(1))
        if epoch.group(2):
            record["epochs"] = int(epoch.group(2))
    if step is not None:
        record["step"] = int(step.group(1))
        if step.group(2):
            record["steps_total"] = int(step.group(2))
    per_epoch = _STEPS_PER_EPOCH.search(line)
    if per_epoch is not None:
        record["steps_per_epoch"] = int(per_epoch.group(1))
    loss = _LOSS.search(line)
    if loss is not None:
        value = float(loss.group(1))
        if math.isfinite(value):
            record["loss"] = value
    return record


class ScriptProgress:
    """The latest progress of a script and its finished-epoch records, fed its output as it arrives (partial
    lines wait for their end). The protocol, once seen, wins over printed lines."""

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None
        self.timing: list[dict[str, Any]] = []
        self.uses_protocol = False
        self._partial = ""

    def feed(self, text: str) -> None:
        """Take the next piece of output."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self.feed_line(line.rsplit("\r", 1)[-1])

    def feed_line(self, line: str) -> None:
        """Take one whole line."""
        message = protocol_message(line)
        if message is not None:
            self.uses_protocol = True
            update = progress_from_protocol(message)
            self.record = {**(self.record or {}), **update, "source": "protocol"} if update else self.record
            timing = timing_from_protocol(message)
            if timing is not None:
                self.timing.append(timing)
            return
        if self.uses_protocol:
            return
        printed = progress_from_printed(line)
        if printed is not None:
            kept = {k: v for k, v in (self.record or {}).items() if k in ("epochs", "steps_per_epoch")}
            if "epoch" not in printed:  # a step line inside the epoch last named
                kept.update({k: v for k, v in (self.record or {}).items() if k == "epoch"})
            self.record = {**kept, **printed, "source": "printed", "line": line.strip()[:120]}


def script_summary(timing: list[dict[str, Any]], last: dict[str, Any] | None) -> dict[str, Any]:
    """summary.json's figures that a script's output gives: from its epoch records, else its latest printed
    epoch."""
    summary: dict[str, Any] = {}
    if timing:
        by_epoch = {r["epoch"]: r for r in timing}  # a restarted epoch: its later record counts
        records = [by_epoch[e] for e in sorted(by_epoch)]
        summary["epochs"] = records[-1]["epoch"]
        summary["train_seconds"] = sum(r["seconds"] for r in records)
        samples = sum(r.get("samples", 0) for r in records)
        if samples and summary["train_seconds"] > 0:
            summary["samples_per_s"] = samples / summary["train_seconds"]
        for name in ("train_acc", "val_acc", "train_loss", "val_loss"):
            if name in records[-1]:
                summary[f"final_{name}"] = records[-1][name]
    elif last and "epoch" in last:
        summary["last_printed_epoch"] = last["epoch"]
    return summary


SCRIPT_TAIL_BYTES = 16384  # how much of the end of rank 0's output `status` reads for a script's progress


def script_record(tail: str, whole: bool) -> dict[str, Any] | None:
    """The progress record the end of a script's rank-0 output gives (`whole`: `tail` starts at the output's first
    byte; else its first, cut, line is skipped): what `status` shows of a run that no `up` follows."""
    progress = ScriptProgress()
    progress.feed(tail if whole else tail.partition("\n")[2])
    progress.feed("\n")  # its last line too, once whole
    return progress.record
