"""Vast.ai's documented limits and error shapes, against the stand-in (issue 25, points 4, 5, 7 and 8): search kept
under its 10 requests a minute (minutes of pacing run on an injected clock, no real sleeping), a 429's Retry-After,
vast-cli's three quick tries on gateway errors (never on a create), `message`-only error bodies, and empty keys
refused before any request."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from infra.vast_market import cluster_market
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import ApiKeyMissing, VastAuthError, VastError, VastRateLimited, VastUnavailable
from launcher.places.vast.offers import MAX_CLUSTER_PAGES, OfferFilter, choose_offers, search_cluster_offers

pytestmark = pytest.mark.integration  # a stand-in over loopback and ddpctl as a subprocess (tests/tiers.py)

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-limits-5b7d9f1e3a"
SEARCH = ("POST", "/api/v0/bundles/")


class FakeClock:
    """Monotonic seconds that move only when someone sleeps: the client's and the stand-in's limiter's clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _standin(clock: FakeClock, offers: list[dict]) -> VastStandIn:
    standin = VastStandIn(api_key=KEY, offers=offers, boot_delay_s=0.0)
    standin.lifecycle.clock = clock
    standin.lifecycle.switches.windows[SEARCH] = (10, 60.0)  # search_offers.yaml: x-rate-limit 10 per minute
    return standin


def _client(standin: VastStandIn, clock: FakeClock, **kw) -> VastClient:
    return VastClient(KEY, base_url=standin.url, clock=clock, sleep=clock.sleep, **kw)


def _most_in_a_minute(times: list[float]) -> int:
    return max((sum(1 for t in times if start <= t < start + 60.0) for start in times), default=0)


def test_a_multi_node_search_of_eight_pages_and_the_next_search_stay_under_ten_a_minute(clock):
    # the one cluster of two machines sits on the 8th page of a cluster search (64 offers a page)
    offers = cluster_market(cheap=0, lone=64 * (MAX_CLUSTER_PAGES - 1) + 10)
    with _standin(clock, offers) as standin:
        client = _client(standin, clock)
        flt = OfferFilter(disk_gb=16, num_gpus=1)
        started = clock()
        found = search_cluster_offers(client, flt, 2)
        first_took = clock() - started
        assert len(standin.market.searches) == MAX_CLUSTER_PAGES
        assert [o.machine_id for o in choose_offers(found, 2, 16)] == [1901, 1902]
        assert first_took < 10.0  # eight pages fit in the window: no minute-long wait for one multi-node search

        search_cluster_offers(client, flt, 2)  # a second one at once: it waits for the window, it is not refused
        assert len(standin.market.searches) == 2 * MAX_CLUSTER_PAGES
        assert standin.lifecycle.rate_limited == [] and client.rate_limited == 0
        sent = list(standin.lifecycle.window_log[SEARCH])
        assert _most_in_a_minute(sent) <= 9
        assert clock() - started >= 60.0  # the sixteen requests took over a minute of (injected) time
        assert max(clock.sleeps) < 61.0
        assert standin.validation_failures() == []


def test_a_search_refused_429_without_retry_after_waits_the_whole_window(clock):
    with _standin(clock, [make_offer(1, 101)]) as standin:
        # another program on this machine spent the minute's searches just now
        standin.lifecycle.window_log[SEARCH] = deque([clock()] * 10)
        client = _client(standin, clock, backoff_base=0.01)
        assert [o["id"] for o in client.search_offers({"limit": 5})] == [1]
        assert [r["status"] for r in standin.requests] == [429, 200]
        assert client.rate_limited == 1
        assert 60.0 <= max(clock.sleeps) < 61.0  # the documented window, not a guessed second


