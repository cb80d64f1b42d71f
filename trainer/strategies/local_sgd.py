"""`--strategy local-sgd`: each process trains its own copy of the model on its own shard with plain SGD steps
(no gradient all-reduce); every `--average-every` N steps, at each epoch's end (`epoch`) or once after the last
epoch (`end`) the processes average their parameters over torch.distributed (gloo or NCCL, any number of
nodes, under torchrun). All start from rank 0's parameters (a broadcast), so `end` is write-up 5's parallel
SGD with MPI: scatter, broadcast, train apart, average.

Averaging after every step from equal parameters is DDP's update (the mean of the steps is the step of the mean
gradient), which the tests check. Between averages the processes hold different weights, so each process
snapshots its own (`snapshots/rank-NNNNN/`), and a resumed run continues each from its own. Validation between
averages gives each process's model its share of the test split, so the epoch's figures describe the processes'
models together; the last epoch's come after the final average.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.distributed import DistContext, setup
from trainer.strategies.common import StrategyTrainer, set_threads, train_in_process
from trainer.strategies.options import StrategyOptions, threads_per_process
from trainer.trainer import EpochResult, TrainConfig


class LocalSgdTrainer(StrategyTrainer):
    """The Trainer without DDP: local steps, then parameter averages on the schedule `average_every`."""

    def __init__(self, config: TrainConfig, ctx: DistContext, data: Any, model: nn.Module,
                 options: StrategyOptions, threads: int) -> None:  # fmt: skip
        super().__init__(config, ctx, data, model, options, threads)
        self.average_every = options.average_every
        self.steps_done = 0  # this process's optimizer steps in the whole run (resumes included)
        self.snapshot_dir = self.snapshot_dir / f"rank-{ctx.rank:05d}"
        self._broadcast_from_rank0()

    def _wrap(self, model: nn.Module) -> nn.Module:
        return model  # no gradient all-reduce: each process steps on its own gradients

    def _writes_snapshots(self) -> bool:
        return True  # each process's weights are its own

    def _run_batch(self, images: torch.Tensor, labels: torch.Tensor, sums: torch.Tensor) -> None:
        super()._run_batch(images, labels, sums)
        self.steps_done += 1
        if isinstance(self.average_every, int) and self.steps_done % self.average_every == 0:
            self._average()

    def _run_epoch(self, epoch: int) -> EpochResult:
        self.steps_done = (epoch - 1) * self.steps_per_epoch
        result = super()._run_epoch(epoch)
        last = epoch == self.config.epochs
        # After the last epoch every schedule averages once more, so the run ends with one model (with N steps,
        # only where the epoch did not just end on an average).
        if self.average_every == "epoch" or (
            last and not (isinstance(self.average_every, int) and self.steps_done % self.average_every == 0)
        ):
            self._average()
        return result

    def _strategy_fields(self) -> dict[str, Any]:
        return {"average_every": self.average_every}

    def _tensors(self) -> list[torch.Tensor]:
        """What is averaged: the parameters and the floating-point buffers (batch-norm statistics)."""
        buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        return [p.data for p in self.model.parameters()] + buffers

    @torch.no_grad()
    def _average(self) -> None:
        """Replace every process's parameters with their mean across processes (one all-reduce)."""
        flat = self._flat()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        self._unflatten(flat / self.ctx.world_size)

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        """Start every process from rank 0's parameters, as write-up 5 does (here they are equal already)."""
        flat = self._flat()
        dist.broadcast(flat, src=0)
        self._unflatten(flat)

    def _flat(self) -> torch.Tensor:
        # One contiguous tensor: one collective instead of one per layer, whatever each layer's memory format.
        return torch.cat([t.reshape(-1) for t in self._tensors()])

    def _unflatten(self, flat: torch.Tensor) -> None:
        offset = 0
        for t in self._tensors():
            t.copy_(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()


def run(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """This torchrun worker: join the group, train its shard, average on the schedule."""
    ctx = setup(backend)
    try:
        threads = set_threads(threads_per_process(options, ctx.local_world_size))

        def make(config: TrainConfig, ctx: DistContext, data: Any, model: nn.Module) -> LocalSgdTrainer:
            return LocalSgdTrainer(config, ctx, data, model, options, threads)

        train_in_process(ctx, config, data_dir, make)
    finally:
        ctx.close()
