"""The trainer's CUDA path on a real GPU (run by bench/gpu_check.sh on the GPU machine; skipped elsewhere): NCCL
with one process, two processes sharing one GPU over gloo, `ddpctl up` defaulting to the visible GPUs,
ResNet-18 and the CIFAR-10 / MNIST readers on files in the real formats, the CUDA Graph step against the plain
one, and snapshot, kill and resume ending with the uninterrupted run's weights."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_trainer_units import _write_mnist
from tests.trainer_support import (
    REPO,
    SMALL_RUN,
    assert_same_weights,
    describe,
    load_weights,
    read_json,
    read_timing,
    run_command,
    run_torchrun,
    run_trainer,
    torchvision_importable,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS_ONE_PROCESS = 128  # SMALL_RUN's 4095 samples at batch 32: 127 full batches and one of 31


def write_learnable_cifar(folder: Path, per_batch: int) -> None:
    """CIFAR-10's python batches (protocol-2 pickles of b"data" rows of 3072 uint8, b"labels"), with images whose
    brightness per channel follows the label, so that a network learns them in a few steps."""
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, per_batch)
        levels = np.repeat(np.stack([labels * 25, 250 - labels * 25, (labels % 3) * 100], axis=1), 1024, axis=1)
        data = np.clip(levels + rng.integers(-40, 40, (per_batch, 3072)), 0, 255).astype(np.uint8)
        batch = {b"batch_label": name.encode(), b"labels": [int(v) for v in labels], b"data": data}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))


def gpu_summary(out: Path, world_size: int) -> dict:
    summary = read_json(out / "summary.json")
    assert summary["world_size"] == world_size
    assert len(summary["devices"]) == world_size and all(d.startswith("cuda:0: ") for d in summary["devices"])
    return summary


def test_nccl_one_process_trains_on_the_gpu_with_the_graphed_step(tmp_path: Path) -> None:
    result = run_torchrun([*SMALL_RUN, "--backend", "nccl", "--out-dir", str(tmp_path)], nproc=1)
    assert result.returncode == 0, describe(result)
    summary = gpu_summary(tmp_path, 1)
    assert summary["cuda_graphs"] is True and summary["precision"] == "fp32"
    timing = read_timing(tmp_path)
    assert [r["steps"] for r in timing] == [STEPS_ONE_PROCESS] * 2 and timing[0]["samples"] == 4095
    assert timing[-1]["val_acc"] > 0.3 and timing[-1]["val_loss"] < timing[0]["val_loss"]


def test_two_processes_share_one_gpu_over_gloo(tmp_path: Path) -> None:
    """NCCL refuses two ranks on one device; gloo all-reduces the CUDA gradients through the host."""
    result = run_torchrun([*SMALL_RUN, "--backend", "gloo", "--out-dir", str(tmp_path)], nproc=2)
    assert result.returncode == 0, describe(result)
    summary = gpu_summary(tmp_path, 2)
    assert summary["cuda_graphs"] is False  # DDP's all-reduce is not captured: the plain step runs
    timing = read_timing(tmp_path)
    assert timing[0]["samples"] == 4096 and timing[-1]["val_acc"] > 0.3


def test_two_nccl_processes_on_one_gpu_are_refused_in_one_line(tmp_path: Path) -> None:
    if torch.cuda.device_count() > 1:
        pytest.skip("this machine has several GPUs: two NCCL processes each get their own")
    result = run_torchrun([*SMALL_RUN, "--backend", "nccl", "--out-dir", str(tmp_path)], nproc=2)
    assert result.returncode != 0
    assert "local rank 1 has no GPU" in result.stderr and "--backend gloo" in result.stderr, describe(result)


@pytest.mark.parametrize("momentum", ["0", "0.9"])  # 0.9: SGD makes its momentum buffers on the first step
def test_graphed_step_trains_as_the_plain_step(tmp_path: Path, momentum: str) -> None:
    """Same data order, dropout draws and kernels: with deterministic algorithms, the same weights bit for bit
    (the last, shorter batch of each epoch runs the plain step in both)."""
    runs = {}
    for name, extra in (("graphed", []), ("plain", ["--no-cuda-graphs"])):
        out = tmp_path / name
        result = run_trainer([*SMALL_RUN, "--deterministic", "--momentum", momentum, *extra, "--out-dir", str(out)])
        assert result.returncode == 0, describe(result)
        assert read_json(out / "summary.json")["cuda_graphs"] is (name == "graphed")
        runs[name] = out
    graphed, plain = (load_weights(runs[n] / "final_model.pt") for n in ("graphed", "plain"))
    assert_same_weights(graphed, plain)
    assert read_timing(runs["graphed"])[-1]["train_loss"] == read_timing(runs["plain"])[-1]["train_loss"]


def test_killed_run_resumes_on_cuda_with_the_uninterrupted_weights(tmp_path: Path) -> None:
    deterministic = [*SMALL_RUN, "--deterministic"]
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    result = run_torchrun([*deterministic, "--out-dir", str(clean)], nproc=1)
    assert result.returncode == 0, describe(result)
    kill_step = STEPS_ONE_PROCESS + STEPS_ONE_PROCESS // 2  # mid epoch 2: epoch 1's snapshot exists
    result = run_torchrun([*deterministic, "--out-dir", str(resumed), "--fault-kill", f"0:{kill_step}"], nproc=1,
                          max_restarts=1)  # fmt: skip
    assert result.returncode == 0, describe(result)
    assert "resuming after epoch 1" in result.stderr, describe(result)
    assert read_json(resumed / "summary.json")["restarts"] == 1
    assert_same_weights(load_weights(resumed / "final_model.pt"), load_weights(clean / "final_model.pt"))


@pytest.mark.parametrize(("model", "precision"), [("mnist-cnn", "fp32"), ("resnet18", "fp32"), ("resnet18", "bf16")])
def test_mnist_idx_files_train_on_the_gpu(tmp_path: Path, model: str, precision: str) -> None:
    if model == "resnet18" and not torchvision_importable():
        pytest.skip("needs torchvision")
    _write_mnist(tmp_path / "data" / "MNIST" / "raw", gz=True, n_train=300, n_test=100)
    out = tmp_path / "out"
    result = run_trainer(["--model", model, "--dataset", "mnist", "--data-dir", str(tmp_path / "data"),
                          "--epochs", "1", "--precision", precision, "--out-dir", str(out)])  # fmt: skip
    assert result.returncode == 0, describe(result)
    summary = gpu_summary(out, 1)
    assert (summary["model"], summary["dataset"], summary["precision"]) == (model, "mnist", precision)
    (record,) = read_timing(out)
    assert record["samples"] == 300 and record["steps"] == 10 and 0 < record["train_loss"] < 10


@pytest.mark.skipif(not torchvision_importable(), reason="needs torchvision")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resnet18_trains_on_cifar10_batches(tmp_path: Path, precision: str) -> None:
    write_learnable_cifar(tmp_path / "data" / "cifar-10-batches-py", per_batch=64)
    out = tmp_path / "out"
    result = run_trainer(["--model", "resnet18", "--dataset", "cifar10", "--data-dir", str(tmp_path / "data"),
                          "--epochs", "2", "--precision", precision, "--out-dir", str(out)])  # fmt: skip
    assert result.returncode == 0, describe(result)
    summary = gpu_summary(out, 1)
    assert (summary["model"], summary["dataset"], summary["precision"]) == ("resnet18", "cifar10", precision)
    assert summary["cuda_graphs"] is True and summary["versions"]["torchvision"]
    timing = read_timing(out)
    assert [r["samples"] for r in timing] == [320, 320] and all(r["steps"] == 10 for r in timing)
    assert timing[1]["train_loss"] < timing[0]["train_loss"]
    weights = load_weights(out / "final_model.pt")
    assert all(value.dtype != torch.bfloat16 for value in weights.values())  # bf16 autocast keeps fp32 weights


def test_ddpctl_up_defaults_to_one_process_per_visible_gpu(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "up", "--epochs", "1", "--synthetic-train-size", "2048",
         "--synthetic-test-size", "512", "--name", "gpu", "--runs-dir", str(runs), "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    run = Path(json.loads(result.stdout)["run_dir"])
    record = json.loads((run / "run.json").read_text())
    assert record["spec"]["nproc_per_node"] == torch.cuda.device_count()
    gpu_summary(run, torch.cuda.device_count())


def test_image_runs_on_the_gpu_with_gpus_all() -> None:
    """The image's `docker run --gpus all` path: its torch sees the GPU."""
    image = os.environ.get("DDPCTL_GPU_IMAGE")
    if shutil.which("docker") is None:
        pytest.skip("no Docker on this machine: the image's --gpus all path cannot be checked here")
    if not image:
        pytest.skip("set DDPCTL_GPU_IMAGE to an image built from ./Dockerfile with a CUDA torch")
    probe = "import torch; assert torch.cuda.is_available(); print(torch.cuda.get_device_name(0))"
    result = run_command(["docker", "run", "--rm", "--gpus", "all", image, "python3", "-c", probe])
    assert result.returncode == 0 and result.stdout.strip(), describe(result)
