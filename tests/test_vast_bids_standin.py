"""The stand-in's interruptible market, through ddpctl's own client and provisioning: offers priced at min_bid for
`type: bid`, a bid under min_bid refused with the documented `invalid_price`, a bid instance billed at its bid, and
an outbid one stopped by the market as Vast's docs describe it (the loss watch names it)."""

from __future__ import annotations

import pytest

from infra import vast_bids
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import VastError
from launcher.places.vast.interruptible import bid_for, lost_nodes
from launcher.places.vast.offers import OfferFilter, search_offers
from launcher.places.vast.provision import provision

pytestmark = pytest.mark.integration


def test_a_bid_machine_is_rented_at_its_bid_then_outbid_and_seen_lost() -> None:
    offers = [make_offer(1, 401, dph_base=0.10), make_offer(2, 402, dph_base=0.20)]
    with VastStandIn(api_key="k", offers=offers, boot_delay_s=0.0) as standin:
        client = VastClient("k", base_url=standin.url)
        found = search_offers(client, OfferFilter(interruptible=True, disk_gb=16))
        assert [(o.id, o.min_bid) for o in found] == [(1, 0.04), (2, 0.08)]
        assert found[0].dph_total == pytest.approx(0.04 + 0.15 * 16 / 720)  # priced at min_bid, 16 GB of disk
        with pytest.raises(VastError, match="invalid_price|below the minimum bid"):
            client.create_instance(1, {"client_id": "me", "image": "x", "disk": 16, "label": "L", "price": 0.01})
        (rented,) = provision(client, found[:1], nodes=1, image="x", disk=16, label="run-1", ssh_public_key="ssh-x",
                              poll_interval=0.05, ssh_ready=lambda _h, _p: True,
                              bid_for=lambda offer: bid_for(offer, None))
        assert standin.instances[rented.instance_id].request["price"] == pytest.approx(0.05)  # 0.04 + 25 %
        assert rented.dph == pytest.approx(0.05 + 0.15 * 16 / 720)  # what the API reports for it
        assert lost_nodes(client, "run-1", {0: rented.instance_id}) == {}

        assert vast_bids.outbid(standin, 401, 0.09) == [rented.instance_id]
        shown = client.show_instance(rented.instance_id)
        assert shown is not None and (shown["actual_status"], shown["intended_status"], shown["cur_state"]) == (
            "stopped", "running", "stopped")
        assert shown["dph_total"] == pytest.approx(0.15 * 16 / 720)  # storage only while stopped
        lost = lost_nodes(client, "run-1", {0: rented.instance_id})
        assert lost[0]["reason"].startswith("stopped by the market (outbid")
        # the machine is the other renter's now: a new search offers it no more
        assert [o.id for o in search_offers(client, OfferFilter(interruptible=True, disk_gb=16))] == [2]
        client.destroy_instance(rented.instance_id)
        assert standin.validation_failures() == []


def test_the_dry_run_prices_the_bid_and_max_cost_is_checked_at_it(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    offers = [make_offer(k, 400 + k, dph_base=0.10 + 0.01 * k, cluster_id=9) for k in range(1, 5)]
    repo = str(Path(__file__).resolve().parent.parent)
    with VastStandIn(api_key="k", offers=offers) as standin:
        env = {**os.environ, "VAST_API_KEY": "k", "DDPCTL_VAST_URL": standin.url, "HOME": str(tmp_path),
               "PYTHONPATH": repo}
        argv = [sys.executable, "-m", "launcher", "up", "--provider", "vast", "--image", "docker.io/x/y:1",
                "--nodes", "2", "--gpus", "1", "--interruptible", "--dry-run", "--runs-dir", str(tmp_path / "runs")]
        shown = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=repo, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert ("bidding $0.0550/hour on offer 1 (its min_bid $0.0440/hour); $0.0600/hour on offer 2 (its min_bid "
                "$0.0480/hour) (min_bid +25%)") in shown.stderr
        assert "$0.1283/hour with 32 GB disk each" in shown.stderr  # 0.055 + 0.060 + 2 x 32 GB of storage
        # $0.11 pays for an hour at min_bid ($0.1053), not at the bid: refused, in one line, nothing rented
        refused = subprocess.run([*argv, "--max-cost", "0.11", "--expected-hours", "1"], capture_output=True,
                                 text=True, env=env, cwd=repo, timeout=120)
        assert refused.returncode == 1 and "2 machine(s) at $0.1283/hour" in refused.stderr
        assert [r for r in standin.requests if r["method"] == "PUT"] == []
