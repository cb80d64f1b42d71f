"""Every strategy as a user runs it (CPU, one node, synthetic data, real torchrun/gloo where it runs under
torchrun): the run records, the equalities that show each strategy computes what it claims, snapshot and resume
(kill and restart), and the refusals before anything starts."""

from __future__ import annotations

import math
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.trainer_support import (
    assert_same_weights,
    describe,
    load_weights,
    read_json,
    read_timing,
    run_torchrun,
    run_trainer,
)
from trainer.snapshot import list_snapshots

TRAIN, TEST, BATCH = 2048, 256, 32
RUN = ["--epochs", "2", "--synthetic-train-size", str(TRAIN), "--synthetic-test-size", str(TEST),
       "--lr", "0.05", "--seed", "3", "--batch-size", str(BATCH)]  # fmt: skip
STEPS_2 = math.ceil(TRAIN / 2 / BATCH)  # 32 steps per epoch per process with 2 processes
KILL_IN_EPOCH_2 = f"1:{STEPS_2 + 8}"  # rank 1 (worker 1) kills itself 8 steps into epoch 2

# name -> (how it runs, its strategy arguments, processes)
RUNS: dict[str, tuple[str, list[str], int]] = {
    "ddp": ("torchrun", ["--strategy", "ddp"], 2),
    "ddp-alone": ("alone", [], 1),
    "spawn": ("alone", ["--strategy", "spawn", "--processes", "2"], 2),
    "dp": ("alone", ["--strategy", "dp", "--devices", "cpu"], 1),
    "mp": ("alone", ["--strategy", "mp", "--devices", "cpu,cpu"], 1),
    "ddp-mp": ("torchrun", ["--strategy", "ddp-mp", "--devices", "cpu,cpu"], 2),
    "local-sgd": ("torchrun", ["--strategy", "local-sgd", "--average-every", "1"], 2),
    "local-sgd-end": ("torchrun", ["--strategy", "local-sgd", "--average-every", "end"], 2),
    "hogwild": ("alone", ["--strategy", "hogwild", "--processes", "2"], 2),
}


def _launch(how: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return run_torchrun(args) if how == "torchrun" else run_trainer(args)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The out-dir of RUNS[name], run once per module on first use."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            how, args, _ = RUNS[name]
            out = tmp_path_factory.mktemp(name)
            result = _launch(how, [*RUN, *args, "--out-dir", str(out)])
            assert result.returncode == 0, describe(result)
            done[name] = out
        return done[name]

    return get


@pytest.mark.parametrize("name", ["spawn", "dp", "mp", "ddp-mp", "local-sgd", "local-sgd-end", "hogwild"])
def test_each_strategy_trains_and_writes_the_run_records(finished: Callable[[str], Path], name: str) -> None:
    out = finished(name)
    _, _, processes = RUNS[name]
    timing, summary = read_timing(out), read_json(out / "summary.json")
    assert [r["epoch"] for r in timing] == [1, 2]
    for record in timing:
        assert record["world_size"] == processes and record["steps"] == math.ceil(TRAIN / processes / BATCH)
        assert record["samples"] == TRAIN and record["seconds"] > 0 and 0 <= record["val_acc"] <= 1
    assert timing[-1]["val_acc"] > 0.3  # it learned: ten classes, chance is 0.1
    strategy = name.removesuffix("-end")
    assert summary["strategy"] == strategy and summary["epochs"] == 2 and summary["world_size"] == processes
    assert summary["threads_per_process"] == 1 and summary["processes_per_node"] == processes  # OMP_NUM_THREADS=1
    assert len(summary["load_start"]) == 3 and len(summary["load_end"]) == 3
    assert summary["final_val_acc"] == timing[-1]["val_acc"]
    assert read_json(out / "progress.json")["state"] == "done"
    reference = load_weights(finished("ddp-alone") / "final_model.pt")
    assert load_weights(out / "final_model.pt").keys() == reference.keys()  # comparable weight for weight
    snapshot_dirs = sorted((out / "snapshots").glob("rank-*")) if strategy == "local-sgd" else [out / "snapshots"]
    assert len(snapshot_dirs) == (2 if strategy == "local-sgd" else 1)
    assert all([e for e, _ in list_snapshots(d)] == [2, 1] for d in snapshot_dirs)


# --- each strategy computes what it claims -------------------------------------------------------------


def test_spawn_ends_with_the_weights_of_ddp_under_torchrun(finished: Callable[[str], Path]) -> None:
    assert_same_weights(load_weights(finished("spawn") / "final_model.pt"),
                        load_weights(finished("ddp") / "final_model.pt"))  # fmt: skip


@pytest.mark.parametrize(("split", "unsplit"), [("mp", "ddp-alone"), ("ddp-mp", "ddp"), ("dp", "ddp-alone")])
def test_split_and_wrapped_models_train_as_the_plain_model(
    finished: Callable[[str], Path], split: str, unsplit: str
) -> None:
    # The split is exact and the dropout masks are drawn in the same order, so the whole run ends the same.
    ours, theirs = (load_weights(finished(n) / "final_model.pt") for n in (split, unsplit))
    for key in theirs:
        assert torch.allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6), key
    assert read_timing(finished(split))[-1]["val_acc"] == pytest.approx(read_timing(finished(unsplit))[-1]["val_acc"])


