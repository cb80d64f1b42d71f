"""Fault: a rank hangs (the trainer's test hook `--fault-hang RANK:STEP`: that rank stops responding; its peer
waits in a collective). `up` names the nodes that stopped moving, with the last thing each logged, without being
asked; with --stall-timeout it then stops every node and pulls. One run on the SSH test bed, several checks."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed, TestHost
from tests.plain_lines import unstamped
from tests.testbed_fixtures import lent, run_ddpctl

HANG_FLOOR = 8  # seconds (DDPCTL_HANG_FLOOR): the default 60 s floor would only make the test slower
STALL_TIMEOUT = 30
STEPS_PER_EPOCH = 32  # 2048 samples / 2 ranks / 32 per batch


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


@pytest.fixture(scope="module")
def hung_run(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Rank 1 (node 1's only worker) hangs 8 steps into epoch 2, after epoch 1's snapshots were written."""
    runs = tmp_path_factory.mktemp("hang") / "runs"
    os.environ["DDPCTL_HANG_FLOOR"] = str(HANG_FLOOR)
    try:
        result = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--host", bed.hosts[1].spec, "--gpus", "1",
                            "--runs-dir", str(runs), "--epochs", "3", "--synthetic-train-size", "2048",
                            "--synthetic-test-size", "256", "--stall-timeout", str(STALL_TIMEOUT),
                            "--trainer-arg=--fault-hang", f"--trainer-arg=1:{STEPS_PER_EPOCH + 8}")  # fmt: skip
    finally:
        del os.environ["DDPCTL_HANG_FLOOR"]
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return result, run


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_up_names_every_node_that_stopped_moving(hung_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, run = hung_run
    told = [line for line in unstamped(result.stderr).splitlines()
            if line.startswith("node ") and "no training step" in line]
    assert [line.split(" (")[0] for line in told] == ["node 0", "node 1"], result.stderr
    for line in told:  # one line each: how long, and the last thing the node logged
        assert re.search(r"no training step for \d+ s \(.*\): it may be hung; last logged: \S", line), line
    hang = next(e for e in events(run) if e["event"] == "hang")
    assert set(hang["nodes"]) == {"0", "1"}
    # then, unasked too, where each rank is (every rank's stack, taken at once)
    (where,) = [line for line in unstamped(result.stderr).splitlines() if line.startswith("where each rank is: ")]
    assert re.search(r"rank 1 is elsewhere, at trainer\.py:\d+ in _run_epoch: `time\.sleep\(", where), where
    kinds = [e["event"] for e in events(run)]
    assert kinds.index("hang") < kinds.index("stacks") < kinds.index("stop_requested"), kinds
    # found within the detection window: its threshold (the floor, or 5 x the slowest interval between two
    # progress records: a few seconds here), plus a poll or two
    assert HANG_FLOOR <= hang["threshold"] < STALL_TIMEOUT, hang
    assert hang["threshold"] <= hang["seconds"] <= hang["threshold"] + 10, hang


def test_stall_timeout_still_stops_and_pulls(hung_run: tuple[subprocess.CompletedProcess[str], Path],
                                             bed: Testbed) -> None:
    result, run = hung_run
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --stall-timeout: no training step for {STALL_TIMEOUT} s"), result.stderr
    # before the stop, every rank's stack (the trainer registers its dumps): where each rank was, in one line
    assert re.search(r": rank 0 waits in (backward|all_reduce)\b.*\(trainer\.py:\d+ in _run_batch", last), last
    assert re.search(r"; rank 1 is elsewhere, at trainer\.py:\d+ in _run_epoch: `time\.sleep\(", last), last
    assert re.search(r"the ranks are not in the same collective; flight recorder: rank 0 entered all_reduce "
                     r"\(gloo\) #(\d+) \(trainer\.py:\d+\); rank 1 entered up to #\d+ and never #\1: collective "
                     r"#\1 waits for the ranks that never entered it \(stacks in ", last), last
    kinds = [e["event"] for e in events(run)]
    assert kinds.index("hang") < kinds.index("stop_requested") < kinds.index("pulled")
    # epoch 1's snapshot, written before the hang, came back byte for byte from both nodes
    for k, host in enumerate(bed.hosts):
        host_snap = Path(host.home, ".ddpctl", "runs", run.name, "out", "snapshots", "snapshot-epoch-000001.pt")
        pulled = run / "nodes" / str(k) / "out" / "snapshots" / "snapshot-epoch-000001.pt"
        assert hashlib.sha256(pulled.read_bytes()).hexdigest() == hashlib.sha256(host_snap.read_bytes()).hexdigest()
    for host in bed.hosts:
        assert _trainer_processes(host) == "", host.name


def _trainer_processes(host: TestHost) -> str:
    left = host.run_as_user(["pgrep", "-a", "-u", host.user, "-f", "torch.distributed.run|trainer"], check=False)
    out = left.stdout
    return (out.decode() if isinstance(out, bytes) else out).strip()


def test_a_local_run_names_its_hung_node_too(tmp_path: Path) -> None:
    """Locally (no --host) the same watch runs: the hang is named without being asked; Ctrl-C then stops it. One
    process (what is watched is the node's progress, which stops with its one rank), 32 steps per epoch too."""
    import signal
    import sys
    import time

    from tests.testbed_fixtures import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "DDPCTL_HANG_FLOOR": str(HANG_FLOOR), "PYTHONUNBUFFERED": "1"}
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "up", "--gpus", "1", "--runs-dir", str(runs),
                             "--epochs", "3", "--synthetic-train-size", "1024", "--synthetic-test-size", "256",
                             "--quiet", "--trainer-arg=--fault-hang", f"--trainer-arg=0:{STEPS_PER_EPOCH + 8}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    told: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not told:
            line = proc.stderr.readline()
            if not line:
                break
            if "no training step" in line and "it may be hung" in line:
                told.append(line)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert told, "the hang was never named"
    assert re.search(r"no training step for \d+ s \(.*\): it may be hung; last logged: \S", told[0]), told[0]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    hang = next(e for e in events(run) if e["event"] == "hang")
    assert hang["threshold"] >= HANG_FLOOR and hang["seconds"] <= hang["threshold"] + 10, hang
    assert proc.returncode == 130 and "stopped" in rest, rest
