"""`--strategy dp`: `nn.DataParallel`, one process driving the node's GPUs (write-up 3). Each step scatters the
batch over the GPUs, runs a replica of the model on each, and gathers outputs and gradients on the first.

Without GPUs, DataParallel runs the plain model: `--devices cpu` asks for exactly that (the mechanics are then
testable on CPU, nothing is parallel); without it a GPU-less node is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.distributed import DistContext
from trainer.strategies.common import StrategyTrainer, set_threads, single_process_context, train_in_process
from trainer.strategies.options import StrategyOptions, threads_per_process
from trainer.trainer import TrainConfig


class DataParallelTrainer(StrategyTrainer):
    """The Trainer with its model wrapped in DataParallel over `gpu_ids` (none: the CPU fallback)."""

    def __init__(self, config: TrainConfig, ctx: DistContext, data: Any, model: nn.Module,
                 options: StrategyOptions, threads: int, gpu_ids: list[int]) -> None:  # fmt: skip
        self.gpu_ids = gpu_ids
        super().__init__(config, ctx, data, model, options, threads)

    def _wrap(self, model: nn.Module) -> nn.Module:
        if not self.gpu_ids:
            return nn.DataParallel(model)  # no GPU visible: DataParallel calls the module itself
        return nn.DataParallel(model, device_ids=self.gpu_ids, output_device=self.gpu_ids[0])

    def _strategy_fields(self) -> dict[str, Any]:
        return {"data_parallel_devices": [f"cuda:{i}" for i in self.gpu_ids] or ["cpu"]}


def run(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """One process: the model and the data on the first GPU (or the CPU), replicas on the others each step."""
    del backend  # one process, no process group
    if options.devices == ("cpu",):
        gpu_ids: list[int] = []
    elif options.devices:
        gpu_ids = [int(name.split(":")[1]) for name in options.devices]
    else:
        gpu_ids = list(range(torch.cuda.device_count()))
    device = torch.device("cuda", gpu_ids[0]) if gpu_ids else torch.device("cpu")
    if gpu_ids:
        torch.cuda.set_device(device)
    ctx = single_process_context(device)
    threads = set_threads(threads_per_process(options, 1))

    def make(config: TrainConfig, ctx: DistContext, data: Any, model: nn.Module) -> DataParallelTrainer:
        return DataParallelTrainer(config, ctx, data, model, options, threads, gpu_ids)

    train_in_process(ctx, config, data_dir, make)
