"""`up --provider vast`'s request: what to rent and how to stop paying (a leaf: the command layer builds it)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import SpecError


@dataclass(frozen=True)
class VastRequest:
    """What to rent and how to stop paying: `up`'s Vast.ai options."""

    nodes: int = 1
    gpu_name: str | None = None
    max_price: float | None = None
    min_reliability: float = 0.95
    disk: float = 32.0
    down: bool = False  # destroy the machines as soon as the results are pulled and verified
    max_cost: float | None = None  # USD for the whole run
    max_cost_reserve_s: float = 120.0  # spend kept back for the final stop, pull and teardown
    ready_timeout: float = 900.0
    poll_interval: float = 2.0
    expected_hours: float | None = None  # how long the run takes: an offer's contract must outlast it
    registry_login: bool = False  # send image_login (see registry_login.py) for a private image
    autostop_minutes: float | None = None  # detached runs: stop the machines this long after training ends
    interruptible: bool = False  # rent bid (interruptible) machines; an outbid one is replaced and the run resumed
    bid: float | None = None  # $/hour per machine for --interruptible (None: each offer's min_bid with a margin)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise SpecError(f"--nodes must be at least 1, not {self.nodes}")
        if self.max_cost is not None and self.max_cost <= 0:
            raise SpecError(f"--max-cost must be a positive number of dollars, not {self.max_cost}")
        if self.expected_hours is not None and self.expected_hours <= 0:
            raise SpecError(f"--expected-hours must be a positive number of hours, not {self.expected_hours}")
        if self.autostop_minutes is not None and self.autostop_minutes < 0:
            raise SpecError(f"--autostop must be minutes >= 0 (0: off), not {self.autostop_minutes}")
        if self.bid is not None and not self.interruptible:
            raise SpecError(f"--bid {self.bid:g} is the price of an interruptible machine: add --interruptible, or "
                            "drop --bid to rent on demand")
        if self.bid is not None and not 0.001 <= self.bid <= 128.0:  # Vast's documented bounds of `price`
            raise SpecError(f"--bid must be $/hour per machine between 0.001 and 128, not {self.bid:g}")
        if self.ready_timeout <= 0:
            raise SpecError(f"--ready-timeout must be positive, not {self.ready_timeout}")
