"""`--strategy ddp` (the default): DistributedDataParallel under torchrun, one process per GPU (or CPU slot),
any number of nodes. The classic Trainer as it is; the other strategies are variations of it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from trainer.distributed import setup
from trainer.strategies.common import StrategyTrainer, set_threads, train_in_process
from trainer.strategies.options import StrategyOptions, threads_per_process
from trainer.trainer import TrainConfig


def run(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """Join torchrun's process group (or run as a world of one), train, tear down."""
    ctx = setup(backend)
    try:
        threads = set_threads(threads_per_process(options, ctx.local_world_size))
        train_in_process(ctx, config, data_dir, partial(StrategyTrainer, options=options, threads=threads))
    finally:
        ctx.close()
