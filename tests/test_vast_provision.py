"""Provisioning and teardown against the stand-in, fault by fault: whatever fails, nothing is left rented."""

from __future__ import annotations

import logging
import subprocess
from collections import Counter

import pytest

from infra.vast_market import network_of
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import ProvisionError, VastError
from launcher.places.vast.models import Offer, RentedInstance
from launcher.places.vast.offers import OfferError, OfferFilter, choose_offers, search_offers
from launcher.places.vast.provision import ONSTART, cost_so_far, provision, teardown

KEY = "sk-prov-77aa88bb99cc"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdd ddpctl-test"
DISK = 20


@pytest.fixture
def standin():
    catalogue = [make_offer(i, 100 + i, dph_base=0.1 * i, cluster_id=7 if i <= 4 else None) for i in range(1, 7)]
    with VastStandIn(api_key=KEY, offers=catalogue, boot_delay_s=0.2) as s:
        yield s
        assert s.validation_failures() == []  # every request the client sent follows the OpenAPI schemas
        assert s.live_instances() == [], "instances left rented"


def _offers(standin: VastStandIn, nodes: int = 1) -> tuple[VastClient, list[Offer]]:
    client = VastClient(KEY, base_url=standin.url, backoff_base=0.001, pace=0.0)  # paced: test_vast_lifecycle
    return client, choose_offers(search_offers(client, OfferFilter(disk_gb=DISK)), nodes, DISK)


def _provision(standin: VastStandIn, nodes: int = 1, events: list | None = None, **kw) -> list[RentedInstance]:
    client, offers = _offers(standin, nodes)
    kw.setdefault("ready_timeout", 5.0)
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("on_event", events.append if events is not None else None)
    return provision(client, offers, nodes=nodes, image="ddpctl/trainer:1", disk=DISK, label="run-test",
                     ssh_public_key=PUB, **kw)


def _teardown(standin: VastStandIn, rented: list[RentedInstance]) -> None:
    client = VastClient(KEY, base_url=standin.url, backoff_base=0.001, pace=0.0)
    results = teardown(client, [r.instance_id for r in rented], overlay_name=rented[0].overlay_name,
                       poll_interval=0.05)
    assert all(r.destroyed for r in results), results


def _machines_created(standin: VastStandIn) -> Counter[int]:
    return Counter(i.offer["machine_id"] for i in standin.instances.values())


def test_two_nodes_in_one_cluster_with_an_overlay(standin):
    events: list[dict] = []
    rented = _provision(standin, nodes=2, events=events)
    assert [r.offer.id for r in rented] == [1, 2] and all(r.offer.cluster_id == 7 for r in rented)
    assert all(r.ssh_user == "root" and r.ssh_host == "127.0.0.1" for r in rented)
    assert rented[0].dph == pytest.approx(0.1 + 0.15 * DISK / 720)
    overlay = standin.overlays["run-test-net"]
    assert overlay["instances"] == [r.instance_id for r in rented] and overlay["cluster_id"] == 7
    assert all(r.overlay_name == "run-test-net" and r.overlay_subnet == "127.0.0.0/24" for r in rented)
    for r in rented:  # the key reached every instance (account key at create, attached per instance)
        assert standin.instances[r.instance_id].keys.count(PUB) == 2
        req = standin.instances[r.instance_id].request
        # created into the overlay network (Vast's documented order: the overlay first, `-n NAME` at create)
        assert req["env"] == {"-p 22:22": "1", "-n run-test-net": "1"}  # vast-cli's object form
        assert req["onstart"] == ONSTART and req["disk"] == DISK
    assert standin.market.order[0] == "overlay run-test-net"
    assert [e["event"] for e in events].count("vast.instance_ready") == 2
    _teardown(standin, rented)
    assert standin.overlays == {}


def test_env_values_reach_the_create_request_quoted(standin):
    env = {"MSG": "two words", "QUOTE": "it's", "PLAIN": "x"}
    rented = _provision(standin, env=env)
    sent = standin.instances[rented[0].instance_id].request["env"]
    assert sent == {"-p 22:22": "1", "MSG": "two words", "QUOTE": "it's", "PLAIN": "x"}  # values as they are
    _teardown(standin, rented)


def test_the_stand_in_reads_a_network_from_either_form_of_env():
    assert network_of({"env": "-p 22:22 -e 'A=b c' -n run-net"}) == "run-net"  # the OpenAPI file's string
    assert network_of({"env": {"-p 22:22": "1", "A": "b c", "-n run-net": "1"}}) == "run-net"  # vast-cli's object
    assert network_of({"env": {"-p 22:22": "1"}}) is None


