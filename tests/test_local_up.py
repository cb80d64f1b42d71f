"""`ddpctl up` on this machine, end to end: real torchrun, two gloo processes, the synthetic data set."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SMALL = ["--synthetic-train-size", "2048", "--synthetic-test-size", "512"]


def ddpctl(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        # The killed launcher cannot stop torchrun (a session of its own): end what runs in this test's runs dir.
        if "--runs-dir" in args:
            subprocess.run(["pkill", "-KILL", "-f", args[args.index("--runs-dir") + 1]], check=False)
        raise


def only_run(runs: Path) -> Path:
    entries = [p for p in runs.iterdir()]
    assert len(entries) == 1, entries
    return entries[0]


def test_two_process_run_end_to_end(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = ddpctl("up", "--gpus", "2", "--epochs", "3", "--lr", "0.05", "--name", "e2e", "--runs-dir", str(runs),
                    "--json", *SMALL)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run = Path(out["run_dir"])
    assert run.parent == runs.resolve() and run.name.startswith("e2e-")
    for name in ("run.json", "events.jsonl", "timing.jsonl", "summary.json"):
        assert (run / name).is_file(), name
    assert any((run / "logs").rglob("*.log")), "each rank's output is kept under logs/"
    assert any((run / "snapshots").iterdir())
    record = json.loads((run / "run.json").read_text())
    assert record["spec"]["nproc_per_node"] == 2 and len(record["code_hash"]) == 16
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[0] == "started" and events[-1] == "exited"

    summary = json.loads((run / "summary.json").read_text())
    assert summary == out["summary"]
    timing = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    assert [t["epoch"] for t in timing] == [1, 2, 3]
    assert summary["world_size"] == 2 and all(t["world_size"] == 2 for t in timing)
    assert summary["epochs"] == 3
    assert summary["train_seconds"] == pytest.approx(sum(t["seconds"] for t in timing), rel=1e-6)
    assert summary["samples_per_s"] == pytest.approx(
        sum(t["samples"] for t in timing) / sum(t["seconds"] for t in timing), rel=1e-6)
    for t in timing:
        assert t["samples_per_s"] == pytest.approx(t["samples"] / t["seconds"], rel=1e-6)
        assert t["samples"] == 2048
    assert summary["final_val_acc"] == timing[-1]["val_acc"]
    assert summary["final_val_acc"] > 0.2, "above chance (10 classes)"


def test_user_script_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "my train.py"
    script.write_text(
        "import os, sys\n"
        "rank = os.environ['RANK']\n"
        "open(f'rank{rank}.txt', 'w').write(os.environ['WORLD_SIZE'] + ' ' + ' '.join(sys.argv[1:]))\n"
    )
    result = ddpctl("up", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(script),
                    "--flag", "a b", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "2 --flag a b"


@pytest.mark.parametrize("args, message", [
    (["--model", "vgg"], "unknown model 'vgg'"),
    (["--dataset", "imagenet"], "unknown data set 'imagenet'"),
    (["--epochs", "0"], "--epochs must be an integer >= 1"),
    (["--batch-size", "0"], "--batch-size must be an integer >= 1"),
    (["--gpus", "0"], "--gpus must be an integer >= 1"),
    (["--name", "a/b"], "is not a valid name"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent"], "data set mnist not found"),
    (["--epochs", "many"], "Invalid value for '--epochs'"),
    (["--stall-timeout", "-1"], "--stall-timeout -1: give seconds >= 0"),
    (["--host", "h", "--detach", "--stall-timeout", "60"], "--stall-timeout acts while `up` follows the run"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    runs = tmp_path / "runs"
    result = ddpctl("up", "--runs-dir", str(runs), *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_unwritable_runs_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = ddpctl("up", "--runs-dir", str(blocker / "runs"), *SMALL)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "cannot write the run directory" in result.stderr


def test_ctrl_c_stops_workers_and_leaves_a_consistent_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "up", "--epochs", "50", "--runs-dir", str(runs),
                             "--synthetic-train-size", "4096", "--synthetic-test-size", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # An epoch's timing record is written before its snapshot: wait for the snapshot itself.
            if list(runs.glob("*/snapshots/*.pt")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("training never finished an epoch")
        run = only_run(runs)
        pid = json.loads((run / "run.json").read_text())["local_pid"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "stopped by Ctrl-C" in err
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # torchrun and its workers are gone
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "interrupted" in events and events[-1] == "stopped"
    snapshots = sorted((run / "snapshots").glob("*.pt"))
    assert snapshots, "finished epochs keep their snapshots"
    assert not list((run / "snapshots").glob("*.tmp*")), "no half-written snapshot"


def test_killed_worker_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = ddpctl("up", "--epochs", "3", "--max-restarts", "1", "--runs-dir", str(runs), "--json", *SMALL,
                    "--trainer-arg=--fault-kill", "--trainer-arg=1:50")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["restarts"] == 1 and summary["epochs"] == 3
    timing = [json.loads(line) for line in (only_run(runs) / "timing.jsonl").read_text().splitlines()]
    assert [t["epoch"] for t in timing] == [1, 2, 3], "no epoch rerun after the restart"


def test_stop_tree_reaches_workers_in_sessions_of_their_own() -> None:
    """What a stuck torchrun leaves when only its process group is killed: workers in sessions of their own.
    The local runner's last resort (and the tests' clean-up) kills the whole tree."""
    from launcher.proctree import process_tree, stop_tree

    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              "start_new_session=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not process_tree(parent.pid)[1:] and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = process_tree(parent.pid)[1:]
        stop_tree(parent.pid, 0)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the worker in its own session outlived stop_tree"
    finally:
        if parent.poll() is None:
            parent.kill()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
