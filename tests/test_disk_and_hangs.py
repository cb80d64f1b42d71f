"""Issue 12: the disk estimate preflight refuses with, the hang rule `up` applies unasked, what it tells on each
poll, and a failing rank releasing its peers (two real torchrun agents with gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.execute.following.hang_watch import HangRule, RunWatch
from launcher.planning.facts import HostFacts
from launcher.planning.preflight import (
    LOG_ALLOWANCE,
    MODEL_ELEMENTS,
    check_requirements,
    planned_disk_bytes,
    snapshot_bytes,
)
from launcher.remote.node_report import failure_notes
from launcher.remote.proctree import stop_tree
from launcher.results.rundir import RunDir
from launcher.runtimes.native import NodeState
from launcher.spec.run_spec import RunSpec
from tests.trainer_support import REPO, free_port

# --- the estimate -----------------------------------------------------------------------------------------------


def test_model_sizes_match_the_trainers_models() -> None:
    """The launcher's table (it cannot import torch) holds what the trainer's models really save."""
    from trainer.models import build_model

    for name in ("mnist-cnn", "mnist-cnn-small"):
        state = build_model(name, (3, 32, 32)).state_dict()
        assert MODEL_ELEMENTS[name] == sum(t.numel() for t in state.values()), name


def test_estimate_grows_with_what_the_run_keeps() -> None:
    base = RunSpec(run_id="r", model="mnist-cnn", epochs=10, save_every=1)
    weights = MODEL_ELEMENTS["mnist-cnn"] * 4
    one = snapshot_bytes(base)
    assert one > weights  # weights plus framing and every rank's RNG state
    # SGD with momentum keeps one more copy of the weights in the optimizer state
    assert snapshot_bytes(RunSpec(run_id="r", trainer_args=("--momentum", "0.9"))) - one == weights
    # the default keeps 3 snapshots (and one more while it is written), plus final_model.pt and the logs
    assert planned_disk_bytes(base) == 4 * one + weights + LOG_ALLOWANCE
    keep_one = RunSpec(run_id="r", model="mnist-cnn", epochs=10, trainer_args=("--keep-snapshots=1",))
    assert planned_disk_bytes(keep_one) == 2 * one + weights + LOG_ALLOWANCE
    # two epochs saved every second epoch: one save, whatever the keep count
    rare = RunSpec(run_id="r", model="mnist-cnn", epochs=2, save_every=2)
    assert planned_disk_bytes(rare) == 2 * one + weights + LOG_ALLOWANCE
    big = RunSpec(run_id="r", model="resnet18", epochs=10)
    assert planned_disk_bytes(big) > 4 * 11_000_000 * 4
    # local-sgd keeps a set of snapshots per process
    sgd = RunSpec(run_id="r", model="mnist-cnn", epochs=10, strategy="local-sgd", nproc_per_node=2)
    assert planned_disk_bytes(sgd) - weights - LOG_ALLOWANCE == 2 * 4 * snapshot_bytes(sgd)
    # a user's own command: only the log allowance is known
    assert planned_disk_bytes(RunSpec(run_id="r", user_command=("python3", "x.py"))) == LOG_ALLOWANCE


def _facts(label: str, free: int) -> HostFacts:
    return HostFacts(label=label, python="3.11.7", executable="python3", cpus=4, home="/home/u", torch="2.13.0",
                     disk_free=free)


def test_preflight_refuses_a_host_without_room_in_one_line() -> None:
    spec = RunSpec(run_id="r", model="resnet18", epochs=4, nnodes=2)
    needed = planned_disk_bytes(spec)
    problems = check_requirements([_facts("a", needed + 1), _facts("b", needed - 1)], 2, True, spec=spec)
    assert [p.host for p in problems] == ["b"]
    line = str(problems[0])
    assert "\n" not in line
    assert f"{needed / (1 << 20):.1f} MiB" in line and f"{(needed - 1) / (1 << 20):.1f} MiB" in line
    assert "--keep-snapshots" in line and "~/.ddpctl/runs" in line


# --- the hang rule ------------------------------------------------------------------------------------------------


def _record(step: int, state: str = "training") -> dict[str, Any]:
    return {"epoch": 1, "epochs": 2, "step": step, "steps_per_epoch": 100, "samples_per_s": 10.0, "state": state}


def test_hang_rule_waits_longer_before_the_first_step() -> None:
    rule = HangRule(floor=60, first_step=300, factor=5)
    rule.observe(0, None, now=0.0)
    assert not rule.hung(299.0)
    assert rule.hung(301.0)


def test_hang_rule_scales_with_the_runs_slowest_interval() -> None:
    rule = HangRule(floor=60, first_step=300, factor=5)
    now = 0.0
    for step in range(1, 6):  # a record change every second
        now += 1.0
        rule.observe(0, _record(step), now)
    assert rule.threshold() == 60  # the floor: 5 x 1 s is less
    assert not rule.hung(now + 59) and rule.hung(now + 61)
    now += 40.0  # a 40 s validation between two records
    rule.observe(0, _record(6, "validating"), now)
    assert rule.threshold() == 200
    assert not rule.hung(now + 199) and rule.hung(now + 201)
    rule.observe(1, _record(6, "validating"), now + 100)  # the same record seen on another node is a change too
    assert not rule.hung(now + 250)
    rule.observe(0, _record(100, "done"), now + 101)
    assert not rule.hung(now + 10_000)  # a finished run is not hung


def test_hang_floor_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_HANG_FLOOR", "10")
    rule = HangRule.from_env()
    assert (rule.floor, rule.first_step) == (10.0, 300.0)
    monkeypatch.setenv("DDPCTL_HANG_FLOOR", "nan")
    assert HangRule.from_env().floor == 60.0


# --- what the watch tells -------------------------------------------------------------------------------------------


def _state(progress: dict[str, Any] | None = None, free: int | None = None, exit_code: int | None = None,
           report: dict[str, Any] | None = None) -> NodeState:  # fmt: skip
    report = report or {}
    return NodeState(pid=1, exit_code=exit_code, alive=exit_code is None, progress=progress, disk_free=free,
                     failures=tuple(report.get("failures", ())), last_logged=report.get("last_logged", ""))


def test_watch_names_hung_nodes_low_disk_and_the_first_failure(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """What the watch tells comes with the poll's states (the notes and last lines the node program read)."""
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="w", nnodes=2), {"nodes": []})
    reports = {
        0: {"last_logged": "logs/x/attempt_0/0/stderr.log: waiting", "failures": [
            {"time": 19.5, "text": "rank 0: RuntimeError: Connection closed by peer"}]},  # seen first: a consequence
        1: {"last_logged": "torchrun.out: step 7", "failures": [
            {"time": 20.0, "text": "rank 1: OSError: [Errno 28] No space left on device"}]},
    }  # fmt: skip
    watch = RunWatch(["a", "b"], run_dir, low_disk_floor=1000, rule=HangRule(floor=10, first_step=50))
    r0, r1 = reports[0], reports[1]
    watch.poll([_state(_record(1), free=5000, report=r0), _state(None, free=5000, report=r1)], now=0.0)
    watch.poll([_state(_record(2), free=5000, report=r0), _state(None, free=999, report=r1)], now=1.0)
    watch.poll([_state(_record(2), free=5000, report=r0), _state(None, free=10, report=r1)], now=5.0)  # told once
    watch.poll([_state(_record(2), report=r0), _state(None, report=r1)], now=12.0)  # no step for 11 s > the 10 s floor
    watch.poll([_state(_record(2), report=r0), _state(None, report=r1)], now=13.0)  # the same stall: not told again
    watch.poll([_state(_record(2), report=r0), _state(None, exit_code=1, report=r1)], now=14.0)
    watch.poll([_state(_record(2), report=r0), _state(None, exit_code=1, report=r1)], now=15.0)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len([ln for ln in lines if "free in its run directory" in ln]) == 1
    assert any(ln.startswith("node 1 (b): only 0.0 MiB free") for ln in lines)
    hang = [ln for ln in lines if "no training step for" in ln]
    assert len(hang) == 2 and hang[0].startswith("node 0 (a): no training step for 11 s")
    assert hang[1].endswith("last logged: torchrun.out: step 7")
    failure = [ln for ln in lines if "Errno" in ln or "Connection closed" in ln]
    assert failure == ["node 1 (b): rank 1: OSError: [Errno 28] No space left on device"]  # the cause
    kinds = [e["event"] for e in run_dir.events()]
    assert kinds.count("low_disk") == 1 and kinds.count("hang") == 1 and kinds.count("rank_failed") == 1
    assert next(e for e in run_dir.events() if e["event"] == "hang")["nodes"]["1"] == "torchrun.out: step 7"


