"""launcher/execute/following/before_start.py without hosts: an interruption before torchrun starts is one line saying
that
nothing was started; a run directory `up` made is removed, a provider's is kept with the interruption recorded;
Vast's line after destroying its machines starts with that line. End to end: tests/faults/test_fault_matrix.py."""

from __future__ import annotations

import os
import signal
from typing import Any, cast

import pytest

from launcher.errors import HostsFailed, Interrupted
from launcher.execute.following.before_start import nothing_started_if_interrupted
from launcher.results.rundir import RunDir
from tests.interruption_fixtures import NOT_MAIN_THREAD  # and its run_dir fixture, through tests/conftest.py

pytestmark = NOT_MAIN_THREAD


def test_a_run_directory_up_made_is_removed_and_the_line_says_so(run_dir: RunDir) -> None:
    with pytest.raises(Interrupted) as caught, nothing_started_if_interrupted("shipping the code to the hosts",
                                                                              run_dir):
        os.kill(os.getpid(), signal.SIGTERM)
    assert str(caught.value) == ("interrupted by SIGTERM while shipping the code to the hosts: nothing was started on "
                                 "any host; no run directory kept (it held only the plan)")
    assert caught.value.exit_code == 130
    assert list(run_dir.path.parent.iterdir()) == []


def test_a_providers_run_directory_is_kept_with_the_interruption_recorded(run_dir: RunDir) -> None:
    from launcher.places.vast.provider import not_pulled_after_stop

    with pytest.raises(Interrupted) as caught, nothing_started_if_interrupted(
            "probing the hosts", run_dir, keep_run_dir=True, kept_because="it records the rented machines"):
        os.kill(os.getpid(), signal.SIGINT)
    assert str(caught.value) == (f"interrupted by Ctrl-C while probing the hosts: nothing was started on any host; "
                                 f"the run directory {run_dir.path} is kept (it records the rented machines)")
    events = run_dir.events()
    assert [e["event"] for e in events][-2:] == ["interrupted", "outcome"]
    assert events[-1]["text"] == str(caught.value) and events[-1]["started"] is False
    assert not not_pulled_after_stop(run_dir), "nothing ran, so nothing is left on the machines to pull"


def test_an_error_that_is_not_an_interruption_passes_unchanged(run_dir: RunDir) -> None:
    failed = HostsFailed("probe failed on 1 of 2 host(s):\n  h1: no python3", ())
    with pytest.raises(HostsFailed) as caught, nothing_started_if_interrupted("probing the hosts", run_dir):
        raise failed
    assert caught.value is failed
    assert run_dir.path.is_dir()


def test_vast_keeps_the_line_and_adds_what_it_destroyed(run_dir: RunDir) -> None:
    """After an interruption before start, Vast destroys what it rented: its line says nothing ran, not "what the
    nodes wrote is in ..." (the ledger here holds no instance: the API is not called)."""
    from launcher.execute.up import executor_calls
    from launcher.places.vast.ledger import Ledger
    from launcher.places.vast.provider import _after_failure

    with pytest.raises(Interrupted) as before, nothing_started_if_interrupted(
            "shipping the code to the hosts", run_dir, keep_run_dir=True, kept_because="it records rented machines"):
        os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(Interrupted) as caught:
        _after_failure(cast(Any, None), None, Ledger(run_dir), before.value, executor_calls())
    text = str(caught.value)
    assert text.startswith(str(before.value) + "; the rented machines were destroyed (verified)"), text
    assert "what the nodes wrote" not in text
