"""A node whose supervisor ended from outside (no exit status recorded) is noted by the stop that finds it gone
(launcher/remote/node_stop.py), read by the node's report (launcher/remote/attribution.py) and named as the cause
(launcher/execute/failures/cause.py), not the SIGTERM of ddpctl's own stop. Run here against a temporary folder
standing in for the node's workspace; the real kill is tests/faults/test_supervisor_killed.py."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.execute.failures.cause import attribute
from launcher.remote import attribution, node_stop

NO_SUCH_PID = 4_194_000  # above any pid this machine hands out (pid_max is at most 4194304)


def workspace(tmp_path: Path, exit_code: str | None = None) -> Path:
    path = tmp_path / "ws"
    (path / "out").mkdir(parents=True)
    (path / "pid").write_text(f"{NO_SUCH_PID}\n")
    (path / "pid_start").write_text("12345\n")
    (path / "torchrun.out").write_text("")
    if exit_code is not None:
        (path / "exit_code").write_text(exit_code + "\n")
    return path


def test_a_supervisor_gone_with_nothing_left_running_is_not_noted(tmp_path: Path) -> None:
    """Gone, and nothing of the node runs: nothing to tell apart from a node that ended unrecorded (the stop's 143
    stands, as before); the note is for a torchrun left running without its supervisor."""
    path = workspace(tmp_path)
    node_stop.stop(str(path), "1", "1")
    assert not (path / node_stop.SUPERVISOR_GONE).exists()
    assert (path / "exit_code").read_text() == "143\n"


def test_a_noted_supervisor_is_named_as_the_cause(tmp_path: Path) -> None:
    """The note as a stop writes it (tests/faults/test_supervisor_killed.py makes a real one), read by the node's
    report and named as the cause, not the SIGTERM that stop sent."""
    path = workspace(tmp_path, exit_code="143")
    (path / node_stop.SUPERVISOR_GONE).write_text(json.dumps({"time": 1000.0, "left_running": 2}))
    report = attribution.node_report(str(path))
    assert report["supervisor_gone"] == {"time": 1000.0, "left_running": 2}
    record = attribute([{"exit_code": 0, "failures": []}, report], ["a@h0", "b@h1"], stopped=[1], stop_time=999.0)
    assert record is not None and record["node"] == 1
    assert record["summary"] == ("the supervisor of node 1 (b@h1), ddpctl's process that runs torchrun there and "
                                 "records how it ends, was ended from outside (killed?) before torchrun ended; "
                                 "torchrun and its workers, left running without it, were stopped by ddpctl "
                                 "(2 process(es))")


def test_a_node_that_recorded_its_exit_is_not_noted(tmp_path: Path) -> None:
    path = workspace(tmp_path, exit_code="0")
    node_stop.stop(str(path), "1", "1")
    assert not (path / node_stop.SUPERVISOR_GONE).exists()
    assert "supervisor_gone" not in attribution.node_report(str(path))