# --- a failing rank releases its peers --------------------------------------------------------------------------


def _agent(node: int, port: int, out: Path, snapshot_dir: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"abort{port}",
            "--rdzv-conf", f"is_host={1 if node == 0 else 0}", "--nproc-per-node", "1", "--max-restarts", "0",
            "-m", "trainer", "--epochs", "3", "--synthetic-train-size", "512", "--synthetic-test-size", "128",
            "--out-dir", str(out), "--snapshot-dir", str(snapshot_dir)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def test_a_rank_whose_snapshot_write_fails_makes_every_rank_leave(tmp_path: Path) -> None:
    """Node 1's snapshot folder lies under a regular file, so its first snapshot write fails while node 0 goes
    on into the next epoch's collectives. Before: the failing rank's teardown waited in a barrier and both nodes
    hung until gloo's 30-minute timeout. Now both agents end within seconds of the failure."""
    (tmp_path / "not-a-folder").write_text("x")
    port = free_port()
    agents = [_agent(0, port, tmp_path / "out0", tmp_path / "snaps0"),
              _agent(1, port, tmp_path / "out1", tmp_path / "not-a-folder" / "snaps")]  # fmt: skip
    outputs = []
    try:
        for agent in agents:
            outputs.append(agent.communicate(timeout=150)[0])
    finally:
        for agent in agents:
            if agent.poll() is None:
                stop_tree(agent.pid, 0)
                agent.wait()
    ended = time.time()
    assert [a.returncode for a in agents] == [1, 1], outputs
    notes = failure_notes(str(tmp_path / "out1")) + failure_notes(str(tmp_path / "out0"))
    first = min(notes, key=lambda n: float(n["time"]))  # type: ignore[arg-type]
    assert "not-a-folder" in str(first["text"]) and "Error" in str(first["text"]), notes
    # the peer was released at once (its own note: the connection closed), and both agents ended within seconds
    # (seen: 0.14 s and 7 s on a loaded machine), not after gloo's 30-minute timeout
    failed_at = float(first["time"])
    assert len(notes) == 2 and float(notes[-1]["time"]) - failed_at < 30  # type: ignore[arg-type]
    assert ended - failed_at < 60
    assert "error: " in outputs[1]
    # nothing half-written: the node that wrote kept complete, checksummed snapshots only
    from trainer.snapshot import read_snapshot

    for path in (tmp_path / "snaps0").glob("*"):
        assert not path.name.startswith("."), path
        assert read_snapshot(path)["epochs_done"] >= 1


def test_failure_note_is_reserved_ahead_and_read_back(tmp_path: Path) -> None:
    from trainer import failure

    failure.reserve(tmp_path, 3)
    path = failure.note_path(tmp_path, 3)
    assert path.stat().st_size == failure.RESERVED_BYTES  # the space is taken at the start
    assert failure_notes(str(tmp_path.parent / tmp_path.name)) == []  # an empty note is no failure
    assert failure.leave(OSError(28, "No space left on device")) == 1  # no process group: returns the code
    notes = failure_notes(str(tmp_path))
    assert [n["text"] for n in notes] == ["rank 3: OSError: [Errno 28] No space left on device"]
    assert json.dumps(notes)  # what the host script prints
    failure.discard()
    assert not path.exists()