@pytest.mark.parametrize("status", [404, 410])
def test_offer_gone_between_search_and_create_moves_to_the_next(standin, status):
    standin.faults.vanished_offers[1] = status
    events: list[dict] = []
    rented = _provision(standin, events=events)
    assert rented[0].offer.id == 2
    assert {"event": "vast.offer_gone", "offer_id": 1, "status": status} in events
    _teardown(standin, rented)


def test_instance_stuck_loading_is_destroyed_and_the_next_offer_tried(standin):
    standin.faults.stuck_machines.add(101)
    events: list[dict] = []
    rented = _provision(standin, events=events, ready_timeout=0.6)
    assert rented[0].offer.machine_id == 102
    stuck = next(i for i in standin.instances.values() if i.offer["machine_id"] == 101)
    assert stuck.destroyed_at is not None
    assert any(e["event"] == "vast.instance_failed" and "not running" in e["reason"] for e in events)
    _teardown(standin, rented)


@pytest.mark.parametrize("fault", ["oci_machines", "exited_machines"])
def test_failed_start_fails_fast_and_moves_on(standin, fault):
    getattr(standin.faults, fault).add(101)
    events: list[dict] = []
    rented = _provision(standin, events=events, ready_timeout=30)  # must not wait for the timeout
    assert rented[0].offer.machine_id == 102
    reason = next(e["reason"] for e in events if e["event"] == "vast.instance_failed")
    assert ("OCI runtime" in reason) if fault == "oci_machines" else ("exited" in reason)
    _teardown(standin, rented)


def test_second_create_failing_destroys_the_first(standin):
    standin.faults.failing_creates[2] = 400
    with pytest.raises(VastError) as err:
        _provision(standin, nodes=2)
    assert err.value.status == 400 and "\n" not in str(err.value)
    assert len(standin.instances) == 1  # the first was created, and the fixture checks it is gone


def test_a_lost_create_answer_is_found_by_label_and_destroyed_on_a_later_failure(standin):
    standin.faults.lost_create_answers.add(1)  # rented, but the answer was a 500: found by label and used
    standin.faults.failing_creates[2] = 400  # then the second node's create fails: both are destroyed
    with pytest.raises(VastError):
        _provision(standin, nodes=2)
    assert len(standin.instances) == 1  # the lost one, never re-sent; the fixture checks it is gone


