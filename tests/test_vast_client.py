"""The Vast.ai client against the stand-in: documented requests, error shapes, retries, and the key kept secret."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import (
    VastAuthError,
    VastError,
    VastGone,
    VastNotFound,
    VastRateLimited,
    VastUnavailable,
)

KEY = "sk-test-4f9c2a7e1b3d5f60"


@pytest.fixture
def standin():
    offers = [make_offer(1, 101, dph_base=0.3), make_offer(2, 102, dph_base=0.1)]
    with VastStandIn(api_key=KEY, offers=offers, boot_delay_s=0.0) as s:
        yield s
        assert s.validation_failures() == []  # every request the client sent follows the OpenAPI schemas
        assert s.live_instances() == []


def client(standin: VastStandIn, key: str = KEY, **kw) -> VastClient:
    kw.setdefault("backoff_base", 0.001)
    kw.setdefault("pace", 0.0)  # Vast's per-endpoint intervals: the pacing tests below
    return VastClient(key, base_url=standin.url, **kw)


CREATE = {"client_id": "me", "image": "img:1", "disk": 16, "label": "t", "runtype": "ssh_direct",
          "env": "-p 22:22", "onstart": "touch ~/.no_auto_tmux"}


def test_every_endpoint_round_trip(standin):
    c = client(standin)
    offers = c.search_offers({"verified": {"eq": True}, "type": "on-demand", "limit": 5})
    assert {o["id"] for o in offers} == {1, 2}
    c.create_ssh_key("ssh-ed25519 AAAAC3 me")
    iid = c.create_instance(2, CREATE)
    shown = c.show_instance(iid)
    assert shown is not None and shown["id"] == iid and shown["machine_id"] == 102
    assert [i["id"] for i in c.list_instances()] == [iid]
    assert [i["id"] for i in c.list_instances(label="t")] == [iid]
    assert c.list_instances(label="other") == []
    c.attach_ssh_key(iid, "ssh-ed25519 AAAAC3 other")
    assert standin.instances[iid].keys == ["ssh-ed25519 AAAAC3 me", "ssh-ed25519 AAAAC3 other"]
    c.destroy_instance(iid)
    assert c.show_instance(iid) is None
    with pytest.raises(VastNotFound):
        c.destroy_instance(iid)
    methods = [(r["method"], r["path"]) for r in standin.requests]
    assert ("PUT", "/api/v0/asks/2/") in methods and ("GET", "/api/v1/instances/") in methods


def test_the_stand_in_rejects_requests_that_break_the_contract(standin):
    """The schema check is real: a body the OpenAPI file forbids gets the documented 400."""
    c = client(standin)
    with pytest.raises(VastError) as err:
        # env: neither the OpenAPI file's string nor vast-cli's object of strings
        c.create_instance(2, {"image": "img", "runtype": "ssh_direc ssh_proxy", "env": {"-p 22:22": 1}})
    assert err.value.status == 400 and "runtype" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(VastError):
        c.create_instance(2, {"label": "no image"})
    assert len(standin.validation_failures()) >= 3
    standin.requests.clear()  # the fixture asserts our own client's requests are all valid


def test_offer_gone_maps_to_not_found_and_gone(standin):
    c = client(standin)
    standin.faults.vanished_offers[1] = 410
    with pytest.raises(VastGone) as gone:
        c.create_instance(1, CREATE)
    assert gone.value.status == 410 and "no_such_ask" in str(gone.value)
    with pytest.raises(VastNotFound) as missing:
        c.create_instance(999, CREATE)
    assert missing.value.status == 404 and not isinstance(missing.value, VastGone)


def test_a_burst_of_429_is_retried_and_succeeds(standin):
    sleeps: list[float] = []
    c = client(standin, backoff_base=0.5, sleep=sleeps.append)
    standin.faults.burst = [429, 429, 429]
    assert len(c.search_offers({"limit": 5})) == 2
    assert len(sleeps) == 3
    assert all(0.25 <= s <= 0.5 * 2**i for i, s in enumerate(sleeps))  # exponential, with jitter below


def test_5xx_is_retried_on_reads_but_a_create_is_not_repeated(standin):
    c = client(standin)
    standin.faults.burst = [503, 502]
    assert c.show_instance(12345) is None
    standin.faults.burst = [500]
    with pytest.raises(VastUnavailable):
        c.create_instance(2, CREATE)
    creates = [r for r in standin.requests if r["method"] == "PUT"]
    assert len(creates) == 1  # a 5xx might have rented the machine: never rent it twice


def test_persistent_429_gives_up_in_one_line(standin):
    c = client(standin, max_retries=2)
    standin.faults.burst = [429] * 5
    with pytest.raises(VastRateLimited) as err:
        c.search_offers({"limit": 5})
    assert err.value.status == 429 and "\n" not in str(err.value)


def test_rejected_key_is_one_line_without_the_key(standin):
    wrong = "sk-wrong-9d8c7b6a5f4e"
    c = client(standin, key=wrong)
    for call in (lambda: c.show_instance(1), lambda: c.search_offers({"limit": 1}), lambda: c.destroy_instance(1)):
        with pytest.raises(VastAuthError) as err:
            call()
        text = str(err.value)
        assert "\n" not in text and "rejected the API key" in text and "ddpctl vast login" in text
        assert wrong not in text and wrong not in repr(err.value)


def test_no_connection_is_one_line_and_retried():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    c = VastClient(KEY, base_url=f"http://127.0.0.1:{port}", backoff_base=0.01, max_retries=3,
                   sleep=sleeps.append, pace=0.0)
    with pytest.raises(VastUnavailable) as err:
        c.show_instance(1)
    assert len(sleeps) == 3 and "\n" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__  # requests' error (headers) dropped
    assert KEY not in str(err.value)


def test_base_url_from_the_environment(monkeypatch, standin):
    monkeypatch.setenv("DDPCTL_VAST_URL", standin.url)
    assert VastClient(KEY).base_url == standin.url
    assert VastClient(KEY, base_url="http://x:1/").base_url == "http://x:1"


def test_the_key_never_leaks(standin, caplog, capsys):
    """Key scan over everything the client can show: repr, errors, every log record (urllib3 at DEBUG too)."""
    caplog.set_level(logging.DEBUG)
    c = client(standin)
    texts = [repr(c), str(vars(c)), str(c.__dict__)]
    standin.faults.burst = [429, 503]
    c.show_instance(1)
    for call in (lambda: c.create_instance(999, CREATE), lambda: c.create_instance(1, {"image": 5})):
        try:
            call()
        except VastError as exc:
            texts += [str(exc), repr(exc), str(exc.args)]
    standin.faults.burst = [429] * 10
    with pytest.raises(VastRateLimited) as err:
        client(standin, max_retries=1).search_offers({})  # unpaced: no wait for the search window
    texts.append(str(err.value))
    standin.faults.burst = []
    texts += [r.getMessage() for r in caplog.records] + [str(r.args) for r in caplog.records]
    out = capsys.readouterr()
    texts += [out.out, out.err]
    assert any("retrying" in t for t in texts)  # the logs were captured, not empty
    assert not [t for t in texts if KEY in t]
    assert all("api_key" not in r["query"] for r in standin.requests)  # nor in any URL
    standin.requests.clear()


def test_empty_or_spaced_key_is_refused():
    for bad in ("", "two words"):
        with pytest.raises(VastAuthError):
            VastClient(bad)


def test_a_create_is_retried_only_when_no_connection_was_made():
    """Judged by urllib3's exception type (NewConnectionError), not by the text of requests' message."""
    with socket.socket() as s:  # a port nobody listens on: the request surely never left
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    c = VastClient(KEY, base_url=f"http://127.0.0.1:{port}", backoff_base=0.01, max_retries=2,
                   sleep=sleeps.append, pace=0.0)
    with pytest.raises(VastUnavailable):
        c.create_instance(2, CREATE)
    assert len(sleeps) == 2

    with socket.socket() as server:  # accepts the connection, then drops it unanswered: the create may have acted
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        threading.Thread(target=_drop_connections, args=(server,), daemon=True).start()
        sleeps.clear()
        c = VastClient(KEY, base_url=f"http://127.0.0.1:{server.getsockname()[1]}", backoff_base=0.01,
                       max_retries=2, sleep=sleeps.append, pace=0.0)
        with pytest.raises(VastUnavailable):
            c.create_instance(2, CREATE)
        assert sleeps == []  # never sent twice


def _drop_connections(server: socket.socket) -> None:
    """Accept each connection and close it without an answer, until the listening socket is closed."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


