"""Offer queries, real hourly prices and the choice of nodes (one cluster for multi-node)."""

from __future__ import annotations

import json

import pytest

from infra.vast_contract import API_DIR, find_operation, validate_request
from infra.vast_standin import VastStandIn, make_offer
from launcher.providers.vast.client import VastClient
from launcher.providers.vast.models import InstanceState, Offer
from launcher.providers.vast.offers import OfferError, OfferFilter, build_query, choose_offers, search_offers


def _offer(oid: int, machine: int, dph_base: float, cluster: int | None = None, storage_cost: float = 0.15) -> Offer:
    return Offer.from_json(make_offer(oid, machine, dph_base=dph_base, cluster_id=cluster, storage_cost=storage_cost,
                                      dph_total=dph_base + storage_cost * 8 / 720,
                                      storage_total_cost=storage_cost * 8 / 720))


def test_query_has_the_cli_defaults_and_our_filters_and_follows_the_schema():
    q = build_query(OfferFilter(gpu_name="RTX_3080", num_gpus=2, max_price=0.4, disk_gb=50, min_cuda=12.1))
    assert q["verified"] == {"eq": True} and q["rentable"] == {"eq": True} and q["rented"] == {"eq": False}
    assert q["external"] == {"eq": False} and q["type"] == "on-demand" and q["allocated_storage"] == 50
    assert q["gpu_name"] == {"eq": "RTX 3080"} and q["num_gpus"] == {"eq": 2} and q["dph_total"] == {"lte": 0.4}
    assert q["cuda_max_good"] == {"gte": 12.1} and q["disk_space"] == {"gte": 50}
    assert q["direct_port_count"] == {"gte": 1} and q["reliability"] == {"gte": 0.95}
    op, _ = find_operation("POST", "/api/v0/bundles/")
    assert validate_request(op, q, {}) == []


def test_hourly_price_reproduces_the_documented_instance_price():
    """show_instance's example: dph_base 1.0, storage 0.1493 $/GB/month, 10 GB -> dph_total 1.00207."""
    doc = json.loads((API_DIR / "examples" / "show_instance.get.200.json").read_text())["instances"]
    offer = Offer.from_json({**doc, "id": 1})
    assert offer.hourly_price(10) == pytest.approx(doc["dph_total"])
    assert offer.hourly_price(100) == pytest.approx(1.0 + doc["storage_cost"] * 100 / 720)


@pytest.mark.parametrize("kwargs", [dict(num_gpus=0), dict(max_price=-1), dict(min_reliability=1.5),
                                    dict(disk_gb=4), dict(limit=0)])
def test_bad_filters_are_one_line_errors(kwargs):
    with pytest.raises(OfferError) as err:
        OfferFilter(**kwargs)
    assert "\n" not in str(err.value)


def test_search_sorts_by_price_with_our_disk():
    key = "k"
    catalogue = [make_offer(1, 101, dph_base=0.20, storage_cost=0.1),
                 make_offer(2, 102, dph_base=0.18, storage_cost=1.0),
                 make_offer(3, 103, dph_base=0.25, reliability=0.5, reliability2=0.5),
                 make_offer(4, 104, dph_base=0.01, verified=False)]
    with VastStandIn(api_key=key, offers=catalogue) as standin:
        c = VastClient(key, base_url=standin.url)
        assert [o.id for o in search_offers(c, OfferFilter(disk_gb=8))] == [2, 1]
        assert [o.id for o in search_offers(c, OfferFilter(disk_gb=200))] == [1, 2]  # 2's disk is dear
        assert [o.id for o in search_offers(c, OfferFilter(disk_gb=200, max_price=0.3))] == [1]
        assert standin.validation_failures() == []


def test_one_node_takes_every_offer_cheapest_first():
    offers = [_offer(1, 101, 0.1), _offer(2, 102, 0.2)]
    assert choose_offers(offers, 1, 8) == offers
    with pytest.raises(OfferError):
        choose_offers([], 1, 8)


def test_multi_node_picks_the_cheapest_cluster_with_enough_machines():
    offers = [
        _offer(1, 101, 0.05),  # cheapest, but in no cluster
        _offer(2, 201, 0.10, cluster=7), _offer(3, 201, 0.11, cluster=7),  # cluster 7: one machine only
        _offer(4, 301, 0.30, cluster=8), _offer(5, 302, 0.31, cluster=8), _offer(6, 303, 0.5, cluster=8),
        _offer(7, 401, 0.20, cluster=9), _offer(8, 402, 0.45, cluster=9),
    ]
    chosen = choose_offers(offers, 2, 8)
    assert [o.id for o in chosen] == [4, 5, 6]  # 0.61 < 0.65; cluster 7 has one machine
    assert [o.id for o in choose_offers(offers, 3, 8)] == [4, 5, 6]


def test_multi_node_without_a_shared_cluster_is_refused_with_the_reason():
    offers = [_offer(1, 101, 0.1), _offer(2, 102, 0.1), _offer(3, 103, 0.1, cluster=5)]
    with pytest.raises(OfferError) as err:
        choose_offers(offers, 2, 8)
    text = str(err.value)
    assert "\n" not in text and "cluster_id" in text and "NAT" in text and "--nodes 1" in text


def test_instance_state_ssh_address_direct_then_proxy():
    doc = json.loads((API_DIR / "examples" / "show_instances.get.200.json").read_text())["instances"][0]
    state = InstanceState.from_json(doc)
    assert state.ssh_address == ("192.0.2.45", 20000) and state.running and state.ssh_user == "root"
    proxy = InstanceState.from_json({**doc, "ports": {}})
    assert proxy.ssh_address == ("ssh123.vast.ai", 10600)
    single = json.loads((API_DIR / "examples" / "show_instance.get.200.json").read_text())["instances"]
    assert InstanceState.from_json(single).ssh_address == ("ssh2281.vast.ai", 10882)  # ports is a list there


def test_offer_strings_print_literally_in_the_table(monkeypatch, capsys):
    """A host names its GPU and place itself: '[...]' in them is text, not rich markup (nor a markup error)."""
    from launcher.cli.app import main

    key = "k"
    catalogue = [make_offer(1, 101, gpu_name="RTX [bold]3080[/bold]", geolocation="Lyon, [FR]"),
                 make_offer(2, 102, gpu_name="[/]", geolocation="[link=x]")]
    with VastStandIn(api_key=key, offers=catalogue) as standin:
        monkeypatch.setenv("VAST_API_KEY", key)
        monkeypatch.setenv("DDPCTL_VAST_URL", standin.url)
        monkeypatch.setenv("COLUMNS", "300")
        main(["offers"])
    out = capsys.readouterr().out
    for text in ("RTX [bold]3080[/bold]", "Lyon, [FR]", "[/]", "[link=x]"):
        assert text in out, out
