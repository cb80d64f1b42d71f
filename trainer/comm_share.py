"""Where a step's time goes: the share of a DDP step spent waiting on gradient communication that computation did
not hide (summary.json's `exposed_comm_fraction`).

After training, a few steps are timed with DDP's gradient all-reduce and a few under `model.no_sync()` (no
communication), alternating, on the first batch of the training data, every rank starting each step together (a
barrier). The fraction is (t_sync - t_nosync) / t_sync, each the slowest rank's fastest (as benchmarks take the
fastest of repeats: the one least disturbed by other work on the machine); a synced step waits for
the slowest rank's computation, which is therefore all that communication can hide behind. Forward and backward
only: no optimizer step, and the model's parameters, buffers, gradients and random state are restored after, so
the trained model and its results are those of the training. Near 0: the network is not what limits the run;
near 1: most of a step is waiting on it. Noise can make it slightly negative on a fast link; it is recorded as
measured.
"""

from __future__ import annotations

import copy
import time
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.data import DataSplits
from trainer.determinism import capture_rng, restore_rng
from trainer.distributed import DistContext

ROUNDS = 10  # timed (sync, no-sync) pairs after one warm-up pair


class Trained(Protocol):
    """What of the Trainer (trainer/trainer.py) the measurement uses."""

    @property
    def ddp(self) -> nn.Module: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def ctx(self) -> DistContext: ...
    @property
    def data(self) -> DataSplits: ...
    @property
    def config(self) -> Any: ...

    def _autocast(self) -> AbstractContextManager[Any]: ...


def exposed_comm(trainer: Trained) -> dict[str, Any]:
    """summary.json's exposed_comm_fraction and the two step times it comes from; None for each where there is no
    gradient communication to time (one process, or a strategy other than DDP)."""
    ddp, ctx = trainer.ddp, trainer.ctx
    if not isinstance(ddp, DistributedDataParallel) or ctx.world_size < 2 or len(trainer.data.train_y) == 0:
        return {"exposed_comm_fraction": None, "step_ms_sync": None, "step_ms_no_sync": None}
    batch = min(trainer.config.batch_size, len(trainer.data.train_y))
    images, labels = trainer.data.train_x[:batch], trainer.data.train_y[:batch]
    saved_model = copy.deepcopy(trainer.model.state_dict())
    saved_rng = capture_rng(ctx.device)
    synced, alone = [], []
    try:
        for round_index in range(ROUNDS + 1):
            with_sync = _timed_step(trainer, ddp, images, labels, sync=True)
            without = _timed_step(trainer, ddp, images, labels, sync=False)
            if round_index:  # the first pair warms up (buffers, the first bucket's allocation)
                synced.append(with_sync)
                alone.append(without)
    finally:
        trainer.model.load_state_dict(saved_model)
        trainer.optimizer.zero_grad(set_to_none=True)
        restore_rng(saved_rng, ctx.device)
    slowest = torch.tensor([min(synced), min(alone)], dtype=torch.float64,
                           device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the slowest rank's compute is what a sync step waits on
    t_sync, t_nosync = (float(v) for v in slowest.tolist())
    return {"exposed_comm_fraction": (t_sync - t_nosync) / t_sync if t_sync > 0 else None,
            "step_ms_sync": t_sync * 1e3, "step_ms_no_sync": t_nosync * 1e3}


def _timed_step(trainer: Trained, ddp: DistributedDataParallel, images: torch.Tensor, labels: torch.Tensor, *,
                sync: bool) -> float:
    """Seconds of one forward and backward, with DDP's all-reduce or under no_sync."""
    trainer.optimizer.zero_grad(set_to_none=True)
    device = trainer.ctx.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()  # every rank starts together: a step's time is not another rank's lateness
    start = time.perf_counter()
    with trainer._autocast():
        if sync:
            F.nll_loss(ddp(images), labels).backward()
        else:
            with ddp.no_sync():
                F.nll_loss(ddp(images), labels).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
