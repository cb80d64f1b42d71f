"""The parallel strategies of the reference write-ups, one module each, chosen by `python -m trainer --strategy`.

| strategy  | processes                          | module      |
| ddp       | torchrun's, any number of nodes    | ddp.py      |
| spawn     | torch.multiprocessing.spawn, 1 node| spawn.py    |
| dp        | one, DataParallel over its GPUs    | dp.py       |
| mp        | one, model split over two devices  | mp.py       |
| ddp-mp    | torchrun's, two devices each       | mp.py       |
| hogwild   | N workers sharing one model, 1 node| hogwild.py  |
| local-sgd | torchrun's, parameters averaged    | local_sgd.py|
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import torch

from trainer.errors import TrainerError
from trainer.strategies.options import STRATEGIES, StrategyOptions, refusal
from trainer.trainer import TrainConfig

__all__ = ["STRATEGIES", "StrategyOptions", "check_runnable", "run_strategy"]

# strategy -> (module, function): modules are imported only when chosen
_ENTRY_POINTS = {
    "ddp": ("ddp", "run"), "spawn": ("spawn", "run"), "dp": ("dp", "run"), "mp": ("mp", "run"),
    "ddp-mp": ("mp", "run_ddp"), "hogwild": ("hogwild", "run"), "local-sgd": ("local_sgd", "run"),
}  # fmt: skip


def check_runnable(options: StrategyOptions) -> None:
    """Refuse, before anything starts, a strategy this node cannot run as asked (TrainerError, one line)."""
    reason = refusal(options, os.environ, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if reason:
        raise TrainerError(reason)


def run_strategy(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """Run the whole training with `options.name`'s strategy, in this process and the ones it starts."""
    module_name, function = _ENTRY_POINTS[options.name]
    module = importlib.import_module(f"trainer.strategies.{module_name}")
    getattr(module, function)(config, backend, data_dir, options)
