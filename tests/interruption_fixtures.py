"""A run directory for tests that send real signals to this process: launcher/execute/following/interruption.py's
handlers
are installed around it (signal handlers can only be set in the main thread, so those modules skip elsewhere)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.execute.following import interruption
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec

NOT_MAIN_THREAD = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                     reason="signal handlers can only be set in the main thread")


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[RunDir]:
    """A fresh run directory, with SIGINT, SIGTERM and SIGHUP caught as `up` catches them."""
    previous = interruption.catch_stop_signals()
    try:
        yield RunDir.create(tmp_path / "runs", RunSpec(run_id="r1"), {})
    finally:
        interruption.restore_signals(previous)
