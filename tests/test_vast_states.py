"""Vast.ai's instance states as its docs define them, against the stand-in (issue 25, points 2, 3 and 6): `unknown`
is a failed start at once (only null, loading and rebooting are waited for), `frozen` is halted like `stopped` but
still bills its GPU, a destroyed instance that stays listed as released (`cur_state unloaded`, the only state Vast's
docs call released) is destroyed, one listed `offline` is "may still be billing", overlay names are of the form Vast
accepts (issue 42: `status` tells exited, unknown and offline machines and writes the cost as of now, a machine that
comes back exited after a start is told at once)."""

from __future__ import annotations

import json
import re
import time

import pytest

from infra.vast_standin import VastStandIn, make_offer
from launcher.errors import DdpctlError
from launcher.places.vast import rented_run
from launcher.places.vast.client import VastClient
from launcher.places.vast.ledger import Ledger, hourly
from launcher.places.vast.machine_states import refresh, start_stopped
from launcher.places.vast.models import RentedInstance
from launcher.places.vast.offers import OfferFilter, choose_offers, search_offers
from launcher.places.vast.overlay import overlay_name
from launcher.places.vast.provision import provision, teardown
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


def test_an_accepted_destroy_listed_as_released_is_destroyed(standin):
    rented = _provision(standin)
    standin.faults.destroy_lag_s = 3600  # still listed long after the destroy
    standin.faults.destroyed_state = released = "unloaded"
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
    assert all(standin.instances[r.instance_id].request["env"][f"-n {name}"] == "1" for r in rented)
    teardown(_client(standin), [r.instance_id for r in rented], overlay_name=name, poll_interval=0.05)
    assert standin.overlays == {}


def test_a_destroyed_machine_listed_offline_is_not_counted_released(standin):
    rented = _provision(standin)
    standin.faults.destroy_lag_s = 3600
    standin.faults.destroyed_state = "offline"  # a host that disconnected may come back: not "released"
    [result] = teardown(_client(standin), [rented[0].instance_id], poll_interval=0.05, verify_timeout=0.5)
    assert not result.destroyed and "may still be billing" in str(result.error)


def _rented_run_dir(standin: VastStandIn, tmp_path, rented: list[RentedInstance], **record) -> RunDir:
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="run-states"), {
        "provider": "vast", "nodes": [], "hosts": [{"hostname": r.ssh_host, "port": r.ssh_port} for r in rented],
        "vast": {"label": "run-states"}, **record})
    ledger = Ledger(run_dir)
    for node, r in enumerate(rented):
        ledger.on_provision_event({"event": "vast.instance_created", "node": node, "instance_id": r.instance_id,
                                   "offer_id": r.offer.id, "machine_id": r.offer.machine_id, "dph": r.dph,
                                   "storage_dph": 0.01})
    ledger.rented(rented)
    return run_dir


@pytest.mark.parametrize(("state", "told"), [("exited", "its container exited"),
                                              ("unknown", "no recent heartbeat from its host"),
                                              ("offline", "its host is disconnected")])
def test_status_tells_a_machine_exited_unknown_or_offline_and_writes_the_cost_as_of_now(
        standin, tmp_path, monkeypatch, state, told):
    rented = _provision(standin, nodes=2)
    run_dir = _rented_run_dir(standin, tmp_path, rented)
    record = json.loads((run_dir.path / "run.json").read_text())
    before = record["cost_usd"]
    for inst in record["instances"]:  # rented an hour ago: the cost as of now must differ from the one saved then,
        inst["created_at"] -= 3600  # however few milliseconds this test takes
    run_dir.update_record(instances=record["instances"])
    machine = rented[1].offer.machine_id
    if state == "exited":
        standin.faults.exited_machines.add(machine)
    elif state == "unknown":
        standin.lifecycle.switches.unknown_machines[machine] = 3600.0  # no heartbeat for the next hour
    else:
        standin.lifecycle.switches.offline_machines.add(machine)
    monkeypatch.setattr(rented_run, "vast_client", lambda: _client(standin))
    try:
        rows = rented_run.RentedRun().status_rows(run_dir, None)  # type: ignore[arg-type]  # no SSH: the API says
        by_node = {row["node"]: row["state"] for row in rows}
        assert by_node[0] == "machine rented"
        assert by_node[1].startswith(f"machine {state} ({told}); it may bill until `ddpctl down run-states`")
        record = json.loads((run_dir.path / "run.json").read_text())
        assert record["cost_usd"] > before and record["instances"][1]["api_state"] == state  # refreshed, saved
    finally:
        teardown(_client(standin), [r.instance_id for r in rented], poll_interval=0.05)


def test_a_machine_that_comes_back_exited_after_a_start_is_told_at_once(standin, tmp_path):
    rented = _provision(standin)
    run_dir = _rented_run_dir(standin, tmp_path, rented)
    client = _client(standin)
    client.manage_instance(rented[0].instance_id, "stopped")
    ledger = Ledger(run_dir)
    refresh(client, ledger)
    assert ledger.instances[0]["state"] == "stopped"
    standin.faults.exited_machines.add(rented[0].offer.machine_id)  # its container will not start again
    began = time.monotonic()
    with pytest.raises(DdpctlError, match=r"came back exited after the start \(container exited\)"):
        start_stopped(client, ledger, poll=0.05, timeout=900)
    assert time.monotonic() - began < 30  # not the 900 s start timeout
    assert any(e["event"] == "vast.start_failed" for e in run_dir.events())
    teardown(client, [rented[0].instance_id], poll_interval=0.05)


def test_why_machines_were_started_names_autostop_only_when_it_was_on():
    assert "autostop was off" in rented_run.start_reason(autostop=False, frozen=1, started=1)
    assert rented_run.start_reason(autostop=True, frozen=2, started=2) == ("they were frozen outside ddpctl; "
                                                                            "autostop stops, it does not freeze")
    assert rented_run.start_reason(autostop=True, frozen=0, started=2) == "autostop had stopped them"
