"""Offer queries, real hourly prices and the choice of nodes (one cluster for multi-node)."""

from __future__ import annotations

import json

import pytest

from infra.vast_contract import API_DIR, find_operation, validate_request
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.models import InstanceState, Offer
from launcher.places.vast.offers import OfferError, OfferFilter, build_query, choose_offers, search_offers


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


# -- issue 13: only machines that can run the image and the run --------------------------------------------------

NOW = 1_900_000_000.0


def _market_offer(oid: int, **fields) -> dict:
    """An offer whose machine can run the image unless `fields` say otherwise (RTX 3080: sm_86, 10 GB)."""
    base = dict(dph_base=0.30, cuda_max_good=12.8, compute_cap=860, gpu_ram=10240, end_date=NOW + 30 * 86400,
                duration=30 * 86400.0)
    return make_offer(oid, 100 + oid, **{**base, **fields})


# the cheapest offers cannot run the image; 6 (a 12.2 driver, below the build's 12.8) can, by minor-version compat
UNUSABLE = {
    1: dict(dph_base=0.05, cuda_max_good=11.8),  # a CUDA 11 driver: below the 12.x floor
    2: dict(dph_base=0.06, compute_cap=610),  # GTX 1080: the wheel has no sm_61 kernels
    3: dict(dph_base=0.07, compute_cap=700),  # V100: sm_70 is not in the cu128 arch list
    4: dict(dph_base=0.08, gpu_ram=1024),  # too little GPU memory for resnet18
    5: dict(dph_base=0.09, duration=1800.0, end_date=NOW + 1800),  # contract ends within the run
}
USABLE = {6: dict(dph_base=0.10, cuda_max_good=12.2, compute_cap=890),  # 12.2 driver, RTX 4090 (8.9 runs sm_86)
          7: dict(dph_base=0.11, cuda_max_good=13.0, compute_cap=1200)}  # Blackwell on a CUDA 13 driver


def _needs_filter(**kw) -> OfferFilter:
    from launcher.places.vast.image_needs import MachineNeeds

    return OfferFilter(disk_gb=16, needs=MachineNeeds.for_run("resnet18", 2.0), **kw)


def test_minor_version_rule_and_arch_list():
    from launcher.places.vast.image_needs import CUDA_MIN, runs_on_cap, supported_caps

    assert CUDA_MIN == 12.0  # any 12.x driver runs the 12.8 build (minor-version compatibility), not only >= 12.8
    assert [runs_on_cap(c) for c in (61, 70, 75, 86, 89, 90, 100, 103, 110, 120, 121)] == \
        [False, False, True, True, True, True, True, True, False, True, True]
    assert 890 // 10 in supported_caps() and 70 not in supported_caps()


@pytest.mark.parametrize("server_filters", [True, False], ids=["vast-filters", "client-rechecks"])
def test_no_offer_that_cannot_run_the_image_is_ever_chosen(server_filters):
    catalogue = [_market_offer(i, **f) for i, f in {**UNUSABLE, **USABLE}.items()]
    with VastStandIn(api_key="k", offers=catalogue) as standin:
        if not server_filters:  # a server that ignores the fields: the client's own check still excludes them
            standin.market.ignored_filters |= {"cuda_max_good", "compute_cap", "gpu_ram", "duration"}
        client = VastClient("k", base_url=standin.url)
        found = search_offers(client, _needs_filter())
        assert [o.id for o in found] == [6, 7]
        query = standin.market.searches[-1]
        assert query["cuda_max_good"] == {"gte": 12.0} and 860 in query["compute_cap"]["in"]
        assert 700 not in query["compute_cap"]["in"] and query["gpu_ram"] == {"gte": 4096}
        assert query["duration"]["gte"] >= 2 * 3600
        assert standin.validation_failures() == []


def test_unmet_needs_name_each_reason():
    from launcher.places.vast.offers import unmet_needs

    flt = _needs_filter()
    reasons = {i: unmet_needs(Offer.from_json(_market_offer(i, **f)), flt, now=NOW) for i, f in UNUSABLE.items()}
    assert "CUDA 11.8 < 12" in reasons[1][0] and "compute capability 6.1" in reasons[2][0]
    assert "compute capability 7" in reasons[3][0] and "GPU RAM 1024 MB" in reasons[4][0]
    assert "contract ends in 0.5 h" in reasons[5][0] and all(len(r) == 1 for r in reasons.values())
    assert unmet_needs(Offer.from_json(_market_offer(6, **USABLE[6])), flt, now=NOW) == []


def test_offers_explain_lists_the_excluded_and_why(monkeypatch, capsys):
    from launcher.cli.app import main

    catalogue = [_market_offer(i, **f) for i, f in {**UNUSABLE, **USABLE}.items()]
    with VastStandIn(api_key="k", offers=catalogue) as standin:
        monkeypatch.setenv("VAST_API_KEY", "k")
        monkeypatch.setenv("DDPCTL_VAST_URL", standin.url)
        main(["offers", "--model", "resnet18", "--expected-hours", "2", "--json"])
        plain = json.loads(capsys.readouterr().out)
        main(["offers", "--model", "resnet18", "--expected-hours", "2", "--explain", "--json"])
        explained = json.loads(capsys.readouterr().out)
        monkeypatch.setenv("COLUMNS", "400")
        main(["offers", "--model", "resnet18", "--explain"])
        table = capsys.readouterr().out
        assert standin.validation_failures() == []
    assert [o["id"] for o in plain] == [6, 7]
    why = {o["id"]: " ".join(o["excluded"]) for o in explained}
    assert sorted(why) == [1, 2, 3, 4, 5, 6, 7] and why[6] == why[7] == ""
    for oid, words in {1: "CUDA 11.8", 2: "compute capability 6.1", 3: "compute capability 7", 4: "GPU RAM",
                       5: "contract ends"}.items():
        assert words in why[oid], (oid, why[oid])
    assert "excluded because" in table and "no kernels" in table


def test_max_cost_that_bandwidth_alone_would_use_up_rents_nothing():
    from types import SimpleNamespace

    from launcher.places.vast.market import find_offers
    from launcher.spec.vast_request import VastRequest

    catalogue = [_market_offer(6, **USABLE[6], inet_down_cost=0.5, inet_up_cost=0.5)]
    with VastStandIn(api_key="k", offers=catalogue) as standin:
        client = VastClient("k", base_url=standin.url)
        spec = SimpleNamespace(model="mnist-cnn")
        with pytest.raises(OfferError) as err:  # image pull 4 GB + 1 GB in, 1 GB out at $0.5/GB = $3
            find_offers(client, spec, VastRequest(disk=16, max_cost=2.5), 1)  # type: ignore[arg-type]
        assert "does not cover the bandwidth" in str(err.value) and "$3.0000" in str(err.value)
        assert [o.id for o in find_offers(client, spec, VastRequest(disk=16, max_cost=3.5), 1)] == [6]  # type: ignore[arg-type]
        assert standin.instances == {}
