"""Random number streams (dropout draws from torch's; each rank has its own) and deterministic algorithms."""

from __future__ import annotations

import os
import random
from typing import Any

import torch


def seed_rng(seed: int, rank: int) -> None:
    """Give this rank its own dropout stream (after the model was built from the shared seed)."""
    torch.manual_seed(seed * 7919 + rank + 1)
    random.seed(seed * 7919 + rank + 1)


def capture_rng(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def choose_algorithms(deterministic: bool) -> None:
    """Deterministic: bitwise repeatable CUDA runs (a resumed run ends with the uninterrupted run's weights).

    warn_only: a few ops (nll_loss on CUDA, adaptive pooling's backward) are flagged as lacking a deterministic
    kernel and would raise; the resume test on the GPU checks the weights themselves. cuDNN's algorithm search
    (cudnn.benchmark) stays off either way: on an H100 it cost 2 s (mnist-cnn) and 8.5 s (resnet18) at start and
    gained 5% per resnet18 step, none per mnist-cnn step (bench_trainer --cudnn-benchmark on/off)."""
    if not deterministic:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: before the first matmul
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
