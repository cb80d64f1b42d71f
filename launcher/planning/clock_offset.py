"""Each host's clock against this machine's, measured by the probe's own round trip (NTP's way: the host stamps
when its probe starts and ends, this machine when it sent the request and got the answer), and when the nodes'
offsets matter.

They matter to torchrun: its c10d rendezvous keeps each node's last heartbeat as that node's wall-clock time, and
every node drops as dead a node whose last heartbeat looks older than keep_alive_interval x keep_alive_max_attempt
(5 s x 3 = 15 s, torch's defaults) by its own clock. A heartbeat is up to one interval (5 s) old when read, so two
nodes whose clocks differ by more than 10 s can drop each other: one node is taken for dead, the others form a
smaller world or wait out torch's 300 s exit barrier. SKEW_LIMIT is that 10 s."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

HEARTBEAT_SECONDS = 5.0  # torch's keep_alive_interval default (dynamic_rendezvous.py)
HEARTBEAT_ATTEMPTS = 3  # its keep_alive_max_attempt default
SKEW_LIMIT = HEARTBEAT_SECONDS * HEARTBEAT_ATTEMPTS - HEARTBEAT_SECONDS  # 10 s
SET_CLOCKS = "set the hosts' clocks (NTP: e.g. `timedatectl set-ntp true`, or chrony) and run again"


@dataclass(frozen=True)
class ClockOffset:
    """How far a host's clock is ahead of this machine's (negative: behind), in seconds, give or take
    `uncertainty` (half of the round trip's time outside the host's probe)."""

    offset: float
    uncertainty: float

    @classmethod
    def measured(cls, sent: float, host_start: float, host_end: float, received: float) -> ClockOffset:
        """From this machine's clock when the request left (`sent`) and the answer came (`received`), and the
        host's when its probe started and ended: the host's offset lies between host_end - received and
        host_start - sent (the probe ran within the round trip); the middle of the two, half their distance."""
        late, early = host_start - sent, host_end - received
        return cls(offset=(late + early) / 2, uncertainty=max(late - early, 0.0) / 2)

    @property
    def shown(self) -> str:
        """E.g. `+0.012 s ± 0.004` or `-600.1 s ± 0.02`."""
        digits = 3 if abs(self.offset) < 10 else 1
        return f"{self.offset:+.{digits}f} s ± {self.uncertainty:.2g}"

    def to_json(self) -> dict[str, float]:
        return {"offset_s": round(self.offset, 4), "uncertainty_s": round(self.uncertainty, 4)}


@dataclass(frozen=True)
class ClockSkew:
    """The widest skew between two nodes: `ahead` is `seconds` ahead of `behind` (at least `seconds - margin`)."""

    ahead: str
    behind: str
    seconds: float
    margin: float

    @property
    def matters(self) -> bool:
        """Whether the skew is over SKEW_LIMIT even at its smallest within the measurement's uncertainty."""
        return self.seconds - self.margin > SKEW_LIMIT

    def problem(self) -> str:
        """The one line that says what the skew does and what to do."""
        lifetime = HEARTBEAT_SECONDS * HEARTBEAT_ATTEMPTS
        return (f"{self.ahead}'s clock is {self.seconds:.1f} s ahead of {self.behind}'s (± {self.margin:.2g} s): "
                f"torchrun's rendezvous drops a node whose heartbeat looks over {lifetime:g} s old by another node's "
                f"clock, so clocks more than {SKEW_LIMIT:g} s apart split the run: {SET_CLOCKS}")


def widest_skew(labels: Sequence[str], offsets: Sequence[ClockOffset | None]) -> ClockSkew | None:
    """The pair of measured nodes whose clocks differ most (None with fewer than two measured)."""
    measured = [(label, o) for label, o in zip(labels, offsets, strict=True) if o is not None]
    pairs = [(a, b) if a[1].offset >= b[1].offset else (b, a) for a, b in itertools.combinations(measured, 2)]
    if not pairs:
        return None
    (ahead, high), (behind, low) = max(pairs, key=lambda p: p[0][1].offset - p[1][1].offset)
    return ClockSkew(ahead, behind, high.offset - low.offset, high.uncertainty + low.uncertainty)
