"""Autostop with the instance's own key, end to end (issue 25, point 1): `up --detach` on a rented test-bed host whose
instance has Vast's CONTAINER_API_KEY; its watchdog stops the machine with that key (no account key is created,
none is deleted), run.json, the event and `status` say which key and why, and `down` starts, pulls and destroys.
The fallback, a scoped key where the instance has none: test_vast_lifecycle.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.vast_standin import VastStandIn, make_offer
from tests.test_vast_lifecycle import DISK, KEY, _ddpctl
from tests.testbed_fixtures import needs_testbed


@needs_testbed
@pytest.mark.testbed
def test_a_detached_run_stops_with_the_instances_own_key_and_creates_no_key(tmp_path):
    cleanup_stale("ddpownk")
    with Testbed("ddpownk", n_hosts=0, host_python=True) as bed, \
            VastStandIn(api_key=KEY, offers=[make_offer(1, 311, dph_base=0.40, storage_cost=0.20)],
                        host_factory=lambda _iid: bed.add_host(22), host_remover=bed.remove_host, boot_delay_s=0.2,
                        bind=bed.state.bridge_address) as standin:
        runs = tmp_path / "runs"
        up = _ddpctl(standin, tmp_path, "up", "--provider", "vast", "--image", "docker.io/ddpctl/trainer:1",
                     "--disk", str(DISK), "--gpus", "1", "--runs-dir", str(runs), "--epochs", "1",
                     "--synthetic-train-size", "256", "--synthetic-test-size", "64", "--detach", "--autostop", "0.1")
        assert up.returncode == 0, up.stderr
        assert "with its instance's own CONTAINER_API_KEY" in up.stderr
        (run,) = [p for p in runs.iterdir() if p.is_dir()]
        [iid] = standin.live_instances()
        [own_key] = [k for k, owner in standin.lifecycle.container_keys.items() if owner == iid]
        assert standin.lifecycle.keys == {}  # nothing created in the account
        home = Path(bed.hosts[0].home)
        assert list(home.rglob(".autostop/key")) == []  # nothing written to the node either
        record = json.loads((run / "run.json").read_text())
        [used] = record["autostop"]["keys"]
        assert used["node"] == 0 and used["key"] == "container" and "CONTAINER_API_KEY (environment)" in used["why"]
        assert record["instances"][0]["autostop_key"] == "container" and "autostop_key_id" not in record["instances"][0]
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        [armed] = [e for e in events if e["event"] == "vast.autostop_armed"]
        assert armed["keys"] == [] and armed["key_sources"] == [used]

        deadline = time.monotonic() + 150  # training (1 epoch), then 6 s with no pull
        while time.monotonic() < deadline and not standin.lifecycle.is_stopped(iid):
            time.sleep(0.5)
        assert standin.lifecycle.manage_calls == [(iid, "stopped", f"container:{iid}")]  # the node, its own key

        pull = _ddpctl(standin, tmp_path, "pull", run.name, "--runs-dir", str(runs))  # starts it, re-arms
        # its next stop (6 s after this pull) is answered 503 for a while: the machine stays up to be asked
        standin.faults.burst, standin.faults.burst_paths = [503] * 20, f"/api/v0/instances/{iid}/"
        assert pull.returncode == 0, pull.stderr
        status = _ddpctl(standin, tmp_path, "status", run.name, "--json", "--runs-dir", str(runs))
        assert status.returncode == 0, status.stderr
        [row] = json.loads(status.stdout)["nodes"]
        assert row["autostop"] == "watching" and row["autostop_key"] == "container"
        table = _ddpctl(standin, tmp_path, "status", run.name, "--runs-dir", str(runs))
        shown = table.stdout + table.stderr  # the table (rich) may wrap its cells: the key's name is one word
        assert table.returncode == 0 and "watching" in shown and "CONTAINER_API_KEY" in shown, shown

        standin.faults.burst.clear()
        down = _ddpctl(standin, tmp_path, "down", run.name, "--runs-dir", str(runs))
        assert down.returncode == 0, down.stderr
        assert standin.live_instances() == [] and bed.hosts == []
        assert standin.lifecycle.keys == {}
        assert not [r for r in standin.requests if r["path"].startswith("/api/v0/auth/apikeys/")]
        assert json.loads((run / "summary.json").read_text())["epochs"] == 1
        texts = [up.stdout, up.stderr, pull.stdout, pull.stderr, status.stdout, shown, down.stdout, down.stderr]
        texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
        assert [t for t in texts if KEY in t or own_key in t] == []  # the instance's key never left the node