def test_requests_to_one_endpoint_keep_vasts_interval_and_others_do_not_wait(standin):
    standin.lifecycle.switches.rate_limits[("GET", "/api/v1/instances/")] = 0.3  # the spec says 1.0 s
    c = client(standin, pace=0.3)
    started = time.monotonic()
    for _ in range(4):
        c.list_instances()
    assert time.monotonic() - started >= 0.85  # three waits of 0.3 s
    assert standin.lifecycle.rate_limited == [] and c.rate_limited == 0
    before = time.monotonic()
    c.show_instance(1)  # another endpoint: no wait
    assert time.monotonic() - before < 0.25


def test_a_plain_text_429_teaches_the_client_the_endpoints_threshold(standin):
    # Vast's limiter answers in plain text ("API requests too frequent endpoint threshold=X"), no Retry-After
    standin.lifecycle.switches.rate_limits[("GET", "/api/v1/instances/")] = 0.4
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    c = client(standin, pace=0.0, sleep=sleep)  # knows no interval: learns it from the first 429
    c.list_instances()
    c.list_instances()
    assert c.rate_limited == 1 and sleeps[0] >= 0.4
    statuses = [r["status"] for r in standin.requests]
    assert statuses == [200, 429, 200]
    for _ in range(3):
        c.list_instances()
    assert c.rate_limited == 1  # kept to the learned threshold since
    assert len(standin.lifecycle.rate_limited) == 1


def test_a_plain_text_error_body_reaches_the_message(standin):
    standin.lifecycle.switches.rate_limits[("GET", "/api/v1/instances/")] = 5.0
    c = client(standin, max_retries=0)
    c.list_instances()
    with pytest.raises(VastRateLimited) as err:
        c.list_instances()
    assert "threshold=5.0" in str(err.value) and "\n" not in str(err.value)
