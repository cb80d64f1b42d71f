"""A host's clock offset from the probe's round trip (launcher/planning/clock_offset.py), computed on recorded
stamps, and when the nodes' offsets matter to torchrun's rendezvous (more than 10 s apart, beyond the
measurement's uncertainty). The skewed host of the test bed is tests/faults/test_clock_skew.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence

import pytest

from launcher.planning.clock_offset import SKEW_LIMIT, ClockOffset, ClockSkew, widest_skew
from launcher.planning.host_round import run_probe
from launcher.remote import probe_round
from launcher.transport.ssh import CommandResult


@pytest.mark.parametrize(("stamps", "offset", "uncertainty"), [
    # sent, host start, host end, received: a host 600 s behind, 0.15 s of network and start-up around 1 s of work
    ((1000.0, 400.05, 401.05, 1001.2), -600.05, 0.1),
    # a host 2.5 s ahead answering at once over a 40 ms round trip
    ((50.0, 52.52, 52.52, 50.04), 2.5, 0.02),
    # the same clock: the host's stamps fall inside the round trip
    ((10.0, 10.3, 10.7, 11.0), 0.0, 0.3),
    # stamps that cannot be (the host worked longer than the round trip): no negative uncertainty
    ((10.0, 10.0, 12.0, 11.0), 0.5, 0.0),
])
def test_the_offset_is_the_middle_of_what_the_round_trip_allows(stamps: tuple[float, float, float, float],
                                                                offset: float, uncertainty: float) -> None:
    measured = ClockOffset.measured(*stamps)
    assert measured.offset == pytest.approx(offset) and measured.uncertainty == pytest.approx(uncertainty)
    sent, start, end, received = stamps
    # every offset within the uncertainty puts the host's probe inside the round trip (when one can)
    if end - start <= received - sent:
        for o in (measured.offset - measured.uncertainty, measured.offset + measured.uncertainty):
            assert start - o >= sent - 1e-9 and end - o <= received + 1e-9


def test_the_widest_skew_is_between_the_nodes_furthest_apart() -> None:
    offsets = [ClockOffset(0.2, 0.01), ClockOffset(-600.0, 0.02), None, ClockOffset(3.0, 0.05)]
    skew = widest_skew(["a", "b", "c", "d"], offsets)
    assert skew == ClockSkew(ahead="d", behind="b", seconds=pytest.approx(603.0), margin=pytest.approx(0.07))
    assert skew is not None and skew.matters
    line = skew.problem()
    assert line.startswith("d's clock is 603.0 s ahead of b's (± 0.07 s): torchrun's rendezvous drops a node")
    assert "more than 10 s apart split the run" in line and "timedatectl set-ntp true" in line


@pytest.mark.parametrize(("seconds", "margin", "matters"), [
    (SKEW_LIMIT + 0.5, 0.1, True), (SKEW_LIMIT + 0.5, 1.0, False), (SKEW_LIMIT - 0.1, 0.0, False),
    (3.0, 0.01, False), (600.0, 5.0, True),
])
def test_a_skew_matters_only_beyond_the_limit_at_its_smallest(seconds: float, margin: float, matters: bool) -> None:
    assert ClockSkew("a", "b", seconds, margin).matters is matters


def test_one_measured_node_has_no_skew() -> None:
    assert widest_skew(["a", "b"], [ClockOffset(-600.0, 0.1), None]) is None
    assert widest_skew(["a"], [ClockOffset(0.0, 0.1)]) is None


def test_shown_offsets_say_the_sign_and_the_uncertainty() -> None:
    assert ClockOffset(0.0123, 0.004).shown == "+0.012 s ± 0.004"
    assert ClockOffset(-600.08, 0.021).shown == "-600.1 s ± 0.021"
    assert ClockOffset(-600.08, 0.021).to_json() == {"offset_s": -600.08, "uncertainty_s": 0.021}


def test_the_probe_program_stamps_its_start_and_its_answer() -> None:
    before = time.time()
    answer = json.loads(probe_round.answered({"clock": [before], "facts": {}}))
    assert answer["clock"][0] == before <= answer["clock"][1] <= time.time()
    again = json.loads(probe_round.answered(answer))  # stamped once more: still two stamps
    assert len(again["clock"]) == 2 and again["clock"][0] == before


class SkewedHost:
    """A connection whose host answers the probe as a host `skew` seconds off this machine's clock would, after
    `work` seconds, with `stamps` in its answer (None: an older probe without them)."""

    label = "skewed"

    def __init__(self, skew: float, work: float = 0.05, stamps: bool = True) -> None:
        self.skew, self.work, self.stamps = skew, work, stamps

    def run(self, argv: Sequence[str], *, timeout: float | None = None,
            stdin: bytes | Iterable[bytes] | None = None) -> CommandResult:
        start = time.time() + self.skew
        time.sleep(self.work)
        answer = {"facts": {"python": "3.11.7", "cpus": 2}, "checks": []}
        if self.stamps:
            answer["clock"] = [start, time.time() + self.skew]
        return CommandResult(0, json.dumps(answer) + "\n", "")


@pytest.mark.parametrize("skew", [-600.0, 0.0, 7.5])
def test_run_probe_measures_the_offset_of_the_hosts_answer(skew: float) -> None:
    answer = run_probe(SkewedHost(skew), "python3", "skewed")  # type: ignore[arg-type]
    assert answer.clock is not None
    assert abs(answer.clock.offset - skew) <= answer.clock.uncertainty + 1e-3
    assert answer.clock.uncertainty < 0.05  # the host's own 50 ms of work is not uncertainty


def test_an_answer_without_stamps_has_no_offset() -> None:
    assert run_probe(SkewedHost(0.0, stamps=False), "python3", "old").clock is None  # type: ignore[arg-type]