def test_ctrl_c_during_provisioning_leaves_nothing(standin):
    def interrupt(_seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _provision(standin, nodes=2, sleep=interrupt)
    assert len(standin.instances) == 2


def test_ctrl_c_twice_still_destroys_everything(standin):
    presses = iter([True, True])

    def on_event(event: dict) -> None:
        if event["event"] in {"vast.instance_created", "vast.provision_failed"} and next(presses, False):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _provision(standin, nodes=2, on_event=on_event)
    assert len(standin.instances) == 1  # interrupted after the first create; the fixture checks it is gone


def test_running_out_of_offers_is_one_line_and_no_machine_is_tried_twice(standin):
    standin.faults.exited_machines.update({101, 102, 103, 104, 105, 106})
    with pytest.raises(ProvisionError) as err:
        _provision(standin, max_machine_failures=10)
    assert "\n" not in str(err.value) and "no usable Vast.ai offer" in str(err.value)
    assert set(_machines_created(standin).values()) == {1} and len(standin.instances) == 6


def test_machine_failures_stop_after_a_few_machines(standin):
    standin.faults.exited_machines.update({101, 102, 103, 104, 105, 106})
    with pytest.raises(ProvisionError) as err:
        _provision(standin)
    assert "\n" not in str(err.value) and "3 Vast.ai machines failed" in str(err.value)
    assert len(standin.instances) == 3  # MAX_MACHINE_FAILURES, each on another machine


def test_429s_during_provisioning_are_ridden_out(standin):
    standin.faults.burst = [429, 429, 503]
    rented = _provision(standin)
    assert [r["status"] for r in standin.requests[:3]] == [429, 429, 503]
    _teardown(standin, rented)


def test_multi_node_refuses_offers_from_different_clusters(standin):
    client, _ = _offers(standin, 2)
    loose = [Offer.from_json(make_offer(9, 900)), Offer.from_json(make_offer(10, 901))]
    with pytest.raises(OfferError):
        provision(client, loose, nodes=2, image="x", disk=DISK, label="l", ssh_public_key=PUB)
    assert standin.instances == {}


def test_teardown_waits_until_destroy_is_verified(standin):
    rented = _provision(standin)
    standin.faults.destroy_lag_s = 0.3  # show still answers for a while after destroy
    client = VastClient(KEY, base_url=standin.url, backoff_base=0.001, pace=0.0)
    [result] = teardown(client, [rented[0].instance_id], poll_interval=0.05)
    shown = client.show_instance(rented[0].instance_id)  # listed a while longer, as released (test_vast_states)
    assert result.destroyed and (shown is None or shown["cur_state"] == "unloaded")
    [again] = teardown(client, [rented[0].instance_id], poll_interval=0.05)  # already gone counts as gone
    assert again.destroyed


def test_teardown_reports_an_instance_that_will_not_go(standin):
    rented = _provision(standin)
    standin.faults.ignored_destroys.add(rented[0].instance_id)  # the destroy is answered 200 and not done
    client = VastClient(KEY, base_url=standin.url, backoff_base=0.001, pace=0.0)
    [result] = teardown(client, [rented[0].instance_id], poll_interval=0.05, verify_timeout=0.3)
    assert not result.destroyed and "still exists" in result.error and "billing" in result.error
    standin.faults.ignored_destroys.clear()
    teardown(client, [rented[0].instance_id], poll_interval=0.05)


def test_cost_so_far_counts_each_instance_until_it_ended():
    offer = Offer.from_json(make_offer(1, 1))
    a = RentedInstance(1, offer, "h", 22, "root", None, dph=0.50, created_at=1000.0)
    b = RentedInstance(2, offer, "h", 22, "root", None, dph=1.20, created_at=1000.0 + 1800)
    assert cost_so_far([a, b], now=1000.0 + 3600) == pytest.approx(0.50 + 0.60)
    assert cost_so_far([a, b], now=1000.0 + 7200, ended_at={1: 1000.0 + 3600}) == pytest.approx(0.50 + 1.20 * 1.5)
    assert cost_so_far([b], now=0.0) == 0.0


def test_the_key_never_appears_in_events_logs_or_errors(standin, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    events: list[dict] = []
    standin.faults.burst = [429]
    standin.faults.oci_machines.add(101)
    standin.faults.failing_creates[3] = 403
    with pytest.raises(VastError) as err:
        _provision(standin, nodes=2, events=events)
    texts = [str(err.value), repr(err.value), repr(events)] + [r.getMessage() for r in caplog.records]
    texts += list(capsys.readouterr())
    assert len(events) > 3 and any("retrying" in t for t in texts)
    assert not [t for t in texts if KEY in t]


def test_onstart_exports_the_images_env_for_ssh_sessions_and_nothing_secret(tmp_path):
    # Vast's SSH sessions do not see the image's ENV; onstart (run with it) writes it where PAM reads it.
    environment = tmp_path / "environment"
    environment.write_text("LANG=C\nOTHER=kept\n")
    script = ONSTART.replace("/etc/environment", str(environment))
    image_env = {"HOME": str(tmp_path), "PATH": "/opt/conda/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "HF_TOKEN": "hf_secret", "LANG": "C.UTF-8"}
    for _ in range(2):  # every start rewrites it: nothing doubles
        subprocess.run(["sh", "-c", script], env=image_env, check=True)
    lines = environment.read_text().splitlines()
    assert sorted(lines) == sorted(["OTHER=kept", "LANG=C.UTF-8", "PATH=/opt/conda/bin:/usr/bin:/bin",
                                    "PYTHONUNBUFFERED=1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"])
    assert (tmp_path / ".no_auto_tmux").exists() and len(ONSTART) < 4048  # Vast's onstart limit


def _calls(standin: VastStandIn, method: str, path_end: str) -> list[dict]:
    return [r for r in standin.requests if r["method"] == method and r["path"].endswith(path_end)]


def test_keys_whose_answer_a_gateway_lost_are_looked_for_not_sent_twice(standin):
    standin.faults.gateway_after_acting.update(attach_ssh=1, create_ssh_key=1)  # done, then answered 502
    [rented] = _provision(standin)
    assert standin.account_keys == [PUB]  # the account key was not added a second time
    attaches = [r for r in _calls(standin, "POST", "/ssh/") if "/instances/" in r["path"]]
    assert [r["status"] for r in attaches] == [502]  # looked at the instance's keys, found it, sent no second attach
    assert len(_calls(standin, "GET", f"/instances/{rented.instance_id}/ssh/")) == 1
    _teardown(standin, [rented])


def test_an_attach_refused_by_the_gateway_before_acting_is_sent_again_after_a_look(standin):
    client = VastClient(KEY, base_url=standin.url, backoff_base=0.001, pace=0.0)
    iid = client.create_instance(1, {"client_id": "me", "image": "ddpctl/trainer:1", "disk": DISK, "label": "k"})
    standin.faults.burst, standin.faults.burst_paths = [502], f"/api/v0/instances/{iid}/ssh/"  # refused unseen
    client.attach_ssh_key(iid, PUB)
    attaches = [r for r in _calls(standin, "POST", "/ssh/") if "/instances/" in r["path"]]
    assert [r["status"] for r in attaches] == [502, 200] and standin.instances[iid].keys == [PUB]
    assert len(_calls(standin, "GET", f"/instances/{iid}/ssh/")) == 1  # looked before sending it again
    assert teardown(client, [iid], poll_interval=0.05)[0].destroyed
