"""Issue 13's market, end to end: `up --provider vast --nodes 2` in a market where cluster offers are few, not the
cheapest and past the first page of a cluster search; the overlay is created before the instances (which are
created into it), its subnet is null at first, and the instances (real test-bed SSH hosts) have no `ip`. Hosts
charge for bandwidth: the final cost counts it and the report splits GPU time, storage and bandwidth.
One run shared by the assertions (module scope): the suite's time is short."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.vast_market import cluster_market, without_ip
from infra.vast_standin import VastStandIn
from launcher.places.vast.billing import GB, IMAGE_PULL_GB
from launcher.places.vast.offers import MAX_CLUSTER_PAGES
from tests.test_vast_up import KEY, Launcher
from tests.testbed_fixtures import needs_testbed

ROOT = Path(__file__).resolve().parent.parent
SHIM_DIR = Path("/tmp/ddpvmkt-noip")  # world-readable: the hosts' users run the `ip` shim from it
DOWN_COST, UP_COST = 0.02, 0.05  # $/GB the cluster's hosts charge


def test_cluster_search_pages_past_the_cheapest_offers():
    """Without the stand-in's hosts: the search goes to the page that holds the one cluster of two machines."""
    from launcher.places.vast.client import VastClient
    from launcher.places.vast.offers import OfferFilter, choose_offers, search_cluster_offers

    with VastStandIn(api_key=KEY, offers=cluster_market()) as standin:
        client = VastClient(KEY, base_url=standin.url)
        found = search_cluster_offers(client, OfferFilter(disk_gb=16, num_gpus=1), 2)
        assert [o.machine_id for o in choose_offers(found, 2, 16)] == [1901, 1902]
        searches = standin.market.searches
        assert 2 <= len(searches) <= MAX_CLUSTER_PAGES and all(s["cluster_id"] == {"neq": None} for s in searches)
        assert standin.validation_failures() == []


def test_overlay_subnet_is_waited_for_a_bounded_time_and_addresses_are_matched_to_it():
    from launcher.places.vast.client import VastClient
    from launcher.places.vast.errors import ProvisionError
    from launcher.places.vast.overlay import overlay_address, wait_for_subnet

    with VastStandIn(api_key=KEY, offers=cluster_market(cheap=0, lone=0), overlay_subnet="10.9.0.0/24") as standin:
        client = VastClient(KEY, base_url=standin.url)
        client.create_overlay(9, "run-net")
        ticks = iter(range(1000))
        standin.market.null_subnet_reads = 3
        assert wait_for_subnet(client, "run-net", timeout=60, interval=10, clock=lambda: next(ticks) * 10.0,
                               sleep=lambda _s: None) == "10.9.0.0/24"
        assert standin.market.overlay_reads["run-net"] == 4
        standin.market.null_subnet_reads = 10**6
        with pytest.raises(ProvisionError) as err:
            wait_for_subnet(client, "run-net", timeout=60, interval=10, clock=lambda: next(ticks) * 10.0,
                            sleep=lambda _s: None)
        assert "no subnet for overlay network run-net within 60 s" in str(err.value) and "\n" not in str(err.value)
    listed = [["lo", "127.0.0.1"], ["eth0", "172.17.0.5"], ["ovl0", "10.9.0.7"]]
    assert overlay_address(listed, "10.9.0.0/24") == ("ovl0", "10.9.0.7")
    assert overlay_address(listed[:2], "10.9.0.0/24") is None


