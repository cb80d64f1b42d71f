"""The autostop key's permission shape, proven at creation (launcher/places/vast/scoped_key.py) against a stand-in
whose scoped keys follow Vast's docs, each server behaviour a switch (infra/vast_scoped_keys.py): which rule shape
it reads, whether it refuses or silently drops a rule it does not understand, whether it enforces scopes at all.
And each node's watchdog state as `status` reads it (launcher/places/vast/watchdog_state.py)."""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from infra.vast_standin import VastStandIn
from launcher.errors import DdpctlError
from launcher.places.vast.client import VastClient
from launcher.places.vast.scoped_key import DOCUMENTED, METHOD_NESTED, make_stop_key, stop_only_permissions
from launcher.places.vast.watchdog_state import add_watchdog_states, parse_watchdog

KEY = "sk-scoped-5e6f7a8b9c0d"
IID = 5001


@pytest.fixture
def standin():
    with VastStandIn(api_key=KEY) as s:
        yield s
        assert s.validation_failures() == []


def _client(standin: VastStandIn) -> VastClient:
    return VastClient(KEY, base_url=standin.url, backoff_base=0.01, pace=0.0)


def _make(standin: VastStandIn) -> tuple[object, list[tuple[str, str, object]]]:
    rejected: list[tuple[str, str, object]] = []
    try:
        made: object = make_stop_key(_client(standin), "ddpctl-autostop-t", IID,
                                     on_rejected=lambda *a: rejected.append(a))
    except DdpctlError as exc:
        made = exc
    return made, rejected


@pytest.mark.parametrize(("server_shape", "unknown", "accepted", "first_failure"), [
    ("documented", "refuse", DOCUMENTED, None),
    ("method_nested", "refuse", METHOD_NESTED, "refused: Vast.ai POST /api/v0/auth/apikeys/: HTTP 400"),
    # the dangerous server: it takes the documented form, drops the rule it cannot read, and keeps a key holding
    # all of instance_write; the read-back sees it, deletes that key, and the method-nested form passes
    ("method_nested", "drop", METHOD_NESTED, 'the account stores other permissions than asked: {"api": '
                                             '{"instance_write": {}}}'),
])
def test_the_shape_the_server_understands_is_the_one_armed(standin, server_shape, unknown, accepted, first_failure):
    standin.lifecycle.key_store.switches.shape = server_shape
    standin.lifecycle.key_store.switches.unknown_shape = unknown
    made, rejected = _make(standin)
    assert not isinstance(made, DdpctlError), made
    assert made.shape == accepted  # type: ignore[attr-defined]
    [live] = standin.lifecycle.key_store.live()  # exactly one key left in the account: the proven one
    assert live.id == made.key_id and live.permissions == stop_only_permissions(IID, accepted)  # type: ignore[attr-defined]
    if first_failure is None:
        assert rejected == []
    else:
        [(shape, why, _stored)] = rejected
        assert shape == DOCUMENTED and why.startswith(first_failure)
    # the proof used only reads with the new key, and each was refused; nothing was changed with it
    probes = [r for r in standin.requests if r.get("scoped_key")]
    assert {(r["method"], r["path"]) for r in probes} == {("GET", "/api/v0/users/current/"),
                                                           ("GET", f"/api/v0/instances/{IID}/")}
    assert all(r["status"] == 403 for r in probes) and standin.lifecycle.manage_calls == []


@pytest.mark.parametrize(("switch", "value", "why"), [
    ("shape", "something_else", "the account stores other permissions than asked"),  # drops both forms
    ("enforce", False, "reading the account was not refused"),  # stores both, enforces neither
])
def test_no_shape_proven_means_no_key_left_and_one_line_saying_why(standin, switch, value, why):
    setattr(standin.lifecycle.key_store.switches, switch, value)
    standin.lifecycle.key_store.switches.unknown_shape = "drop"
    made, rejected = _make(standin)
    assert isinstance(made, DdpctlError)
    line = str(made)
    assert "\n" not in line and "documented shape" in line and "method-nested shape" in line and why in line
    assert [r[0] for r in rejected] == [DOCUMENTED, METHOD_NESTED]
    assert standin.lifecycle.key_store.live() == [] and len(standin.lifecycle.keys) == 2  # both made, both deleted


def test_a_key_refused_with_401_counts_as_refused(standin):
    standin.lifecycle.key_store.switches.refusal_status = 401  # Vast documents 401 or 403 for a scope refusal
    made, rejected = _make(standin)
    assert getattr(made, "shape", None) == DOCUMENTED and rejected == []


class _ThisMachine:
    """A one-node session whose node is this machine: commands run here, without CONTAINER_API_KEY."""

    def conn(self, _index: int) -> _ThisMachine:
        return self

    def run(self, argv: list[str], timeout: float) -> SimpleNamespace:
        env = {k: v for k, v in os.environ.items() if k != "CONTAINER_API_KEY"}
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        return SimpleNamespace(exit_code=out.returncode, stdout=out.stdout, stderr=out.stderr)


def test_arm_autostop_without_a_proven_key_says_autostop_is_off_in_one_line(standin, tmp_path, capsys):
    from launcher.places.vast.autostop import arm_autostop
    from launcher.places.vast.ledger import Ledger
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    standin.lifecycle.key_store.switches.shape = "something_else"  # refuses both forms
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="vast-key"), {
        "nodes": [{"workspace": "/ws"}], "instances": [{"instance_id": IID, "state": "rented", "node": 0}]})
    # the node is this machine, asked for its CONTAINER_API_KEY for real: it has none, so a scoped key is tried
    arm_autostop(_client(standin), session=_ThisMachine(), ledger=Ledger(run_dir), minutes=5)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autostop is off: no stop-only API key passed its proof")
    assert "bill in full until `ddpctl down`" in err
    assert standin.lifecycle.key_store.live() == []
    record = json.loads((run_dir.path / "run.json").read_text())
    assert record.get("autostop") is None and "autostop_key_id" not in record["instances"][0]
    events = [json.loads(line) for line in (run_dir.path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("shape")) for e in events if e["event"].startswith("vast.autostop")] == [
        ("vast.autostop_key_rejected", DOCUMENTED), ("vast.autostop_key_rejected", METHOD_NESTED),
        ("vast.autostop_failed", None)]


@pytest.mark.parametrize(("output", "label", "warned"), [
    ('{"state": "watching", "since": 1, "pid": 41}\nalive', "watching", False),
    ('{"state": "failed", "error": "HTTP 403", "pid": 41}\ndead', "failed (HTTP 403)", True),
    ('{"state": "watching", "since": 1, "pid": 41}\ndead', "not running (its process ended)", True),
    ('{"state": "stopped", "stopped_at": 2, "pid": 41}\ndead', "not running (it stopped the machine", True),
    ("", "not running (it never started)", True),
])
def test_status_shows_each_watchdog_and_warns_when_it_will_not_stop_its_machine(output, label, warned, capsys):
    rows = [{"node": 0, "state": "running"}, {"node": 1, "state": "running"}]
    add_watchdog_states(rows, {0: output}, "run-x")  # node 1 was not reached
    assert rows[0]["autostop"].startswith(label) and rows[1]["autostop"] == "unknown (node not reached)"
    err = capsys.readouterr().err
    if warned:
        assert err.count("\n") == 1 and err.startswith(f"node 0: autostop {label}")
        assert "bills in full until `ddpctl down run-x`" in err
    else:
        assert err == ""
    assert (parse_watchdog(output).problem is None) == (not warned)