def test_local_sgd_averaging_every_step_equals_ddp(finished: Callable[[str], Path]) -> None:
    # From equal parameters, the mean of one SGD step per process is the step on the mean gradient.
    ours, theirs = (load_weights(finished(n) / "final_model.pt") for n in ("local-sgd", "ddp"))
    for key in theirs:
        assert torch.allclose(ours[key], theirs[key], rtol=1e-4, atol=1e-5), key


def test_local_sgd_averaging_only_at_the_end_differs_from_ddp(finished: Callable[[str], Path]) -> None:
    ours, theirs = (load_weights(finished(n) / "final_model.pt") for n in ("local-sgd-end", "ddp"))
    assert any(not torch.allclose(ours[k], theirs[k], rtol=1e-3, atol=1e-4) for k in theirs)


@pytest.mark.parametrize("processes", [1, 2])
def test_hogwild_accuracy_does_not_depend_much_on_the_process_count(
    tmp_path: Path, processes: int, hogwild_accuracy: dict[int, float]
) -> None:
    args = ["--epochs", "3", "--synthetic-train-size", "4096", "--synthetic-test-size", "1024", "--lr", "0.05",
            "--seed", "3", "--model", "mnist-cnn-small", "--strategy", "hogwild", "--processes", str(processes),
            "--threads-per-process", "1", "--out-dir", str(tmp_path)]  # fmt: skip
    result = run_trainer(args)
    assert result.returncode == 0, describe(result)
    hogwild_accuracy[processes] = read_timing(tmp_path)[-1]["val_acc"]
    if len(hogwild_accuracy) == 2:
        assert hogwild_accuracy[1] > 0.85  # learned (measured 0.946)
        assert abs(hogwild_accuracy[2] - hogwild_accuracy[1]) < 0.04  # measured 0.951 vs 0.946


@pytest.fixture(scope="module")
def hogwild_accuracy() -> dict[int, float]:
    return {}


# --- snapshot and resume: kill and restart --------------------------------------------------------------


def test_spawn_killed_then_rerun_resumes_and_ends_as_an_uninterrupted_run(
    finished: Callable[[str], Path], tmp_path: Path
) -> None:
    args = [*RUN, *RUNS["spawn"][1], "--out-dir", str(tmp_path)]
    killed = run_trainer([*args, "--fault-kill", KILL_IN_EPOCH_2])
    last_line = killed.stderr.strip().splitlines()[-1]
    assert killed.returncode == 2 and last_line.startswith("error: spawned process 1 was killed by SIGKILL")
    assert [r["epoch"] for r in read_timing(tmp_path)] == [1]
    rerun = run_trainer(args)
    assert rerun.returncode == 0, describe(rerun)
    assert "resuming after epoch 1" in rerun.stderr
    assert [r["epoch"] for r in read_timing(tmp_path)] == [1, 2]
    assert_same_weights(load_weights(tmp_path / "final_model.pt"),
                        load_weights(finished("spawn") / "final_model.pt"))  # fmt: skip


