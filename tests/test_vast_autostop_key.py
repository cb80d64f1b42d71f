"""Autostop's key (issue 25, point 1), piece by piece against the stand-in: how a node tells whether it has Vast's
own CONTAINER_API_KEY (its environment, or the container's first process), the watchdog stopping its machine with
that key (nothing created in the account), and that key's documented scope ("can only start, stop, or destroy that
specific instance"). The whole path, `up --detach` to `down` on a test-bed host: test_vast_lifecycle.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.autostop import CONTAINER_KEY_PROBE, WATCHDOG
from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import VastError
from launcher.places.vast.offers import OfferFilter, choose_offers, search_offers
from launcher.places.vast.provision import provision, teardown

pytestmark = pytest.mark.integration  # python subprocesses and a stand-in over loopback (tests/tiers.py)

KEY = "sk-autokey-8e6c4a2f0d"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdd ddpctl-test"


@pytest.fixture
def standin():
    with VastStandIn(api_key=KEY, offers=[make_offer(i, 400 + i, dph_base=0.1 * i) for i in (1, 2)],
                     boot_delay_s=0.05) as s:
        yield s
        assert s.validation_failures() == []
        assert s.live_instances() == [], "instances left rented"


def _client(standin: VastStandIn) -> VastClient:
    return VastClient(KEY, base_url=standin.url, backoff_base=0.01, pace=0.0)


def _rent(standin: VastStandIn, client: VastClient, label: str) -> int:
    offers = choose_offers(search_offers(client, OfferFilter(disk_gb=16)), 1, 16)
    [rented] = provision(client, offers, nodes=1, image="docker.io/ddpctl/trainer:1", disk=16, label=label,
                         ssh_public_key=PUB, poll_interval=0.05, ready_timeout=10)
    return rented.instance_id


def _own_key(standin: VastStandIn, iid: int) -> str:
    return next(key for key, owner in standin.lifecycle.container_keys.items() if owner == iid)


def _environ_file(path: Path, **variables: str) -> Path:
    """A file laid out like /proc/1/environ (NUL-separated NAME=value)."""
    path.write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in variables.items()))
    return path


def _without_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "CONTAINER_API_KEY"}


def test_a_node_says_where_its_container_key_is_and_never_prints_it(tmp_path):
    secret = "vck-0123456789abcdef"
    environ = _environ_file(tmp_path / "environ", PATH="/usr/bin", CONTAINER_API_KEY=secret)

    def probe(environ_path: Path, env: dict[str, str]) -> str:
        out = subprocess.run([sys.executable, "-c", CONTAINER_KEY_PROBE, "where", str(environ_path)], env=env,
                             capture_output=True, text=True, timeout=30, check=True)
        assert secret not in out.stdout + out.stderr
        return out.stdout.strip()

    assert probe(tmp_path / "none", {**_without_key(), "CONTAINER_API_KEY": secret}) == "environment"
    assert probe(environ, _without_key()) == "process 1"  # Vast's SSH sessions do not see it: PID 1 does
    empty = _environ_file(tmp_path / "empty", PATH="/usr/bin", CONTAINER_API_KEY="")
    assert probe(empty, _without_key()) == "absent"
    assert probe(tmp_path / "unreadable", _without_key()) == "absent"


def _watch(workspace: Path, url: str, iid: int, environ: Path) -> dict:
    """Run the watchdog with the container key (idle 0.3 s after exit_code) and wait for its final state."""
    workspace.mkdir(parents=True)  # no .autostop folder: with the container key nothing is installed first
    (workspace / "exit_code").write_text("0\n")
    out = subprocess.run([sys.executable, "-c", WATCHDOG, "watch", str(workspace), url, str(iid), "0.3", "0.1",
                          "container", str(environ)], env=_without_key(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "watching", out.stderr
    state: dict = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and state.get("state") in (None, "watching"):
        time.sleep(0.1)
        path = workspace / ".autostop" / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {}
    return state


def test_the_watchdog_stops_its_machine_with_the_instances_own_key_and_makes_nothing(standin, tmp_path):
    client = _client(standin)
    iid = _rent(standin, client, "run-own-key")
    environ = _environ_file(tmp_path / "environ", CONTAINER_API_KEY=_own_key(standin, iid))
    state = _watch(tmp_path / "ws", standin.url, iid, environ)
    assert state["state"] == "stopped" and standin.lifecycle.is_stopped(iid)
    assert standin.lifecycle.manage_calls == [(iid, "stopped", f"container:{iid}")]  # with the instance's own key
    assert standin.lifecycle.keys == {}  # no account key was created (nor anything to delete)
    assert not [r for r in standin.requests if r["path"].startswith("/api/v0/auth/apikeys/")]
    teardown(client, [iid], poll_interval=0.05)


def test_a_watchdog_whose_container_key_is_gone_records_why_and_ends(standin, tmp_path):
    client = _client(standin)
    iid = _rent(standin, client, "run-no-key")
    state = _watch(tmp_path / "ws", standin.url, iid, _environ_file(tmp_path / "environ", PATH="/usr/bin"))
    assert state["state"] == "failed" and "CONTAINER_API_KEY" in state["error"]
    assert not standin.lifecycle.is_stopped(iid)
    teardown(client, [iid], poll_interval=0.05)


def test_the_instance_key_can_start_stop_and_destroy_its_instance_and_nothing_else(standin):
    client = _client(standin)
    mine, other = _rent(standin, client, "run-a"), _rent(standin, client, "run-b")
    own = VastClient(_own_key(standin, mine), base_url=standin.url, backoff_base=0.01, pace=0.0, max_retries=0)
    for refused in (own.show_user, lambda: own.show_instance(mine), lambda: own.manage_instance(other, "stopped"),
                    lambda: own.destroy_instance(other), lambda: own.search_offers({"limit": 1}),
                    lambda: own.create_api_key("x", {"api": {}})):
        with pytest.raises(VastError) as err:
            refused()
        assert err.value.status == 403
    own.manage_instance(mine, "stopped")
    own.manage_instance(mine, "running")
    assert [c[:2] for c in standin.lifecycle.manage_calls] == [(mine, "stopped"), (mine, "running")]
    own.destroy_instance(mine)
    assert mine not in standin.live_instances() and other in standin.live_instances()
    with pytest.raises(VastError) as err:  # the key went with its instance
        own.manage_instance(mine, "stopped")
    assert err.value.status == 401
    teardown(client, [other], poll_interval=0.05)