def test_the_address_probe_lists_interfaces_with_python_alone():
    import subprocess
    import sys

    from launcher.places.vast.overlay import ADDRESSES_PY

    out = subprocess.run([sys.executable, "-c", ADDRESSES_PY], capture_output=True, text=True, check=True,
                         env={"PATH": "/nonexistent"}).stdout  # no `ip`, no PATH at all
    assert ["lo", "127.0.0.1"] in json.loads(out)


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    cleanup_stale("ddpvmkt")
    with Testbed("ddpvmkt", n_hosts=0, host_python=True) as testbed:
        yield testbed
    shutil.rmtree(SHIM_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def standin(bed: Testbed) -> Iterator[VastStandIn]:
    offers = cluster_market()
    for offer in offers:
        if offer["cluster_id"] == 9:
            offer.update(inet_down_cost=DOWN_COST, inet_up_cost=UP_COST)
    with VastStandIn(api_key=KEY, offers=offers, host_factory=lambda _iid: without_ip(bed.add_host(22), SHIM_DIR),
                     host_remover=bed.remove_host, boot_delay_s=0.2) as standin:
        standin.market.null_subnet_reads = 2
        yield standin
        assert standin.validation_failures() == []
    for host in list(bed.hosts):
        bed.remove_host(host)


@pytest.fixture(scope="module")
def two_nodes(bed: Testbed, standin: VastStandIn, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A dry run, then one real 2-node run with --down; what both left behind."""
    ddpctl = Launcher(tmp_path_factory.mktemp("vastmarket"), standin)
    common = ("--nodes", "2", "--gpus", "1", "--epochs", "1")
    plan = ddpctl.up(*common, "--dry-run")
    created_by_plan = dict(standin.instances)
    result = ddpctl.up(*common, "--down", "--json", timeout=300)
    return {"ddpctl": ddpctl, "plan": plan, "created_by_plan": created_by_plan, "result": result}



@needs_testbed
@pytest.mark.testbed
def test_dry_run_shows_the_chosen_cluster_and_its_price(two_nodes) -> None:
    plan = two_nodes["plan"]
    assert plan.returncode == 0, plan.stderr
    assert "vast offer 901" in plan.stdout and "vast offer 902" in plan.stdout
    # what only renting tells is named as unknown, so this plan never runs (`up --plan` refuses it)
    assert "not known without probing the hosts or renting the machines" in plan.stdout
    assert "node addresses: each machine's overlay network address" in plan.stdout
    assert "NODE1_OVERLAY_ADDR" in plan.stdout
    hourly = 0.30 + 0.31 + 2 * 0.15 * 16 / 720
    assert "in cluster 9" in plan.stderr and f"${hourly:.4f}/hour" in plan.stderr and "bandwidth" in plan.stderr
    assert two_nodes["created_by_plan"] == {}


@needs_testbed
@pytest.mark.testbed
def test_two_nodes_find_the_cluster_on_page_two_overlay_first_no_ip(standin, two_nodes) -> None:
    result = two_nodes["result"]
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run = Path(out["run_dir"])
    record = json.loads((run / "run.json").read_text())
    assert [i["machine_id"] for i in record["instances"]] == [1901, 1902]  # the one cluster, found on page 2+
    assert all(i["cluster_id"] == 9 for i in record["instances"]) and out["summary"]["world_size"] == 2
    # the test image cannot be read here (no registry): the constants were applied, said and recorded as such
    assert record["vast"]["image_needs"]["source"] == "constants" and "could not read the labels of" in result.stderr
    cluster_searches = [s for s in standin.market.searches if s.get("cluster_id") == {"neq": None}]
    assert len(cluster_searches) >= 2 and "id" in cluster_searches[-1]  # paged past the first 64 cluster offers

    # the overlay came first and the instances were created into it
    overlay = record["instances"][0]["overlay_name"]
    order = [entry for entry in standin.market.order if entry.startswith("overlay")
             or int(entry.split()[1]) in {i["instance_id"] for i in record["instances"]}]
    assert order[0] == f"overlay {overlay}" and len(order) == 3
    for inst in record["instances"]:
        assert standin.instances[inst["instance_id"]].request["env"][f"-n {overlay}"] == "1"
    # the subnet was null at first, and was waited for
    assert standin.market.overlay_reads[overlay] > standin.market.null_subnet_reads
    # the addresses were read without `ip` (the hosts have none): the nodes ran on the overlay addresses
    overlay_ips = [i["overlay_ip"] for i in record["instances"]]
    assert all(overlay_ips) and [n["address"] for n in record["nodes"]] == overlay_ips
    commands = two_nodes["ddpctl"].commands.read_text()
    assert not re.search(r"(^|[\s;'\"])ip\s+(-4|addr|-o)", commands, flags=re.M)
    assert standin.live_instances() == [] and standin.overlays == {}


@needs_testbed
@pytest.mark.testbed
def test_the_final_cost_counts_bandwidth_and_the_report_splits_it(two_nodes) -> None:
    result = two_nodes["result"]
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run = Path(out["run_dir"])
    record = json.loads((run / "run.json").read_text())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    split = record["cost_split"]
    time_cost = sum(i["dph"] * (i["destroyed_at"] - i["created_at"]) / 3600 for i in record["instances"])
    sent = sum(e.get("bytes_sent") or 0 for e in events if e["event"] == "shipped")
    pulled = sum(e.get("bytes_fetched") or 0 for e in events if e["event"] == "pulled")
    assert sent > 0 and pulled > 0
    bandwidth = 2 * IMAGE_PULL_GB * DOWN_COST + sent / GB * DOWN_COST + pulled / GB * UP_COST
    assert split["bandwidth_usd"] == pytest.approx(bandwidth, abs=1e-6)
    storage = sum(0.15 * 16 / 720 * (i["destroyed_at"] - i["created_at"]) / 3600 for i in record["instances"])
    assert split["storage_usd"] == pytest.approx(storage, abs=1e-6)
    assert split["gpu_usd"] + split["storage_usd"] == pytest.approx(time_cost, abs=1e-6)
    assert record["cost_usd"] == pytest.approx(time_cost + bandwidth, abs=1e-5) == split["total_usd"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cost_usd"] == pytest.approx(record["cost_usd"]) and summary["cost_split"] == split
    assert out["summary"]["cost_usd"] == pytest.approx(record["cost_usd"])
    assert out["summary"]["cost_split"] == split
    # the summary table `up` prints (without --json) splits it the same way
    from rich.console import Console

    from launcher.results.progress import summary_table

    console = Console(width=200, record=True)
    console.print(summary_table(summary, "run"))
    shown = console.export_text()
    assert f"bandwidth ${split['bandwidth_usd']:.4f}" in shown and f"GPU ${split['gpu_usd']:.4f}" in shown