def test_hogwild_worker_killed_fails_the_run_and_a_rerun_resumes(tmp_path: Path) -> None:
    args = [*RUN, *RUNS["hogwild"][1], "--out-dir", str(tmp_path)]
    killed = run_trainer([*args, "--fault-kill", KILL_IN_EPOCH_2])
    last_line = killed.stderr.strip().splitlines()[-1]
    assert killed.returncode == 2 and last_line.startswith("error: hogwild worker 1 died"), describe(killed)
    assert not (tmp_path / "summary.json").exists()
    rerun = run_trainer(args)
    assert rerun.returncode == 0, describe(rerun)
    assert "resuming after epoch 1" in rerun.stderr
    timing = read_timing(tmp_path)
    assert [r["epoch"] for r in timing] == [1, 2] and timing[-1]["val_acc"] > 0.3
    assert read_json(tmp_path / "summary.json")["epochs"] == 2


def test_local_sgd_rank_killed_and_restarted_by_torchrun_resumes_from_its_own_snapshot(
    finished: Callable[[str], Path], tmp_path: Path
) -> None:
    # Averaging only at the end, the processes' weights differ until then: each must resume from its own.
    name = "local-sgd-end"
    result = run_torchrun([*RUN, *RUNS[name][1], "--out-dir", str(tmp_path), "--fault-kill", KILL_IN_EPOCH_2],
                          max_restarts=1)  # fmt: skip
    assert result.returncode == 0, describe(result)
    timing = read_timing(tmp_path)
    assert [r["restart_count"] for r in timing] == [0, 1]
    assert_same_weights(load_weights(tmp_path / "final_model.pt"),
                        load_weights(finished(name) / "final_model.pt"))  # fmt: skip


def test_mp_extended_from_its_snapshot_ends_as_one_longer_run(finished: Callable[[str], Path], tmp_path: Path) -> None:
    args = [*RUN, *RUNS["mp"][1], "--out-dir", str(tmp_path)]
    first = run_trainer([*args, "--epochs", "1"])
    assert first.returncode == 0, describe(first)
    second = run_trainer(args)
    assert second.returncode == 0 and "resuming after epoch 1" in second.stderr, describe(second)
    assert_same_weights(load_weights(tmp_path / "final_model.pt"), load_weights(finished("mp") / "final_model.pt"))


# --- refusals: one line, nothing started ------------------------------------------------------------------

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="these refusals are for a node without GPUs")
TORCHRUN_ENV: dict[str, str | None] = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}


@pytest.mark.parametrize(
    ("args", "env", "needs"),
    [
        pytest.param(["--strategy", "dp"], {}, "dp needs a GPU", marks=NO_GPU),
        pytest.param(["--strategy", "mp"], {}, "mp needs two GPUs", marks=NO_GPU),
        pytest.param(["--strategy", "ddp-mp"], {}, "ddp-mp needs two GPUs per process", marks=NO_GPU),
        (["--strategy", "local-sgd"], {}, "local-sgd averages parameters across processes"),
        (["--strategy", "hogwild", "--processes", "2"], TORCHRUN_ENV, "hogwild starts its own processes"),
        (["--strategy", "spawn"], {**TORCHRUN_ENV, "WORLD_SIZE": "4"}, "spawn starts its own processes"),
    ],
)  # fmt: skip
def test_a_strategy_that_cannot_run_here_is_refused_in_one_line_before_anything_starts(
    tmp_path: Path, args: list[str], env: dict[str, str | None], needs: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The trainer's main() in this process (what `python -m trainer` exits with): a refusal is a check of the
    command line and the environment, before any process group or process, so no process of its own is needed."""
    from trainer.__main__ import main

    out = tmp_path / "out"
    # The environment of a torchrun worker, without torchrun: a refusal must come before any process group.
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    on_sigterm = signal.getsignal(signal.SIGTERM)  # main() installs the trainer's own
    try:
        code = main([*RUN, *args, "--out-dir", str(out)])
    finally:
        signal.signal(signal.SIGTERM, on_sigterm)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: --strategy") and needs in lines[0]
    assert not out.exists()
    assert not any(os.scandir(tmp_path))
