"""The decisions of `--interruptible`, without a machine: what is bid, which offers a bid can rent, what counts as a
lost machine, what an interruption cost, which snapshot a new set resumes from, and the one-line refusals."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from launcher.errors import RunStopRequested, SpecError
from launcher.places.vast.errors import VastRateLimited
from launcher.places.vast.interruptible import (
    NODE_LOST,
    LossWatch,
    bid_for,
    biddable,
    interruption_cost,
    lost_reason,
    spent_between,
)
from launcher.places.vast.models import Offer
from launcher.places.vast.offers import OfferError, OfferFilter, build_query
from launcher.places.vast.resume_files import SNAPSHOT_MAGIC, newest_snapshot, snapshot_holds
from launcher.spec.vast_request import VastRequest


def _offer(offer_id: int, min_bid: float | None) -> Offer:
    obj = {"id": offer_id, "machine_id": 400 + offer_id, "dph_base": 0.5, "dph_total": 0.5}
    if min_bid is not None:
        obj["min_bid"] = min_bid
    return Offer.from_json(obj)


def test_the_default_bid_is_the_measured_min_bid_plus_a_quarter_rounded_up() -> None:
    assert bid_for(_offer(1, 0.044), None) == pytest.approx(0.055)
    assert bid_for(_offer(1, 0.1001), None) == pytest.approx(0.1252)  # 0.125125 rounded up to $0.0001
    assert bid_for(_offer(1, 0.0001), None) == pytest.approx(0.001)  # Vast's least price
    assert bid_for(_offer(1, 0.3), 0.35) == 0.35  # --bid as given


def test_offers_above_the_bid_or_without_min_bid_are_not_rented() -> None:
    offers = [_offer(1, 0.2), _offer(2, 0.05), _offer(3, None)]
    assert [o.id for o in biddable(offers, 0.1)] == [2]
    assert [o.id for o in biddable(offers, None)] == [1, 2]
    with pytest.raises(OfferError, match=r"lowest min_bid is \$0.0500/hour, above --bid \$0.01; raise --bid"):
        biddable(offers, 0.01)


def test_an_interruptible_search_asks_for_bid_offers() -> None:
    assert build_query(OfferFilter(interruptible=True))["type"] == "bid"
    assert build_query(OfferFilter())["type"] == "on-demand"


@pytest.mark.parametrize(("obj", "lost"), [
    ({"id": 1, "actual_status": "running", "intended_status": "running"}, None),
    ({"id": 1, "actual_status": "loading", "intended_status": "running"}, None),
    ({"id": 1, "actual_status": "stopped", "intended_status": "running", "cur_state": "stopped"},
     "stopped by the market (outbid: actual_status stopped, intended_status running, cur_state stopped)"),
    ({"id": 1, "actual_status": "offline", "intended_status": "running"}, "actual_status offline"),
    ({"id": 1, "actual_status": "exited", "intended_status": "running"}, "actual_status exited"),
    (None, "gone from Vast.ai's instance list"),
])
def test_what_counts_as_a_lost_machine(obj, lost) -> None:
    said = lost_reason(obj)
    assert (said is None) if lost is None else (said is not None and said.startswith(lost))


def test_the_loss_watch_asks_the_api_at_most_every_few_seconds_and_stops_the_run_on_a_loss() -> None:
    now = [100.0]
    answers: list[dict | Exception] = [{}, VastRateLimited("429"), {0: {"instance_id": 7,
                                                                        "reason": "stopped by the market"}}]
    asked: list[float] = []

    def check() -> dict:
        asked.append(now[0])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = LossWatch(cost=lambda: "$0.01", check=check, follow=lambda: None, clock=lambda: now[0])
    assert watch() == "$0.01 interruptible" and asked == [100.0]
    now[0] = 101.0
    watch()
    assert asked == [100.0]  # not yet: one list request every CHECK_EVERY_S
    now[0] = 104.0
    watch()  # the API answered 429: asked again at the next check, the run goes on
    now[0] = 107.0
    with pytest.raises(RunStopRequested) as stop:
        watch()
    assert stop.value.reason == NODE_LOST and watch.detected_at == 107.0 and watch.lost == {
        0: {"instance_id": 7, "reason": "stopped by the market"}}


def test_an_interruption_costs_the_work_redone_and_the_gap_from_the_ledger() -> None:
    hour = 3600.0
    instances = [  # the lost set: the lost machine stopped (storage only) from the loss; the survivor; the new set
        {"dph": 1.0, "storage_dph": 0.1, "created_at": 0, "destroyed_at": 2 * hour, "stops": [[hour, None]]},
        {"dph": 1.0, "storage_dph": 0.1, "created_at": 0, "destroyed_at": 2 * hour},
        {"dph": 2.0, "storage_dph": 0.1, "created_at": 2 * hour, "destroyed_at": None},
    ]
    assert spent_between(instances, 0, hour) == pytest.approx(2.0)
    cost = interruption_cost(instances, snapshot_at=0.5 * hour, lost_at=hour, training_at=2.5 * hour)
    assert cost["redone_usd"] == pytest.approx(1.0)  # two machines, half an hour
    assert cost["gap_usd"] == pytest.approx(0.1 + 1.0 + 1.0)  # storage; the survivor; the new one's half hour
    assert cost["cost_usd"] == pytest.approx(3.1)


def _snapshot(folder: Path, epoch: int, payload: bytes, torn: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"snapshot-epoch-{epoch:06d}.pt"
    digest = hashlib.sha256(payload).hexdigest().encode()
    path.write_bytes(SNAPSHOT_MAGIC + digest + b"\n" + (payload[:-1] if torn else payload))
    return path


def test_the_new_set_resumes_from_the_newest_snapshot_whose_checksum_holds(tmp_path) -> None:
    survivor, live = tmp_path / "nodes/1/out/snapshots", tmp_path / "live/0/out/snapshots"
    _snapshot(live, 1, b"one")
    _snapshot(survivor, 2, b"two")
    torn = _snapshot(live, 3, b"three", torn=True)  # caught mid-write: not resumed from
    assert not snapshot_holds(torn)
    assert newest_snapshot([survivor, live]) == (2, survivor / "snapshot-epoch-000002.pt")
    assert newest_snapshot([tmp_path / "none"]) is None


def test_bid_without_interruptible_and_bids_out_of_bounds_are_one_line_refusals() -> None:
    with pytest.raises(SpecError, match="add --interruptible"):
        VastRequest(bid=0.2)
    for bad in (-0.1, 0.0, 200.0):
        with pytest.raises(SpecError, match="between 0.001 and 128"):
            VastRequest(interruptible=True, bid=bad)
    assert VastRequest(interruptible=True, bid=0.2).bid == 0.2


@pytest.mark.parametrize(("args", "said", "code"), [
    (["--provider", "vast", "--image", "x", "--bid", "0.2"],
     "error: --bid 0.2 is the price of an interruptible machine: add --interruptible, or drop --bid", 1),
    (["--provider", "vast", "--image", "x", "--interruptible", "--bid", "-1"],
     "error: --bid must be $/hour per machine between 0.001 and 128, not -1", 1),
    (["--provider", "vast", "--image", "x", "--interruptible", "--bid", "abc"],
     "error: Invalid value for '--bid'", 2),
    (["--interruptible"], "error: --interruptible is for --provider vast only: add --provider vast", 1),
    (["--host", "a@b", "--interruptible", "--bid", "0.3"], "--provider vast", 1),
    (["--provider", "vast", "--image", "x", "--interruptible", "--detach"],
     "error: --interruptible needs `up` to follow the run", 1),
])
def test_bad_interruptible_options_are_one_line_before_anything_is_rented(args, said, code, tmp_path,
                                                                           monkeypatch) -> None:
    from tests.cli_in_process import ddpctl_in_process

    monkeypatch.setenv("VAST_API_KEY", "k")
    monkeypatch.setenv("DDPCTL_VAST_URL", "http://127.0.0.1:9")  # never asked: refused before any request
    refused = ddpctl_in_process("up", "--runs-dir", str(tmp_path / "runs"), *args)
    assert refused.returncode == code and said in refused.stderr and len(refused.stderr.splitlines()) == 1, refused
    assert not (tmp_path / "runs").exists()


def test_a_destroyed_sets_host_keys_are_forgotten_so_its_address_can_be_rented_again(tmp_path) -> None:
    from launcher.places.vast.interruptible_provider import forget_host_keys

    known = tmp_path / "known_hosts"
    known.write_text("[10.0.0.2]:40022 ssh-ed25519 A1\n10.0.0.3 ssh-ed25519 A2\n[10.0.0.4]:22022 ssh-ed25519 A3\n")
    forget_host_keys(known, {"[10.0.0.2]:40022", "10.0.0.3"})
    assert known.read_text() == "[10.0.0.4]:22022 ssh-ed25519 A3\n" and known.stat().st_mode & 0o777 == 0o600


def test_the_summary_table_and_status_line_tell_the_interruptions() -> None:
    from rich.console import Console

    from launcher.results.interruptions import interruption_line
    from launcher.results.progress import summary_table

    console = Console(width=200, record=True)
    console.print(summary_table({"epochs": 4, "interruptions": 1, "interruptions_cost_usd": 0.00099}, "run x"))
    assert re.search(r"interruptions\s+│ 1 \(they cost \$0\.0010\)", console.export_text())
    entry = {"index": 1, "lost_text": "node 0 (vast:5001, machine 401): stopped by the market",
             "seconds_to_training": 24.65, "resumed_from": "after epoch 1 (snapshot-epoch-000001.pt)",
             "cost_usd": 0.000986, "gap_usd": 0.00089, "redone_usd": 0.000097}
    assert interruption_line(entry) == (
        "interruption 1: node 0 (vast:5001, machine 401): stopped by the market; training again 24.6 s after the loss "
        "was seen, resumed after epoch 1 (snapshot-epoch-000001.pt); it cost $0.0010 ($0.0009 while nothing "
        "trained, $0.0001 of work redone)")
    assert "not seen training again" in interruption_line({"index": 2, "lost_text": "x"})


def test_a_bid_offer_is_priced_at_the_bid_for_the_dry_run_and_the_budget() -> None:
    from launcher.places.vast.interruptible_provider import at_bid

    offer = Offer.from_json({"id": 1, "machine_id": 401, "dph_total": 0.044 + 0.0033, "storage_total_cost": 0.0033,
                             "storage_cost": 0.15, "min_bid": 0.044})
    priced = at_bid(offer, bid_for(offer, None))
    assert priced.hourly_price(16) == pytest.approx(0.055 + 0.15 * 16 / 720)  # the bid, and the disk asked for
