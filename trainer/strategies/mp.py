"""`--strategy mp` and `--strategy ddp-mp`: the model split in two stages on two devices (write-up 3).

- mp: one process, stage 1 on the first device and stage 2 on the second (`--devices`, default cuda:0,cuda:1);
  the batch flows through both in turn, so one device idles while the other works: it is for models too large
  for one device, not for speed.
- ddp-mp: DDP over processes that each own two devices (local rank k: GPUs 2k and 2k+1), under torchrun;
  `DDP(model)` without device_ids, as a multi-device module needs.
`--devices cpu,cpu` places both stages on the CPU, so the mechanics run (and are tested) without GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.distributed import DistContext, setup
from trainer.strategies.common import StrategyTrainer, set_threads, single_process_context, train_in_process
from trainer.strategies.options import StrategyOptions, threads_per_process
from trainer.strategies.split import SplitModel
from trainer.trainer import TrainConfig


class ModelParallelTrainer(StrategyTrainer):
    """The Trainer with its model split across `devices`; under a process group, DDP over the split models."""

    def __init__(self, config: TrainConfig, ctx: DistContext, data: Any, model: nn.Module, options: StrategyOptions,
                 threads: int, devices: tuple[torch.device, torch.device]) -> None:  # fmt: skip
        self.devices = devices
        super().__init__(config, ctx, data, model, options, threads)

    def _place(self, model: nn.Module) -> nn.Module:
        return SplitModel(super()._place(model), self.devices)

    def _wrap(self, model: nn.Module) -> nn.Module:
        return DistributedDataParallel(model) if self.ctx.grouped else model

    def _strategy_fields(self) -> dict[str, Any]:
        return {"stage_devices": [str(d) for d in self.devices]}


def run(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """mp: one process holding both stages."""
    del backend  # one process, no process group
    first, second = (torch.device(name) for name in options.devices or ("cuda:0", "cuda:1"))
    ctx = single_process_context(first)
    threads = set_threads(threads_per_process(options, 1))
    _train(ctx, config, data_dir, options, threads, (first, second))


def run_ddp(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """ddp-mp: this torchrun worker joins the group and holds its two stages."""
    on_cpu = options.devices == ("cpu", "cpu")
    ctx = setup(backend, gpus_per_process=0 if on_cpu else 2)
    try:
        if on_cpu:
            devices = (torch.device("cpu"), torch.device("cpu"))
        else:
            first = 2 * ctx.local_rank
            devices = (torch.device("cuda", first), torch.device("cuda", first + 1))
        threads = set_threads(threads_per_process(options, ctx.local_world_size))
        _train(ctx, config, data_dir, options, threads, devices)
    finally:
        ctx.close()


def _train(ctx: DistContext, config: TrainConfig, data_dir: Path, options: StrategyOptions, threads: int,
           devices: tuple[torch.device, torch.device]) -> None:  # fmt: skip
    def make(config: TrainConfig, ctx: DistContext, data: Any, model: nn.Module) -> ModelParallelTrainer:
        return ModelParallelTrainer(config, ctx, data, model, options, threads, devices)

    train_in_process(ctx, config, data_dir, make)
