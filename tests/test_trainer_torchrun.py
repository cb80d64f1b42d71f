"""The trainer under a real torchrun (2 processes, gloo, CPU; 1 where no second rank is read): a whole run, a
killed rank that torchrun restarts from the snapshot (bitwise the same final weights), and a snapshot destroyed
mid-write."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.trainer_support import (
    SMALL_RUN,
    assert_same_weights,
    describe,
    finish_command,
    free_port,
    load_weights,
    read_json,
    read_timing,
    run_torchrun,
    run_trainer,
    start_command,
)
from trainer.snapshot import list_snapshots, read_snapshot, snapshot_path

TRAIN_SIZE, WORLD, BATCH = 4095, 2, 32
PER_RANK = math.ceil(TRAIN_SIZE / WORLD)  # DistributedSampler pads 4095 to 2 x 2048
STEPS = math.ceil(PER_RANK / BATCH)  # 64 steps per epoch per process


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-process run of SMALL_RUN; its final weights are the reference for resumed runs."""
    out = tmp_path_factory.mktemp("clean")
    result = run_torchrun([*SMALL_RUN, "--out-dir", str(out)])
    assert result.returncode == 0, describe(result)
    return out


def test_two_process_run_writes_consistent_outputs(clean_run: Path) -> None:
    timing = read_timing(clean_run)
    summary = read_json(clean_run / "summary.json")
    progress = read_json(clean_run / "progress.json")

    assert [r["epoch"] for r in timing] == [1, 2] and all(r["epochs"] == 2 for r in timing)
    assert timing[0]["time"] <= timing[1]["time"]
    for record in timing:
        assert set(record) >= {"epoch", "seconds", "samples", "samples_per_s", "train_loss", "train_acc",
                               "val_loss", "val_acc", "world_size", "restart_count", "time"}
        assert 0 < time.time() - record["time"] < 3600  # a Unix timestamp of when the epoch ended
        assert record["world_size"] == WORLD and record["restart_count"] == 0
        assert record["samples"] == PER_RANK * WORLD == 4096  # padding counted, as DistributedSampler pads
        assert record["steps"] == STEPS
        assert record["samples_per_s"] == pytest.approx(record["samples"] / record["seconds"])
        assert record["seconds"] > 0 and record["val_seconds"] > 0
        assert 0 <= record["train_acc"] <= 1 and 0 <= record["val_acc"] <= 1
    # Learnable but not trivial: not solved after one epoch, clearly above chance (10%) after two.
    assert timing[0]["train_acc"] < 0.95
    assert timing[-1]["val_acc"] > 0.3 and timing[-1]["val_loss"] < timing[0]["val_loss"]

    assert summary["epochs"] == 2 and summary["world_size"] == WORLD and summary["nnodes"] == 1
    assert summary["restarts"] == 0
    assert summary["final_val_acc"] == timing[-1]["val_acc"]
    assert summary["final_train_loss"] == timing[-1]["train_loss"]
    assert summary["train_seconds"] == pytest.approx(sum(r["seconds"] for r in timing))
    assert summary["samples_per_s"] == pytest.approx(sum(r["samples"] for r in timing) / summary["train_seconds"])
    assert summary["wall_seconds"] >= summary["train_seconds"]
    assert (summary["model"], summary["dataset"], summary["batch_size"], summary["lr"], summary["seed"]) == (
        "mnist-cnn", "synthetic", BATCH, 0.05, 3,
    )  # fmt: skip
    assert summary["versions"]["torch"] and summary["versions"]["python"]
    assert len(summary["devices"]) == WORLD and all(d.startswith("cpu") for d in summary["devices"])

    assert progress["state"] == "done" and progress["epoch"] == 2 and progress["steps_per_epoch"] == STEPS
    assert [e for e, _ in list_snapshots(clean_run / "snapshots")] == [2, 1]
    final = load_weights(clean_run / "final_model.pt")
    assert_same_weights(final, read_snapshot(snapshot_path(clean_run / "snapshots", 2))["model"])


