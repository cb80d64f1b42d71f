"""What every strategy shares: a world of one, reading the data in turn, building the model from the seed, and
the Trainer's summary with the strategy, its threads and the machine's load added.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import failure
from trainer.data import DataSplits, load_dataset
from trainer.determinism import seed_rng
from trainer.distributed import DistContext
from trainer.errors import DataError
from trainer.models import build_model
from trainer.requeue import StoppedForRequeue, ask_for_requeue
from trainer.strategies.options import StrategyOptions, node_cores
from trainer.trainer import TrainConfig, Trainer

TrainerFactory = Callable[[TrainConfig, DistContext, DataSplits, nn.Module], Trainer]


def single_process_context(device: torch.device) -> DistContext:
    """A world of one without a process group (dp and mp drive their devices from one process)."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return DistContext(0, 0, 1, 1, 1, restarts, device, None)


def set_threads(threads: int) -> int:
    """Set this process's intra-op threads explicitly, so runs with different process counts compare."""
    torch.set_num_threads(threads)
    return threads


def load_in_turn(ctx: DistContext, config: TrainConfig, data_dir: Path) -> DataSplits:
    """Each node's local rank 0 reads first, downloading what is missing; the other ranks read once every node
    has its files, so no two processes download into one folder at once."""

    def load() -> DataSplits:
        return read_data(config, data_dir)

    data, error = None, None
    if ctx.local_rank == 0:
        try:
            data = load()
        except DataError as exc:
            error = exc
    if not ctx.min_int(0 if error else 1):
        raise error or DataError(f"the {config.dataset} data set could not be read on another node; see its log")
    return data if data is not None else load()


def read_data(config: TrainConfig, data_dir: Path) -> DataSplits:
    """The run's data set as tensors."""
    return load_dataset(
        config.dataset, data_dir, seed=config.seed,
        synthetic_train_size=config.synthetic_train_size, synthetic_test_size=config.synthetic_test_size,
    )  # fmt: skip


def initial_model(config: TrainConfig, data: DataSplits) -> nn.Module:
    """The model as every process starts it: built from the run's seed, so equal on every rank."""
    torch.manual_seed(config.seed)
    return build_model(config.model, data.image_shape)


def train_in_process(ctx: DistContext, config: TrainConfig, data_dir: Path, make_trainer: TrainerFactory) -> None:
    """This process's part of a run: data, model, its own dropout stream, then the trainer's whole run."""
    data = load_in_turn(ctx, config, data_dir)
    model = initial_model(config, data)
    seed_rng(config.seed, ctx.rank)
    if ctx.is_rank0:
        config.out_dir.mkdir(parents=True, exist_ok=True)
    failure.reserve(config.out_dir, ctx.rank)  # written ahead: the reason must fit on a disk that fills up
    try:
        make_trainer(config, ctx, data, model).train()
    except StoppedForRequeue as stop:  # every rank stopped at the same step, its snapshot saved: a clean end
        ask_for_requeue()
        if ctx.is_rank0:
            print(f"trainer: {stop}", file=sys.stderr, flush=True)
    failure.discard()  # a clean end: no note to keep


def strategy_summary(options: StrategyOptions, processes: int, threads: int, **extra: Any) -> dict[str, Any]:
    """summary.json's strategy fields: what ran, how many threads each process had, and how busy the machine was
    (1, 5 and 15 minute load averages at start and end), so a report can flag runs that are not comparable."""
    return {
        "strategy": options.name, "processes_per_node": processes, "threads_per_process": threads,
        "cores": node_cores(), "load_start": list(options.load_at_start or ()), "load_end": list(os.getloadavg()),
        **extra,
    }  # fmt: skip


class StrategyTrainer(Trainer):
    """The Trainer (DDP under torchrun) whose summary names the strategy; the base of the other strategies."""

    def __init__(self, config: TrainConfig, ctx: DistContext, data: DataSplits, model: nn.Module,
                 options: StrategyOptions, threads: int) -> None:  # fmt: skip
        self.options = options
        self.threads = threads
        super().__init__(config, ctx, data, model)

    def _summary_extra(self, devices: list[str]) -> dict[str, Any]:
        extra = super()._summary_extra(devices)
        extra.update(strategy_summary(self.options, self.ctx.local_world_size, self.threads,
                                      **self._strategy_fields()))  # fmt: skip
        return extra

    def _strategy_fields(self) -> dict[str, Any]:
        """Settings of this strategy worth recording beside its results."""
        return {}