def test_a_429_with_retry_after_waits_that_long_or_fails_at_once_in_one_line(clock):
    with _standin(clock, [make_offer(1, 101)]) as standin:
        standin.lifecycle.window_log[SEARCH] = deque([clock() - 53.0] * 10)  # they leave the window in 7 s
        standin.lifecycle.switches.retry_after = "7"
        client = _client(standin, clock, backoff_base=0.01)
        client.search_offers({"limit": 5})
        assert 7.0 <= max(clock.sleeps) < 8.0  # what the server asked, not the 60 s default

        standin.requests.clear()
        standin.lifecycle.window_log[SEARCH].extend([clock()] * 10)
        standin.lifecycle.switches.retry_after = "7200"  # the daily search quota: hours away
        slept_before = sum(clock.sleeps)
        with pytest.raises(VastRateLimited) as err:
            client.search_offers({"limit": 5})
        assert "7200 s" in str(err.value) and "\n" not in str(err.value)
        assert len(standin.requests) == 1 and sum(clock.sleeps) - slept_before < 61.0  # no hours of sleeping


def test_gateway_errors_get_three_quick_tries_on_reads_and_none_on_a_create(clock):
    with _standin(clock, [make_offer(1, 101)]) as standin:
        client = _client(standin, clock, pace=0.0)
        standin.faults.burst = [502, 503]
        assert client.show_instance(4242) is None  # the third try answered
        assert clock.sleeps == pytest.approx([0.15, 0.225])  # vast-cli's pauses

        clock.sleeps.clear()
        standin.requests.clear()
        standin.faults.burst = [504, 503, 502, 503]
        with pytest.raises(VastUnavailable) as err:
            client.list_instances()
        assert len(standin.requests) == 3 and "HTTP 502" in str(err.value)
        assert sum(clock.sleeps) < 1.0
        standin.faults.burst.clear()

        for status in (503, 500):
            standin.requests.clear()
            standin.faults.burst = [status]
            with pytest.raises(VastUnavailable):
                client.create_instance(1, {"client_id": "me", "image": "img:1", "disk": 16, "label": "t"})
            assert [r["method"] for r in standin.requests] == ["PUT"]  # a 5xx may have rented: never twice
        standin.requests.clear()
        standin.faults.burst = [500]
        with pytest.raises(VastUnavailable):
            client.show_instance(1)
        assert len(standin.requests) == 1  # a 500 is the server failing this request: vast-cli does not retry it
        assert standin.live_instances() == []


def test_an_error_body_with_only_message_shows_vasts_reason(clock):
    with _standin(clock, [make_offer(1, 101)]) as standin:
        standin.lifecycle.switches.message_only_errors = True
        client = _client(standin, clock, pace=0.0)
        with pytest.raises(VastError) as err:
            client.destroy_instance(999)
        assert err.value.status == 404 and "Instance not found" in str(err.value)
        with pytest.raises(VastError) as err:
            client.create_ssh_key(" ")
        assert err.value.status == 400 and "No ssh key provided" in str(err.value)
        assert "Bad Request" not in str(err.value)


def test_an_empty_key_is_refused_before_any_request(tmp_path, monkeypatch):
    for bad in ("", "   ", "two words"):
        with pytest.raises(VastAuthError):
            VastClient(bad)
    from launcher.places.vast.apikey import load_api_key

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("VAST_API_KEY", "  ")
    with pytest.raises(ApiKeyMissing) as err:
        load_api_key()
    assert "VAST_API_KEY is set but empty" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.delenv("VAST_API_KEY")
    (tmp_path / "vastai").mkdir()
    (tmp_path / "vastai" / "vast_api_key").write_text("\n")  # an empty key file is passed over, never sent
    with pytest.raises(ApiKeyMissing) as err:
        load_api_key()
    assert "no Vast.ai API key" in str(err.value)


def test_vast_login_refuses_an_empty_key_in_one_line_without_asking_vast(tmp_path):
    with VastStandIn(api_key=KEY) as standin:
        env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path), DDPCTL_VAST_URL=standin.url,
                   HOME=str(tmp_path))
        env.pop("VAST_API_KEY", None)
        for typed in ("\n", "   \n", ""):
            out = subprocess.run([sys.executable, "-m", "launcher", "vast", "login"], input=typed, env=env,
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path)
            assert out.returncode != 0
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error:") and "empty" in lines[0], out.stderr
        assert standin.requests == []  # nothing was sent (no `Bearer -`)
        assert not (tmp_path / "ddpctl" / "vast_api_key").exists()
