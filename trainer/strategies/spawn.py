"""`--strategy spawn`: DDP on one node, its processes started by `torch.multiprocessing.spawn` instead of
torchrun, as write-ups 2 and 4 do: MASTER_ADDR=localhost, a free port, `init_process_group(rank=, world_size=)`.

Each spawned process then trains exactly as a torchrun worker does (the same Trainer), so a spawn run and a
torchrun run with the same seed end with the same weights. No restarts: rerun the command to resume from the
last snapshot.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.distributed import DistContext
from trainer.errors import TrainerError
from trainer.strategies.common import StrategyTrainer, set_threads, train_in_process
from trainer.strategies.options import StrategyOptions, process_count, threads_per_process
from trainer.trainer import TrainConfig

# torchrun's variables, when this command itself runs as torchrun's one worker: the spawned group is its own.
_TORCHRUN_VARIABLES = ("TORCHELASTIC_USE_AGENT_STORE", "GROUP_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE")


def run(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """Start the processes on this node and wait for all of them; a failed one fails the run."""
    processes = process_count(options, torch.cuda.device_count())
    threads = threads_per_process(options, processes)
    port = _free_port()
    try:
        # daemon: if this command is stopped, its processes are stopped with it
        mp.spawn(_process, args=(processes, port, config, backend, data_dir, options, threads), nprocs=processes,
                 join=True, daemon=True)  # fmt: skip
    except mp.ProcessExitedException as exc:
        how = f"was killed by {exc.signal_name}" if exc.signal_name else f"ended with exit code {exc.exit_code}"
        raise TrainerError(f"spawned process {exc.error_index} {how}; "
                           "rerun the same command to resume after the last snapshot") from None  # fmt: skip
    except mp.ProcessRaisedException as exc:
        raise TrainerError(f"spawned process {exc.error_index} failed: {str(exc).strip().splitlines()[-1]}") from None


def _process(index: int, processes: int, port: int, config: TrainConfig, backend: str, data_dir: Path,
             options: StrategyOptions, threads: int) -> None:  # fmt: skip
    """One spawned process: rank `index` of `processes`, all on this node."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    for name in _TORCHRUN_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port), RANK=str(index), LOCAL_RANK=str(index),
                      WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes))  # fmt: skip
    if torch.cuda.is_available():
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    chosen = ("nccl" if device.type == "cuda" else "gloo") if backend == "auto" else backend
    dist.init_process_group(chosen, rank=index, world_size=processes)
    ctx = DistContext(index, index, processes, processes, 1, 0, device, chosen)
    try:
        set_threads(threads)
        train_in_process(ctx, config, data_dir, partial(StrategyTrainer, options=options, threads=threads))
    except TrainerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        ctx.close()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """Stopped with the command: leave through SystemExit, so a snapshot being written is removed."""
    raise SystemExit(128 + signum)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])