def test_synthetic_data_is_learnable_but_not_solved_in_one_epoch(tmp_path: Path) -> None:
    """At the default size and the highest preset lr (0.1), a world of one: after one epoch validation accuracy
    is far above chance and still below 99%, so accuracy differences between world sizes stay visible."""
    result = run_trainer(["--epochs", "1", "--lr", "0.1", "--seed", "0", "--out-dir", str(tmp_path)])
    assert result.returncode == 0, describe(result)
    (record,) = read_timing(tmp_path)
    assert record["samples"] == 16384
    assert 0.5 < record["val_acc"] < 0.99, record


def test_killed_rank_restarts_from_snapshot_with_identical_weights(clean_run: Path, tmp_path: Path) -> None:
    kill_step = STEPS + STEPS // 2  # the middle of epoch 2: epoch 1's snapshot exists, epoch 2 is lost
    result = run_torchrun([*SMALL_RUN, "--out-dir", str(tmp_path), "--fault-kill", f"1:{kill_step}"], max_restarts=1)
    assert result.returncode == 0, describe(result)
    assert "resuming after epoch 1" in result.stderr, describe(result)

    summary = read_json(tmp_path / "summary.json")
    timing = read_timing(tmp_path)
    assert summary["restarts"] == 1 and summary["epochs"] == 2
    assert [(r["epoch"], r["restart_count"]) for r in timing] == [(1, 0), (2, 1)]
    # wall time runs from the first attempt's start, carried through the snapshot.
    assert summary["wall_seconds"] > summary["train_seconds"]
    assert_same_weights(load_weights(tmp_path / "final_model.pt"), load_weights(clean_run / "final_model.pt"))
    assert timing[1]["val_acc"] == read_timing(clean_run)[1]["val_acc"]


