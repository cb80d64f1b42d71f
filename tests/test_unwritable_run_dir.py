"""The run directory stops being writable mid-run: that is a fault like others, never a traceback. The run goes on
(it is followed and ends as ever), and one warning says the records are no longer written and what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.results.rundir import EVENTS_FILE, RUN_FILE, RunDir
from launcher.spec.run_spec import RunSpec
from tests.testbed_fixtures import REPO


def test_an_event_that_cannot_be_written_is_told_once_and_the_run_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="ro"), {"provider": "local"})
    (run_dir.path / EVENTS_FILE).unlink(missing_ok=True)
    (run_dir.path / EVENTS_FILE).mkdir()  # any write to it fails, as on a read-only folder
    heard: list[str] = []
    from launcher.results import rundir

    rundir.add_event_listener(lambda record: heard.append(record["event"]))
    try:
        run_dir.event("started", node=0)
        run_dir.event("exited", node=0, exit_code=0)
    finally:
        rundir._event_listeners.clear()
    assert heard == ["started", "exited"]  # the display still hears them
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {run_dir.path / EVENTS_FILE} cannot be written (")
    assert err[0].endswith("the run goes on, but from now on what happens is not recorded in "
                           f"{run_dir.path}; make it writable again")


def test_run_json_that_cannot_be_written_is_told_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="ro2"), {"provider": "local"})
    from launcher.results import rundir

    def refuse(path: Path, data: object, *args: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(rundir, "write_json_atomic", refuse)
    run_dir.update_record(local_pid=1)
    assert "local_pid" not in json.loads((run_dir.path / RUN_FILE).read_text())
    assert capsys.readouterr().err.startswith(f"warning: {run_dir.path / RUN_FILE} cannot be written (Read-only "
                                              "file system): the run goes on")


SCRIPT = """import json, os, time
for step in range(1, 9):
    if os.environ["RANK"] == "0":
        print(json.dumps({"ddpctl": "progress", "epoch": 1, "epochs": 1, "step": step, "steps": 8}), flush=True)
    time.sleep(1)
"""


@pytest.mark.integration
def test_a_local_run_whose_run_directory_turns_read_only_ends_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(SCRIPT)
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    up = subprocess.Popen([sys.executable, "-m", "launcher", "up", "--gpus", "1", "--runs-dir", str(runs), "--quiet",
                           "--", "python3", "steps.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    mounted: Path | None = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(runs.glob("*/logs/*/attempt_0")):
            time.sleep(0.2)
        (run,) = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
        subprocess.run(["mount", "--bind", str(run), str(run)], check=True)
        mounted = run
        subprocess.run(["mount", "-o", "remount,ro,bind", str(run)], check=True)
        out, err = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)
    assert "Traceback" not in err, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ") and "cannot be written" in line]
    assert len(warnings) == 1 and "the run goes on" in warnings[0], err
    # the training ended well, but its summary could not be written: said in one line, exit 1
    assert up.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith("error: the run directory "), err
    assert "cannot be written (Read-only file system): what the run did after that is not recorded" in err
