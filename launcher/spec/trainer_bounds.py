"""The bounds the trainer's command line applies to its numeric options (trainer/__main__.py), as data, so the
launcher refuses a bad value before anything is written instead of after torchrun started.

Standard library only (the launcher must not import torch). tests/test_bad_input.py checks every row against the
trainer's own parser: a value at each bound is accepted there and one past it refused, so the two cannot drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.errors import SpecError

SEED_MAX = 2**32 - 1  # numpy's and torch's seeds are 32-bit


@dataclass(frozen=True)
class Bound:
    """An option's kind and range: `low` inclusive (or exclusive with `open_low`), `high` inclusive."""

    kind: type
    low: float
    high: float | None = None
    open_low: bool = False

    def accepts(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.open_low else value >= self.low
        return above and (self.high is None or value <= self.high)

    def describe(self) -> str:
        if self.kind is float:
            return "positive and finite" if self.open_low else f"a finite number >= {self.low:g}"
        if self.high is not None:
            return f"an integer in {int(self.low)}..{int(self.high)}"
        return f"an integer >= {int(self.low)}"


TRAINER_BOUNDS: dict[str, Bound] = {
    "--epochs": Bound(int, 1),
    "--batch-size": Bound(int, 1),
    "--lr": Bound(float, 0, open_low=True),
    "--momentum": Bound(float, 0),
    "--save-every": Bound(int, 1),
    "--keep-snapshots": Bound(int, 1),
    "--seed": Bound(int, 0, SEED_MAX),
    "--synthetic-train-size": Bound(int, 1),
    "--synthetic-test-size": Bound(int, 1),
    "--threads-per-process": Bound(int, 1),
    "--processes": Bound(int, 1),
}


def check_trainer_value(option: str, value: object) -> None:
    """Raise SpecError (`--x must be ..., got V`) when `value` is outside the trainer's bound for `option`."""
    bound = TRAINER_BOUNDS[option]
    if not bound.accepts(value):
        raise SpecError(f"{option} must be {bound.describe()}, got {value!r}")


def check_trainer_args(args: tuple[str, ...]) -> None:
    """Check the values of the bounded options among extra trainer arguments (`--x V` or `--x=V`); other words
    are the trainer's to judge."""
    i = 0
    while i < len(args):
        option, sep, text = args[i].partition("=")
        if option in TRAINER_BOUNDS:
            if not sep:
                if i + 1 >= len(args):
                    raise SpecError(f"{option} needs a value")
                text, i = args[i + 1], i + 1
            check_trainer_value(option, _number(option, text))
        i += 1


def _number(option: str, text: str) -> int | float:
    kind = TRAINER_BOUNDS[option].kind
    try:
        return int(text) if kind is int else float(text)
    except ValueError:
        raise SpecError(f"{option} {text!r} is not {'an integer' if kind is int else 'a number'}") from None