def test_two_agents_sharing_torchruns_store_recover_from_a_killed_rank(tmp_path: Path) -> None:
    """Two torchrun nodes that keep torchrun's own shared store across restarts (a bare torchrun; the launcher
    turns that off). After rank 1 is killed, node 1's agent counts a restart; node 0's may only re-join and count
    none. The restarted ranks must still meet, and not wait for each other forever."""
    port = free_port()
    procs = []
    for node in (0, 1):
        out = tmp_path / f"node{node}"
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "shared-store",
            "--rdzv-conf", f"is_host={1 - node}", "--local-addr", "127.0.0.1", "--max-restarts", "1",
            "-m", "trainer", *SMALL_RUN, "--epochs", "1", "--out-dir", str(out), "--fault-kill", "1:20",
        ]  # fmt: skip
        procs.append(start_command(argv, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": None}))
    results = [finish_command(proc, timeout=240) for proc in procs]
    for result in results:
        assert result.returncode == 0, describe(result)
    summaries = [read_json(path) for path in tmp_path.glob("node*/summary.json")]  # rank 0's node writes it
    assert len(summaries) == 1 and summaries[0]["epochs"] == 1
    assert summaries[0]["restarts"] == 1, "the run's count: the most any node restarted"


def run_two_nodes(out_dirs: list[Path], args: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Two torchrun nodes of one process each on this machine, each with its own out dir (its own disk)."""
    port = free_port()
    procs = []
    for node, out in enumerate(out_dirs):
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
            "--rdzv-conf", f"is_host={1 - node}", "--local-addr", "127.0.0.1",
            "-m", "trainer", *args, "--out-dir", str(out),
        ]  # fmt: skip
        procs.append(start_command(argv, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}))
    return [finish_command(proc, timeout=240) for proc in procs]


def test_nodes_agree_on_a_snapshot_valid_on_both_when_one_nodes_copies_differ(tmp_path: Path) -> None:
    """Node 0 lost its newest snapshot (epoch 3) and node 1's epoch-2 copy is corrupt: the only epoch valid on
    both is 1, and the run resumes there and ends with the weights of the uninterrupted run."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    args = [*SMALL_RUN, "--epochs", "3", "--synthetic-train-size", "1024"]
    for result in run_two_nodes(nodes, args):
        assert result.returncode == 0, describe(result)
    (final,) = [p for p in tmp_path.glob("node*/final_model.pt")]  # rank 0's node writes it
    reference = load_weights(final)
    final.unlink()
    snapshot_path(nodes[0] / "snapshots", 3).unlink()
    corrupt = snapshot_path(nodes[1] / "snapshots", 2)
    corrupt.write_bytes(corrupt.read_bytes()[:-100])

    results = run_two_nodes(nodes, args)
    for result in results:
        assert result.returncode == 0, describe(result)
    stderr = results[0].stderr + results[1].stderr
    assert str(corrupt) in stderr and "resuming after epoch 1" in stderr, stderr
    (final,) = [p for p in tmp_path.glob("node*/final_model.pt")]
    assert_same_weights(load_weights(final), reference)


def test_kill_without_restarts_fails_the_run(tmp_path: Path) -> None:
    """One process: what is read is the run's failure and the records left. A run of two whose rank 1 fails
    while rank 0 goes on: tests/test_local_up.py's test_a_failed_run_shows_the_failing_workers_own_log."""
    result = run_torchrun([*SMALL_RUN, "--epochs", "1", "--out-dir", str(tmp_path), "--fault-kill", "0:5"], nproc=1)
    assert result.returncode != 0
    assert not (tmp_path / "summary.json").exists()


def test_snapshot_destroyed_mid_write_falls_back_to_previous(tmp_path: Path) -> None:
    """A world of one without torchrun: the newest snapshot is truncated and a temp file is left over, as a
    kill during the write would leave them; the run names the bad file, resumes after epoch 1 and ends with
    the same weights as before."""
    args = [*SMALL_RUN, "--synthetic-train-size", "1024", "--out-dir", str(tmp_path)]
    first = run_trainer(args)
    assert first.returncode == 0, describe(first)
    reference = load_weights(tmp_path / "final_model.pt")
    snapshots = tmp_path / "snapshots"
    newest = snapshot_path(snapshots, 2)
    newest.write_bytes(newest.read_bytes()[:5000])
    (snapshots / ".snapshot-epoch-000002.pt.tmp-k1ll3d").write_bytes(b"\x00" * 100)
    (tmp_path / "final_model.pt").unlink()

    second = run_trainer(args)
    assert second.returncode == 0, describe(second)
    warnings = [line for line in second.stderr.splitlines() if "warning" in line]
    assert any(str(newest) in line and "sha256" in line for line in warnings), describe(second)
    assert any("resuming after epoch 1" in line for line in warnings), describe(second)
    assert [r["epoch"] for r in read_timing(tmp_path)] == [1, 2]
    assert_same_weights(load_weights(tmp_path / "final_model.pt"), reference)
    assert read_snapshot(newest)["epochs_done"] == 2  # rewritten whole


def test_sigterm_ends_the_trainer_through_its_clean_up(tmp_path: Path) -> None:
    """torchrun stops workers with SIGTERM: the trainer leaves through SystemExit (status 143), so a snapshot
    being written is removed rather than left as a temporary file."""
    args = [*SMALL_RUN, "--epochs", "50", "--synthetic-train-size", "512", "--out-dir", str(tmp_path)]
    proc = start_command([sys.executable, "-m", "trainer", *args])
    deadline = time.monotonic() + 120
    while not list_snapshots(tmp_path / "snapshots") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert list_snapshots(tmp_path / "snapshots"), "no snapshot written in time"
    proc.send_signal(signal.SIGTERM)
    result = finish_command(proc, timeout=60)
    assert result.returncode == 143, describe(result)
    assert [p.name for p in (tmp_path / "snapshots").iterdir() if not p.name.startswith("snapshot-")] == []


def test_snapshots_of_another_run_are_refused(tmp_path: Path) -> None:
    args = [*SMALL_RUN, "--epochs", "1", "--synthetic-train-size", "256", "--out-dir", str(tmp_path)]
    assert run_trainer(args).returncode == 0
    other = run_trainer([*args, "--lr", "0.1"])
    assert other.returncode == 2
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "belongs to another run" in lines[0], describe(other)


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for nccl on a machine without CUDA")
def test_nccl_without_gpu_is_one_line_error(tmp_path: Path) -> None:
    result = run_trainer([*SMALL_RUN, "--backend", "nccl", "--out-dir", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --backend nccl needs CUDA GPUs and none is available; use --backend gloo or auto"
    ], describe(result)
