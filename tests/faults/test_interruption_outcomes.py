"""launcher/execute/following/interruption.py without hosts: what each further signal during a stop does, and the
outcome
line each ending gives (real signals sent to this process; the stop and pull are stand-ins that take them)."""

from __future__ import annotations

import os
import signal

import pytest

from launcher.execute.following import interruption
from launcher.results.rundir import RunDir
from tests.interruption_fixtures import NOT_MAIN_THREAD  # and its run_dir fixture, through tests/conftest.py

pytestmark = NOT_MAIN_THREAD


def ctrl_c(times: int = 1) -> None:
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGINT)


def outcome_events(run_dir: RunDir) -> list[dict[str, object]]:
    return [e for e in run_dir.events() if e["event"] == "outcome"]


def interrupt(run_dir: RunDir, stop: object = None, pull: object = None, **kwargs: object) -> interruption.Outcome:
    """Interrupt with Ctrl-C as `up` is, then stop and pull as run_remote_up does."""
    with pytest.raises(KeyboardInterrupt) as caught:
        ctrl_c()
    assert interruption.interrupted_by(caught.value)
    return interruption.stop_and_pull(run_dir, stop or (lambda: None), pull, **kwargs)  # type: ignore[arg-type]


def test_a_second_ctrl_c_during_the_stop_is_told_the_stop_goes_on(run_dir: RunDir,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    done = []
    outcome = interrupt(run_dir, lambda: (ctrl_c(), done.append("stop")), lambda: done.append("pull"))
    assert done == ["stop", "pull"]
    assert outcome.stopped and outcome.pulled
    assert outcome.text.startswith("interrupted by Ctrl-C: stopped every node and pulled what they wrote to ")
    err = capfd.readouterr().err
    assert "still stopping every node" in err and "again leaves the nodes running" in err
    assert outcome_events(run_dir)[-1]["text"] == outcome.text


def test_a_third_ctrl_c_abandons_the_stop_and_says_the_nodes_may_run_on(run_dir: RunDir) -> None:
    pulled = []
    outcome = interrupt(run_dir, lambda: ctrl_c(2), lambda: pulled.append(1))
    assert not outcome.stopped and not pulled
    assert "left running" in outcome.text and "ddpctl status r1" in outcome.text and "ddpctl down r1" in outcome.text
    assert "stop_abandoned" in [e["event"] for e in run_dir.events()]


def test_a_local_stop_is_never_abandoned(run_dir: RunDir, capfd: pytest.CaptureFixture[str]) -> None:
    outcome = interrupt(run_dir, lambda: ctrl_c(3), None, abandonable=False)
    assert outcome.stopped and "stopped torchrun and its workers" in outcome.text
    assert capfd.readouterr().err.count("it is not left running") == 3


def test_ctrl_c_during_the_pull_leaves_the_nodes_stopped_and_says_how_to_fetch(run_dir: RunDir) -> None:
    outcome = interrupt(run_dir, None, ctrl_c)
    assert outcome.stopped and not outcome.pulled
    assert "the pull was interrupted" in outcome.text and "ddpctl pull r1" in outcome.text


def test_a_node_the_stop_could_not_reach_is_named_as_left_running(run_dir: RunDir) -> None:
    outcome = interrupt(run_dir, lambda: run_dir.event("stopped", errors={"bob@10.0.0.2": "timed out"}), lambda: None)
    assert not outcome.stopped and outcome.left_running == ["bob@10.0.0.2 (timed out)"]
    assert outcome.text.startswith("interrupted by Ctrl-C: left running: could not stop bob@10.0.0.2")


def test_sigterm_and_sighup_are_interruptions_named_by_their_signal(run_dir: RunDir) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
        assert interruption.last_cause() == sig.name
    outcome = interruption.stop_and_pull(run_dir, lambda: None, lambda: None)
    assert outcome.text.startswith("interrupted by SIGHUP: stopped every node")


def test_a_signal_while_nodes_start_waits_for_the_start_then_stops(run_dir: RunDir) -> None:
    interruption.defer_signals()
    ctrl_c()  # nothing raised: the nodes being started are not abandoned half-way
    with pytest.raises(KeyboardInterrupt):
        interruption.act_on_deferred()
    with pytest.raises(KeyboardInterrupt):  # and signals raise again afterwards
        ctrl_c()


def test_a_deferral_nobody_ended_does_not_swallow_ctrl_c(run_dir: RunDir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interruption, "DEFER_LIMIT_SECONDS", 0.0)
    interruption.defer_signals()  # e.g. a detached run returned while signals were deferred
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()
