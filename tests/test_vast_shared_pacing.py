"""Vast.ai's limits count per key, not per process: twelve `ddpctl offers` started at once send at most 10 searches
in any minute, and creates from several processes stay 4.5 s apart, all with Vast's own intervals (no scaled-down
pace). The stand-in times every request; its limiter refuses (429) what would break the documented limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.pacing import Pacer
from launcher.places.vast.shared_pacing import PacingFile, pacing_file

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-pace-1a2b3c4d5e6f7a8b"
SEARCH = ("POST", "/api/v0/bundles/")
CREATE = ("PUT", "/api/v0/asks/{id}/")

pytestmark = pytest.mark.integration  # ddpctl processes and a stand-in over loopback (tests/tiers.py)


def _env(standin: VastStandIn, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VAST_API_KEY"}
    env.update(VAST_API_KEY=KEY, DDPCTL_VAST_URL=standin.url, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"),
               PYTHONPATH=str(ROOT))
    return env


def _times(standin: VastStandIn, method: str, path_start: str) -> list[float]:
    return sorted(r["at"] for r in standin.requests if r["method"] == method and r["path"].startswith(path_start))


def test_twelve_offers_processes_at_once_keep_to_ten_searches_a_minute_together(tmp_path):
    offers = [make_offer(i, 400 + i, dph_base=0.1 * i) for i in range(1, 4)]
    with VastStandIn(api_key=KEY, offers=offers) as standin:
        standin.lifecycle.switches.windows[SEARCH] = (10, 60.0)  # Vast's documented search limit: more is a 429
        env = _env(standin, tmp_path / "home")
        procs = [subprocess.Popen([sys.executable, "-m", "launcher", "offers", "--json"], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(12)]
        try:
            outs = [p.communicate(timeout=240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        assert [p.returncode for p in procs] == [0] * 12, [err for _, err in outs]
        assert all(len(json.loads(out)) == 3 for out, _ in outs)  # every process got its offers
        searches = _times(standin, "POST", "/api/v0/bundles/")
        assert len(searches) == 12 and standin.lifecycle.rate_limited == []  # none refused, none re-sent
        most_in_a_minute = max(sum(1 for t in searches if start <= t < start + 60.0) for start in searches)
        assert most_in_a_minute <= 10
        assert searches[-1] - searches[0] >= 60.0 - 1.0  # the last ones waited for the window, not sent early
    [shared] = (tmp_path / "home" / ".ddpctl" / "vast-pacing").iterdir()  # one file for this key and address
    assert oct(shared.stat().st_mode & 0o777) == "0o600" and KEY not in shared.read_text()


CREATE_SCRIPT = """
import sys
from launcher.places.vast.apikey import vast_client
with vast_client() as client:
    print(client.create_instance(int(sys.argv[1]), {"client_id": "me", "image": "ddpctl/trainer:1", "disk": 16,
                                                    "label": "pace-test", "runtype": "ssh_direct"}))
"""


def test_creates_from_three_processes_stay_four_and_a_half_seconds_apart(tmp_path):
    offers = [make_offer(i, 500 + i) for i in range(1, 4)]
    with VastStandIn(api_key=KEY, offers=offers) as standin:
        standin.lifecycle.switches.rate_limits[CREATE] = 4.5  # the create's documented threshold: sooner is a 429
        env = _env(standin, tmp_path / "home")
        procs = [subprocess.Popen([sys.executable, "-c", CREATE_SCRIPT, str(i)], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 2, 3)]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            client = VastClient(KEY, base_url=standin.url, pace=0.0)
            for iid in standin.live_instances():
                client.destroy_instance(iid)
        assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
        creates = _times(standin, "PUT", "/api/v0/asks/")
        assert len(creates) == 3 and standin.lifecycle.rate_limited == []
        assert all(b - a >= 4.5 for a, b in zip(creates, creates[1:], strict=False)), creates
        assert standin.live_instances() == []


def test_two_pacers_over_one_file_share_the_turns_and_a_damaged_file_counts_as_empty(tmp_path, monkeypatch):
    """Two pacers over one file (as two processes): the second waits for the turn the first took."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = pacing_file(KEY, "http://127.0.0.1:1")
    assert path.parent == tmp_path / ".ddpctl" / "vast-pacing" and KEY not in path.name
    now = [1000.0]
    slept: list[float] = []

    def advance(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    first, second = (Pacer(1.0, lambda: now[0], advance, PacingFile(path)) for _ in range(2))
    first.wait_turn(CREATE)
    second.wait_turn(CREATE)
    assert slept == [pytest.approx(4.5)]
    path.write_text("not json")  # damaged: counts as empty, and is written anew
    first.wait_turn(CREATE)
    assert slept == [pytest.approx(4.5)]
    with PacingFile(path).state() as state:
        assert state.last["PUT /api/v0/asks/{id}/"] == pytest.approx(1004.5)


def test_a_home_where_the_file_cannot_be_written_paces_the_process_alone(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")  # its "directory" is a file: the pacing file cannot be made
    now = [0.0]
    pacer = Pacer(1.0, lambda: now[0], lambda s: now.__setitem__(0, now[0] + s),
                  PacingFile(blocked / "vast-pacing" / "x.json"))
    pacer.wait_turn(CREATE)
    pacer.wait_turn(CREATE)  # still paced, in this process
    assert now[0] == pytest.approx(4.5)
