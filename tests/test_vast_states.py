"""Vast.ai's instance states as its docs define them, against the stand-in (issue 25, points 2, 3 and 6): `unknown`
is a failed start at once (only null, loading and rebooting are waited for), `frozen` is halted like `stopped` but
still bills its GPU, a destroyed instance that stays listed as released (`unloaded` and the like) is destroyed, not
"may still be billing", and overlay names are of the form Vast accepts."""

from __future__ import annotations

import re

import pytest

from infra.vast_standin import VastStandIn, make_offer
from launcher.providers.vast.client import VastClient
from launcher.providers.vast.ledger import Ledger, hourly
from launcher.providers.vast.machine_states import refresh, start_stopped
from launcher.providers.vast.models import RentedInstance
from launcher.providers.vast.offers import OfferFilter, choose_offers, search_offers
from launcher.providers.vast.overlay import overlay_name
from launcher.providers.vast.provision import provision, teardown
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec

pytestmark = pytest.mark.integration  # a stand-in over loopback (tests/tiers.py)

KEY = "sk-states-3c5e7a9b1d"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdd ddpctl-test"
DISK = 16


@pytest.fixture
def standin():
    catalogue = [make_offer(i, 200 + i, dph_base=0.1 * i, cluster_id=5 if i <= 4 else None) for i in range(1, 7)]
    with VastStandIn(api_key=KEY, offers=catalogue, boot_delay_s=0.1) as s:
        yield s
        assert s.validation_failures() == []
        s.faults.ignored_destroys.clear()
        assert s.live_instances() == [], "instances left rented"


def _client(standin: VastStandIn) -> VastClient:
    return VastClient(KEY, base_url=standin.url, backoff_base=0.01, pace=0.0)


def _provision(standin: VastStandIn, nodes: int = 1, label: str = "run-states", **kw) -> list[RentedInstance]:
    client = _client(standin)
    offers = choose_offers(search_offers(client, OfferFilter(disk_gb=DISK)), nodes, DISK)
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("ready_timeout", 10.0)
    return provision(client, offers, nodes=nodes, image="docker.io/ddpctl/trainer:1", disk=DISK, label=label,
                     ssh_public_key=PUB, **kw)


def test_unknown_is_a_failed_start_at_once_and_the_next_machine_is_rented(standin):
    standin.lifecycle.switches.unknown_machines[201] = 3600  # no heartbeat from that host
    events: list[dict] = []
    # a grace of an hour would keep waiting on a state that is only quiet; unknown is not waited for at all
    rented = _provision(standin, transient_grace=3600.0, on_event=events.append)
    assert rented[0].offer.machine_id == 202
    [failed] = [e for e in events if e["event"] == "vast.instance_failed"]
    assert failed["machine_id"] == 201 and "actual_status unknown" in failed["reason"]
    assert not failed["image_error"]
    first = min(standin.instances)
    assert standin.instances[first].destroyed_at is not None  # destroyed, not left billing
    teardown(_client(standin), [r.instance_id for r in rented], poll_interval=0.05)


@pytest.mark.parametrize("released", ["unloaded", "destroyed", "terminated", "offline"])
def test_an_accepted_destroy_listed_as_released_is_destroyed(standin, released):
    rented = _provision(standin)
    standin.faults.destroy_lag_s = 3600  # still listed long after the destroy
    standin.faults.destroyed_state = released
    client = _client(standin)
    [result] = teardown(client, [rented[0].instance_id], poll_interval=0.05, verify_timeout=5.0)
    assert result.destroyed and result.error is None
    shown = client.show_instance(rented[0].instance_id)
    assert shown is not None and shown["cur_state"] == released  # listed still, and rightly counted gone


def test_a_destroy_that_did_not_happen_is_reported_as_maybe_billing(standin):
    rented = _provision(standin)
    standin.faults.ignored_destroys.add(rented[0].instance_id)  # answered 200, machine still running
    client = _client(standin)
    [result] = teardown(client, [rented[0].instance_id], poll_interval=0.05, verify_timeout=0.3)
    assert not result.destroyed and "still exists" in result.error and "billing" in result.error
    standin.faults.ignored_destroys.clear()
    teardown(client, [rented[0].instance_id], poll_interval=0.05)


def test_a_frozen_machine_is_halted_but_bills_its_gpu_and_is_started_again(standin, tmp_path):
    rented = _provision(standin)
    iid = rented[0].instance_id
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="run-states"), {"nodes": []})
    ledger = Ledger(run_dir)
    ledger.on_provision_event({"event": "vast.instance_created", "node": 0, "instance_id": iid, "offer_id": 1,
                               "machine_id": 201, "dph": rented[0].dph, "storage_dph": 0.01})
    ledger.rented(rented)
    client = _client(standin)
    standin.lifecycle.frozen.add(iid)  # paused by its host or in the console: memory kept, GPU billed
    refresh(client, ledger)
    [inst] = ledger.instances
    assert inst["state"] == "stopped" and inst["frozen"] is True
    assert inst.get("stops") == [] and hourly(inst) == pytest.approx(rented[0].dph)  # not storage only

    assert start_stopped(client, ledger, poll=0.05, timeout=10) == [iid]  # pull/down start it first
    assert standin.lifecycle.manage_calls == [(iid, "running", "owner")] and iid not in standin.lifecycle.frozen
    [inst] = Ledger(run_dir).instances
    assert inst["state"] == "rented" and "frozen" not in inst
    teardown(client, [iid], poll_interval=0.05)


def test_overlay_names_are_lower_case_letters_digits_and_dashes_and_one_per_run():
    labels = ["My_Run", "my-run", "my_run", "MY.RUN", "run-1", "x" * 200, "y" * 200, "__", "Ω-run"]
    names = [overlay_name(label) for label in labels]
    assert all(re.fullmatch(r"[a-z0-9-]+", n) and len(n) <= 60 for n in names), names
    assert len(set(names)) == len(labels)  # unique per run id, even where the folded forms meet
    assert overlay_name("run-1") == "run-1-net" and overlay_name("My_Run") == overlay_name("My_Run")


def test_a_run_id_with_capitals_and_underscores_gets_an_overlay_vast_accepts(standin):
    rented = _provision(standin, nodes=2, label="My_Run.2")
    name = rented[0].overlay_name
    assert name is not None and re.fullmatch(r"[a-z0-9-]+", name) and name in standin.overlays
    assert all(standin.instances[r.instance_id].request["env"].endswith(f"-n {name}") for r in rented)
    teardown(_client(standin), [r.instance_id for r in rented], overlay_name=name, poll_interval=0.05)
    assert standin.overlays == {}
