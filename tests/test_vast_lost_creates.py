"""A create whose answer is lost (Vast rented the machine, then answered 500) while the instance list lags one read
behind: the intent is on disk before the request goes out, the machine is found by label (and used, or left where
`status --rented` and `down` find it and destroy it): no machine is left billing unseen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.vast_hosts import BannerHost
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast import apikey, rented_run
from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import ProvisionError, VastError
from launcher.places.vast.ledger import Ledger, live, open_intents
from launcher.places.vast.lost_creates import reconcile_run
from launcher.places.vast.offers import OfferFilter, choose_offers, search_offers
from launcher.places.vast.provision import provision, teardown
from launcher.places.vast.rented_list import print_rented, rented_rows
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec

KEY = "sk-lost-5e6f7a8b9c0d"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdd ddpctl-test"
DISK = 16
RUN = "run-lost"

pytestmark = pytest.mark.integration  # the stand-in is an HTTP server on loopback


@pytest.fixture
def standin():
    catalogue = [make_offer(i, 300 + i, dph_base=0.1 * i) for i in range(1, 4)]
    with VastStandIn(api_key=KEY, offers=catalogue, boot_delay_s=0.05) as s:
        yield s
        assert s.validation_failures() == []
        assert s.live_instances() == [], "instances left rented"


def _client(standin: VastStandIn) -> VastClient:
    return VastClient(KEY, base_url=standin.url, backoff_base=0.01, pace=0.0)


def _ledger(tmp_path: Path) -> Ledger:
    return Ledger(RunDir.create(tmp_path, RunSpec(run_id=RUN), {"provider": "vast", "instances": [],
                                                                "vast": {"label": RUN}}))


def _provision(standin: VastStandIn, ledger: Ledger, **kw: Any):
    client = _client(standin)
    offers = choose_offers(search_offers(client, OfferFilter(disk_gb=DISK)), 1, DISK)
    kw.setdefault("transient_grace", 5.0)
    return provision(client, offers, nodes=1, image="docker.io/ddpctl/trainer:1", disk=DISK, label=RUN,
                     ssh_public_key=PUB, poll_interval=0.05, ready_timeout=10.0, on_event=ledger.on_provision_event,
                     **kw)


def _list_reads_after_create(standin: VastStandIn) -> int:
    create = next(k for k, r in enumerate(standin.requests) if r["method"] == "PUT" and "/asks/" in r["path"])
    return sum(1 for r in standin.requests[create:] if r["path"] == "/api/v1/instances/")


def test_a_lost_create_answer_with_a_lagging_list_is_found_by_label_and_used(standin, tmp_path):
    standin.faults.lost_create_answers.add(1)  # rented, then answered 500
    standin.faults.list_lag_reads = 1  # and the instance list is one read behind
    ledger = _ledger(tmp_path)
    [rented] = _provision(standin, ledger)
    assert standin.live_instances() == [rented.instance_id]  # the very machine Vast made, not a second one
    assert sum(1 for r in standin.requests if r["method"] == "PUT" and "/asks/" in r["path"]) == 1  # never re-sent
    assert _list_reads_after_create(standin) >= 2  # the first look did not show it: one look would have missed it
    [intent] = Ledger(ledger.run_dir).intents
    assert intent["state"] == "created" and intent["instance_id"] == rented.instance_id
    events = [e["event"] for e in ledger.run_dir.events()]
    assert events.index("vast.create_sending") < events.index("vast.create_answer_lost") < events.index(
        "vast.instance_created")
    teardown(_client(standin), [rented.instance_id], poll_interval=0.05)


def test_the_intent_is_on_disk_before_the_create_reaches_the_api(standin, tmp_path):
    ledger = _ledger(tmp_path)
    seen: list[list[dict[str, Any]]] = []

    def host_when_created(instance_id: int) -> BannerHost:  # called by the stand-in while it handles the PUT
        seen.append(json.loads((ledger.run_dir.path / "run.json").read_text())["create_intents"])
        return BannerHost(instance_id)

    standin.host_factory = host_when_created
    [rented] = _provision(standin, ledger)
    [[intent]] = seen
    assert intent["state"] == "sent" and intent["label"] == RUN and intent["instance_id"] is None
    assert intent["offer_id"] == rented.offer.id and intent["machine_id"] == rented.offer.machine_id
    teardown(_client(standin), [rented.instance_id], poll_interval=0.05)


def test_an_unanswered_create_not_listed_in_time_is_shown_by_status_rented_and_destroyed_by_down(
        standin, tmp_path, monkeypatch, capsys):
    standin.faults.lost_create_answers.add(1)
    standin.faults.list_lag_reads = 10_000  # not listed while `up` looks
    ledger = _ledger(tmp_path)
    with pytest.raises(ProvisionError, match="got no answer .* `ddpctl down run-lost` look for it"):
        _provision(standin, ledger, transient_grace=0.3)
    [billing] = standin.live_instances()  # Vast made it, and nobody has seen it yet
    [intent] = Ledger(ledger.run_dir).intents
    assert intent["state"] == "unresolved"
    [row] = rented_rows(tmp_path)  # without the API: the create is shown, its machine unknown
    assert row["run"] == RUN and row["instance_id"] is None and "unanswered" in row["state"]

    monkeypatch.setattr(apikey, "vast_client", lambda: _client(standin))
    print_rented(tmp_path, json_out=True)  # asks the API by label: still not listed, still shown
    assert json.loads(capsys.readouterr().out)["rented"][0]["instance_id"] is None
    print_rented(tmp_path, json_out=False)
    table = capsys.readouterr()
    assert "create of" in table.out  # the listing is on stdout, as every listing
    assert "0 machine(s) billing $0.0000/hour in all; 1 create(s) without an answer may have rented more" in table.err

    standin.instances[billing].unlisted_reads = 0  # the list catches up
    print_rented(tmp_path, json_out=True)
    [row] = json.loads(capsys.readouterr().out)["rented"]
    assert row["instance_id"] == billing and row["cost_usd"] > 0  # billed from when the create was sent

    monkeypatch.setattr(rented_run, "vast_client", lambda: _client(standin))
    said = rented_run.release_run(RunDir.open(ledger.run_dir.path), None)  # type: ignore[arg-type]
    assert "machines destroyed (verified)" in said and "no answer" not in said
    assert standin.live_instances() == []
    final = Ledger(ledger.run_dir)
    assert not live(final.instances) and not open_intents(final.intents)
    assert final.instances[0]["found_by_label"] is True


def test_down_finds_an_instance_that_shows_up_only_after_up_gave_up(standin, tmp_path, monkeypatch):
    standin.faults.lost_create_answers.add(1)
    standin.faults.list_lag_reads = 10_000
    ledger = _ledger(tmp_path)
    with pytest.raises(ProvisionError):
        _provision(standin, ledger, transient_grace=0.2)
    [billing] = standin.live_instances()
    monkeypatch.setattr(rented_run, "vast_client", lambda: _client(standin))
    said = rented_run.release_run(RunDir.open(ledger.run_dir.path), None)  # type: ignore[arg-type]
    assert "run `ddpctl down run-lost` again" in said  # not listed yet: down says it is not done
    assert standin.live_instances() == [billing]
    standin.instances[billing].unlisted_reads = 0
    said = rented_run.release_run(RunDir.open(ledger.run_dir.path), None)  # type: ignore[arg-type]
    assert "machines destroyed (verified)" in said and standin.live_instances() == []


def test_a_refused_create_rents_nothing_and_an_old_unanswered_one_that_never_shows_is_closed(standin, tmp_path):
    standin.faults.failing_creates[1] = 400  # Vast said no: nothing rented
    ledger = _ledger(tmp_path)
    with pytest.raises(VastError):
        _provision(standin, ledger)
    assert [i["state"] for i in Ledger(ledger.run_dir).intents] == ["refused"]
    assert rented_rows(tmp_path) == []

    ledger = Ledger(ledger.run_dir)  # a create answered by nothing, long ago, that no listing ever showed
    ledger.intents.append({"offer_id": 2, "machine_id": 302, "node": 0, "label": RUN, "sent_at": 1000.0,
                           "instance_id": None, "state": "unresolved"})
    ledger.save()
    assert reconcile_run(_client(standin), ledger, grace=60.0, clock=lambda: 1000.0 + 30) == []
    assert open_intents(Ledger(ledger.run_dir).intents)  # within the grace: still open
    assert reconcile_run(_client(standin), ledger, grace=60.0, clock=lambda: 1000.0 + 61) == []
    assert [i["state"] for i in Ledger(ledger.run_dir).intents] == ["refused", "not_rented"]
