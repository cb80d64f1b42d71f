"""Vast.ai machines' lives against the stand-in's lifecycle switches (infra/vast_lifecycle.py): images that cannot
be pulled, private registries, Vast's per-endpoint rate limits, states that come late or go quiet. Instances are
BannerHosts (nothing past SSH's greeting is needed), except for autostop: a detached run on a real test-bed host
whose watchdog reaches the stand-in over the bed's bridge."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import ENDPOINT_INTERVALS_S, VastClient
from launcher.places.vast.errors import ProvisionError, VastError
from launcher.places.vast.offers import OfferFilter, choose_offers, search_offers
from launcher.places.vast.provision import provision, teardown
from launcher.places.vast.registry_login import registry_login
from launcher.places.vast.start_failures import classify_status_msg
from tests.testbed_fixtures import needs_testbed

KEY = "sk-life-0a1b2c3d4e5f6071"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdd ddpctl-test"
DISK = 16
IMAGE = "ghcr.io/someone/trainer:1"
SECRET = "ghp_registrysecret42XYZ"


@pytest.fixture
def standin():
    catalogue = [make_offer(i, 200 + i, dph_base=0.1 * i, cluster_id=5 if i <= 5 else None) for i in range(1, 9)]
    with VastStandIn(api_key=KEY, offers=catalogue, boot_delay_s=0.1) as s:
        yield s
        assert s.validation_failures() == []
        assert s.live_instances() == [], "instances left rented"


def _client(standin: VastStandIn, pace: float = 0.0) -> VastClient:
    return VastClient(KEY, base_url=standin.url, backoff_base=0.05, pace=pace)


def _provision(standin: VastStandIn, client: VastClient, nodes: int = 1, **kw):
    offers = choose_offers(search_offers(client, OfferFilter(disk_gb=DISK)), nodes, DISK)
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("ready_timeout", 10.0)
    kw.setdefault("image", "docker.io/ddpctl/trainer:1")
    return provision(client, offers, nodes=nodes, disk=DISK, label="run-life", ssh_public_key=PUB, **kw)


@pytest.mark.parametrize(("message", "image"), [
    ("Error response from daemon: manifest for docker.io/x/y:2 not found: manifest unknown: manifest unknown", True),
    ("Error response from daemon: pull access denied for x/y, repository does not exist or may require "
     "'docker login': denied: requested access to the resource is denied", True),
    ('Error response from daemon: Head "https://ghcr.io/v2/o/i/manifests/1": unauthorized', True),
    ("docker: invalid reference format.", True),
    ("Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime "
     "create failed: runc create failed: unable to start container process", False),
    ("failed to register layer: write /var/lib/docker/x: no space left on device", False),
    ('Error response from daemon: could not select device driver "" with capabilities: [[gpu]]', False),
])
def test_status_messages_are_told_apart(message: str, image: bool) -> None:
    failure = classify_status_msg(message)
    assert failure is not None and failure.image is image and "\n" not in failure.reason


@pytest.mark.parametrize("message", ["", "pulling image", "success, running docker.io/x/y:1", "loading"])
def test_progress_messages_are_no_failure(message: str) -> None:
    assert classify_status_msg(message) is None


def test_a_missing_image_rents_one_machine_and_stops(standin):
    standin.lifecycle.switches.missing_images.add("docker.io/ddpctl/trainer:1")
    events: list[dict] = []
    with pytest.raises(ProvisionError) as err:
        _provision(standin, _client(standin), on_event=events.append, ready_timeout=60)
    line = str(err.value)
    assert "\n" not in line and "docker.io/ddpctl/trainer:1" in line and "manifest unknown" in line
    assert len(standin.instances) == 1  # the fixture checks it was destroyed
    assert [e["image_error"] for e in events if e["event"] == "vast.instance_failed"] == [True]


def test_a_machine_with_a_full_disk_is_replaced(standin):
    standin.lifecycle.switches.disk_full_machines.add(201)
    client = _client(standin)
    rented = _provision(standin, client)
    assert rented[0].offer.machine_id == 202 and len(standin.instances) == 2
    teardown(client, [r.instance_id for r in rented], poll_interval=0.05)


def test_status_null_then_loading_and_rebooting_are_waited_for(standin):
    # the states Vast's docs call transitional; `unknown` is not one (tests/test_vast_states.py)
    standin.lifecycle.switches.null_status_s = 0.3
    standin.lifecycle.switches.rebooting_machines[201] = 0.5
    client = _client(standin)
    rented = _provision(standin, client, transient_grace=5.0)
    assert rented[0].offer.machine_id == 201 and len(standin.instances) == 1
    teardown(client, [r.instance_id for r in rented], poll_interval=0.05)


def test_private_image_gets_image_login(standin, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DDPCTL_REGISTRY_LOGIN", raising=False)
    auth = base64.b64encode(f"someone:{SECRET}".encode()).decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"ghcr.io": {"auth": auth}}}))
    login = registry_login(IMAGE)
    assert login == f"-u someone -p {SECRET} ghcr.io"
    standin.lifecycle.switches.private_images[IMAGE] = login
    client = _client(standin)
    with pytest.raises(ProvisionError) as err:  # without it: pull access denied, fatal after one machine
        _provision(standin, client, image=IMAGE)
    assert "pull access denied" in str(err.value) and SECRET not in str(err.value)
    rented = _provision(standin, client, image=IMAGE, image_login=login)
    assert standin.instances[rented[0].instance_id].request["image_login"] == login
    teardown(client, [r.instance_id for r in rented], poll_interval=0.05)


def test_four_nodes_under_vasts_rate_limits_see_few_429s(standin):
    # The limiter holds every endpoint to the spec's own x-rate-limit thresholds (here ten times faster), and
    # the client keeps the same pace: creating, polling, attaching keys and tearing down 4 nodes.
    pace = 0.1
    for endpoint, seconds in ENDPOINT_INTERVALS_S.items():
        standin.lifecycle.switches.rate_limits[endpoint] = seconds * pace
    client = _client(standin, pace=pace)
    rented = _provision(standin, client, nodes=4, poll_interval=0.1)
    assert len(rented) == 4 and len({r.offer.machine_id for r in rented}) == 4
    results = teardown(client, [r.instance_id for r in rented], overlay_name=rented[0].overlay_name,
                       poll_interval=0.1)
    assert all(r.destroyed for r in results)
    polls = [r for r in standin.requests if r["method"] == "GET" and r["path"] == "/api/v1/instances/"]
    assert len(polls) >= 2 and all(json.loads(r["query"]["select_filters"]) == {"label": {"eq": "run-life"}}
                                   for r in polls)
    assert not [r for r in standin.requests if r["method"] == "GET" and r["path"].startswith("/api/v0/instances/")
                and r["status"] == 200 and standin.requests.index(r) < standin.requests.index(polls[-1])]
    assert len(standin.lifecycle.rate_limited) <= 3 and client.rate_limited <= 3


RUN = """
import sys
from launcher.cli.app import main
main(sys.argv[1:])
"""


def _up(standin: VastStandIn, tmp: Path, *args: str, env: dict[str, str] | None = None):
    full = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "DDPCTL_REGISTRY_LOGIN")}
    full.update(DDPCTL_VAST_URL=standin.url, VAST_API_KEY=KEY, HOME=str(tmp / "home"),
                XDG_CONFIG_HOME=str(tmp / "config"), DOCKER_CONFIG=str(tmp / "docker"), **(env or {}))
    argv = [sys.executable, "-c", RUN, "up", "--provider", "vast", "--disk", str(DISK), "--gpus", "1",
            "--runs-dir", str(tmp / "runs"), "--ready-timeout", "60", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=full)


def test_up_with_a_typod_image_rents_one_machine_and_says_so_in_one_line(standin, tmp_path):
    standin.lifecycle.switches.missing_images.add("docker.io/ddpctl/traner:1")
    result = _up(standin, tmp_path, "--image", "docker.io/ddpctl/traner:1")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "docker.io/ddpctl/traner:1" in errors[0] and "manifest unknown" in errors[0]
    assert "destroyed" in errors[0] and "Traceback" not in result.stderr
    assert len(standin.instances) == 1 and standin.live_instances() == []


def test_up_registry_login_secret_is_in_no_output_or_file(standin, tmp_path):
    standin.lifecycle.switches.private_images[IMAGE] = f"-u someone -p {SECRET} ghcr.io"
    missing = _up(standin, tmp_path, "--image", IMAGE, "--registry-login")  # no credentials anywhere: nothing rented
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "DDPCTL_REGISTRY_LOGIN" in missing.stderr
    assert standin.instances == {}
    result = _up(standin, tmp_path, "--image", IMAGE, "--registry-login",
                 env={"DDPCTL_REGISTRY_LOGIN": f"someone:{SECRET}"})
    # the image was pulled with the login (the instance ran); a BannerHost then fails SSH, and up destroys it
    [inst] = standin.instances.values()
    assert inst.request["image_login"] == f"-u someone -p {SECRET} ghcr.io"
    assert result.returncode == 1 and standin.live_instances() == []
    texts = [missing.stdout, missing.stderr, result.stdout, result.stderr]
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert [t for t in texts if SECRET in t] == []


def _ddpctl(standin: VastStandIn, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "VAST_API_KEY"}
    full.update(DDPCTL_VAST_URL=standin.url, VAST_API_KEY=KEY, HOME=str(tmp / "home"),
                XDG_CONFIG_HOME=str(tmp / "config"), DDPCTL_KNOWN_HOSTS=str(tmp / "known_hosts"))
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=240, env=full)


@needs_testbed
@pytest.mark.testbed
def test_detached_run_is_autostopped_then_down_starts_pulls_verifies_and_destroys(tmp_path):
    cleanup_stale("ddplife")
    with Testbed("ddplife", n_hosts=0, host_python=True) as bed, \
            VastStandIn(api_key=KEY, offers=[make_offer(1, 301, dph_base=0.40, storage_cost=0.20)],
                        host_factory=lambda _iid: bed.add_host(22), host_remover=bed.remove_host, boot_delay_s=0.2,
                        bind=bed.state.bridge_address) as standin:
        # an instance without CONTAINER_API_KEY: the fallback, a scoped key (the instance's own: test_vast_autostop_e2e)
        standin.lifecycle.switches.container_keys = False
        runs = tmp_path / "runs"
        up = _ddpctl(standin, tmp_path, "up", "--provider", "vast", "--image", "docker.io/ddpctl/trainer:1",
                     "--disk", str(DISK), "--gpus", "1", "--runs-dir", str(runs), "--epochs", "1",
                     "--synthetic-train-size", "256", "--synthetic-test-size", "64", "--detach", "--autostop", "0.05")
        assert up.returncode == 0, up.stderr
        assert "autostop" in up.stderr
        (run,) = [p for p in runs.iterdir() if p.is_dir()]
        [iid] = standin.live_instances()
        [key] = standin.lifecycle.keys.values()  # one stop-only key per machine
        assert key.permissions == {"api": {"instance_write": {"api.instance.manage": {
            "constraints": {"id": {"eq": iid}, "state": {"eq": "stopped"}}}}}}
        home = Path(bed.hosts[0].home)
        key_file = next(home.rglob(".autostop/key"))
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.read_text().strip() == key.key
        # the key was read back and proven before it went to the node; the shape that passed is recorded
        record = json.loads((run / "run.json").read_text())
        assert record["autostop"]["key_shapes"] == ["documented"]
        assert record["instances"][0]["autostop_key_shape"] == "documented"
        [used] = record["autostop"]["keys"]  # which key, and why, recorded
        assert used["key"] == "scoped" and used["key_id"] == key.id and "no CONTAINER_API_KEY" in used["why"]
        assert "stop-only account key made for node(s) [0] (no CONTAINER_API_KEY there)" in up.stderr
        assert [r["path"] for r in standin.requests if r.get("scoped_key") and r["method"] == "GET"] == [
            "/api/v0/users/current/", f"/api/v0/instances/{iid}/"]

        deadline = time.monotonic() + 150  # training (1 epoch), then 3 s with no pull
        while time.monotonic() < deadline and not standin.lifecycle.is_stopped(iid):
            time.sleep(0.5)
        assert standin.lifecycle.manage_calls == [(iid, "stopped", key.name)]  # by the node, with its own key
        assert (home / ".ddpctl" / "runs" / run.name / "exit_code").read_text().strip() == "0"

        # That key can do nothing else: not start the machine, not destroy it.
        scoped = VastClient(key.key, base_url=standin.url, backoff_base=0.01, pace=0.0)
        for action in (lambda: scoped.manage_instance(iid, "running"), lambda: scoped.destroy_instance(iid)):
            with pytest.raises(VastError) as err:
                action()
            assert err.value.status == 403
        assert standin.lifecycle.is_stopped(iid) and standin.live_instances() == [iid]

        status = _ddpctl(standin, tmp_path, "status", run.name, "--json", "--runs-dir", str(runs))
        assert status.returncode == 0, status.stderr
        [row] = json.loads(status.stdout)["nodes"]
        storage = 0.20 * DISK / 720
        assert row["state"].startswith("machine stopped") and f"{storage:.4f}" in row["state"]
        rented = _ddpctl(standin, tmp_path, "status", "--rented", "--json", "--runs-dir", str(runs))
        [machine] = json.loads(rented.stdout)["rented"]
        assert machine["state"] == "stopped" and machine["dph"] == pytest.approx(storage)

        # pull starts it, pulls, and its watchdog watches again; this time Vast answers its stop 503 (it retries,
        # still watching: status says so), then refuses the key (403): status warns that the machine bills in full
        pull = _ddpctl(standin, tmp_path, "pull", run.name, "--runs-dir", str(runs))
        standin.faults.burst, standin.faults.burst_paths = [503] * 20, f"/api/v0/instances/{iid}/"  # 3 s before
        assert pull.returncode == 0, pull.stderr
        assert (run / "nodes" / "0" / "exit_code").read_text().strip() == "0"
        assert standin.lifecycle.manage_calls[1:] == [(iid, "running", "owner")]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not [r for r in standin.requests if r.get("scoped_key")
                                                   and r["method"] == "PUT" and r.get("status") == 503]:
            time.sleep(0.2)
        watching = _ddpctl(standin, tmp_path, "status", run.name, "--json", "--runs-dir", str(runs))
        assert watching.returncode == 0 and json.loads(watching.stdout)["nodes"][0]["autostop"] == "watching"
        assert json.loads(watching.stdout)["nodes"][0]["autostop_key"] == "scoped"
        assert "autostop" not in watching.stderr
        standin.lifecycle.switches.manage_permission = "api.instance.change_state"
        standin.faults.burst.clear()
        state_file = next(home.rglob(".autostop/state.json"))
        while time.monotonic() < deadline and '"failed"' not in state_file.read_text():
            time.sleep(0.2)
        failed = _ddpctl(standin, tmp_path, "status", run.name, "--json", "--runs-dir", str(runs))
        assert failed.returncode == 0 and json.loads(failed.stdout)["nodes"][0]["autostop"] == "failed (HTTP 403)"
        [warning] = [line for line in failed.stderr.splitlines() if "autostop" in line]
        assert warning == (f"node 0: autostop failed (HTTP 403): the machine bills in full until "
                           f"`ddpctl down {run.name}`")
        # the next pull starts the failed watchdog again: stopped once more, 3 s after that pull
        standin.lifecycle.switches.manage_permission = "api.instance.manage"
        pull = _ddpctl(standin, tmp_path, "pull", run.name, "--runs-dir", str(runs))
        assert pull.returncode == 0 and "autostop watches node(s) [0] again" in pull.stderr, pull.stderr
        assert standin.lifecycle.manage_calls[2:] == []
        while time.monotonic() < deadline and not standin.lifecycle.is_stopped(iid):
            time.sleep(0.5)
        assert standin.lifecycle.manage_calls[2:] == [(iid, "stopped", key.name)]

        down = _ddpctl(standin, tmp_path, "down", run.name, "--runs-dir", str(runs))
        assert down.returncode == 0, down.stderr
        assert standin.lifecycle.manage_calls[3:] == [(iid, "running", "owner")]  # started again, then destroyed
        assert standin.live_instances() == [] and bed.hosts == []
        assert all(k.deleted for k in standin.lifecycle.keys.values())
        assert json.loads((run / "summary.json").read_text())["epochs"] == 1
        events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
        assert events.index("vast.starting_stopped") < events.index("pulled") < events.index("vast.instance_destroyed")
        record = json.loads((run / "run.json").read_text())
        [inst] = record["instances"]
        stops = inst["stops"]
        assert len(stops) == 2 and all(start > stop for stop, start in stops)
        stopped = sum(start - stop for stop, start in stops)
        ran = inst["destroyed_at"] - inst["created_at"] - stopped
        expected = (0.40 + storage) * ran / 3600 + storage * stopped / 3600
        assert record["cost_usd"] == pytest.approx(expected, abs=1e-6)
        split = record["cost_split"]  # as Vast bills it: the GPU only while running, the disk all along
        assert split["gpu_usd"] == pytest.approx(0.40 * ran / 3600, abs=1e-6)
        assert split["storage_usd"] == pytest.approx(storage * (ran + stopped) / 3600, abs=1e-6)
        texts = [up.stdout, up.stderr, status.stdout, rented.stdout, pull.stdout, pull.stderr, down.stdout, down.stderr,
                 watching.stdout, watching.stderr, failed.stdout, failed.stderr]
        texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
        assert [t for t in texts if KEY in t or key.key in t] == []


@pytest.mark.parametrize(("image", "registry"), [
    ("ddpctl/trainer:1", "docker.io"), ("ubuntu", "docker.io"), ("ghcr.io/o/i:1", "ghcr.io"),
    ("localhost:5000/i", "localhost:5000"), ("registry.example.com/team/i@sha256:ab", "registry.example.com"),
])
def test_the_registry_is_read_from_the_image_reference(image: str, registry: str) -> None:
    from launcher.places.vast.registry_login import registry_of

    assert registry_of(image) == registry


def test_registry_login_refuses_a_credential_helper_and_a_bad_variable_in_one_line(monkeypatch, tmp_path):
    from launcher.errors import SpecError

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DDPCTL_REGISTRY_LOGIN", raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"ghcr.io": {}}, "credsStore": "desktop"}))
    with pytest.raises(SpecError) as helper:
        registry_login(IMAGE)
    assert "credential helper" in str(helper.value) and "DDPCTL_REGISTRY_LOGIN" in str(helper.value)
    monkeypatch.setenv("DDPCTL_REGISTRY_LOGIN", SECRET)  # no USER: part
    with pytest.raises(SpecError) as bad:
        registry_login(IMAGE)
    assert "USER:TOKEN" in str(bad.value) and SECRET not in str(bad.value) and "\n" not in str(bad.value)


def test_autostop_without_detach_is_refused_before_anything_is_rented(standin, tmp_path):
    result = _up(standin, tmp_path, "--image", "docker.io/ddpctl/trainer:1", "--autostop", "10")
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "--detach" in result.stderr
    negative = _up(standin, tmp_path, "--image", "docker.io/ddpctl/trainer:1", "--detach", "--autostop", "-1")
    assert negative.returncode == 1 and negative.stderr.count("\n") == 1 and "--autostop" in negative.stderr
    assert standin.instances == {} and not (tmp_path / "runs").exists()


def test_ssh_goes_to_the_direct_address_when_the_proxy_is_another_host(standin):
    standin.lifecycle.switches.proxy_host = "ssh7.vast.ai"  # Vast's proxy; the direct port is on public_ipaddr
    client = _client(standin)
    rented = _provision(standin, client, ready_timeout=5.0)
    assert (rented[0].ssh_host, rented[0].ssh_port) == standin.instances[rented[0].instance_id].address
    assert client.show_instance(rented[0].instance_id)["ssh_host"] == "ssh7.vast.ai"
    teardown(client, [r.instance_id for r in rented], poll_interval=0.05)


@pytest.mark.parametrize("permission_name", ["api.instance.manage", "api.instance.change_state"])
def test_the_watchdog_stops_its_machine_once_idle_or_records_why_it_could_not(standin, tmp_path, permission_name):
    # The watchdog script itself, run here against the stand-in: the second case is a Vast whose permission
    # name differs from ours (the key is refused): it must record the failure and end, not retry forever.
    from launcher.places.vast.autostop import WATCHDOG
    from launcher.places.vast.scoped_key import stop_only_permissions

    standin.lifecycle.switches.manage_permission = permission_name
    client = _client(standin)
    rented = _provision(standin, client)
    iid = rented[0].instance_id
    key_id, key = client.create_api_key("t", stop_only_permissions(iid))
    workspace = tmp_path / "ws"
    (workspace / ".autostop").mkdir(parents=True)
    (workspace / ".autostop" / "key").write_text(key)
    (workspace / "exit_code").write_text("0\n")
    out = subprocess.run([sys.executable, "-c", WATCHDOG, "watch", str(workspace), standin.url, str(iid), "0.3", "0.1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "watching" and key not in out.stdout + out.stderr
    state: dict = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and state.get("state") in (None, "watching"):
        time.sleep(0.1)
        path = workspace / ".autostop" / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {}
    if permission_name == "api.instance.manage":
        assert state["state"] == "stopped" and standin.lifecycle.is_stopped(iid)
    else:
        assert state == {"state": "failed", "error": "HTTP 403", "pid": state["pid"]}
        assert not standin.lifecycle.is_stopped(iid)
    client.delete_api_key(key_id)
    teardown(client, [iid], poll_interval=0.05)


def test_a_paced_replacement_does_not_time_out_the_other_nodes(standin):
    # Creates are paced (4.5 s apart on Vast, 1.35 s here): replacing node 0's stuck machine waits that long;
    # node 1's machine, seen "loading" just before, must be judged on a fresh listing, not timed out on the old one.
    standin.faults.stuck_machines.add(201)
    events: list[dict] = []
    client = _client(standin, pace=0.3)
    rented = _provision(standin, client, nodes=2, ready_timeout=1.0, on_event=events.append)
    assert sorted(r.offer.machine_id for r in rented) == [202, 203]
    assert [e["machine_id"] for e in events if e["event"] == "vast.instance_failed"] == [201]
    teardown(client, [r.instance_id for r in rented], overlay_name=rented[0].overlay_name, poll_interval=0.05)


def test_a_stop_whose_pull_did_not_finish_keeps_the_machines(tmp_path) -> None:
    """After Ctrl-C the nodes are stopped, then pulled; a pull cut short (a second Ctrl-C) or failed leaves the only
    copy on the rented machines, so they are kept (and said to bill) instead of destroyed."""
    from launcher.execute.following.interruption import Outcome, _record
    from launcher.places.vast.provider import not_pulled_after_stop
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    run_dir = RunDir.create(tmp_path, RunSpec(run_id="vast-run"), {"nodes": []})
    assert not not_pulled_after_stop(run_dir)  # no stop yet: the usual rules apply
    _record(run_dir, Outcome("stopped every node; the pull was interrupted", stopped=True, pulled=False))
    assert not_pulled_after_stop(run_dir)
    _record(run_dir, Outcome("stopped every node and pulled what they wrote", stopped=True, pulled=True))
    assert not not_pulled_after_stop(run_dir)  # the last stop counts
