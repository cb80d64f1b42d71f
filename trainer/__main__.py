"""`python -m trainer ...`: the command line (run under torchrun, or alone as a world of one)."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch

from trainer.data import DataSplits, load_dataset
from trainer.distributed import DistContext, setup
from trainer.errors import DataError, TrainerError
from trainer.models import MODELS, build_model
from trainer.trainer import PRECISIONS, TrainConfig, Trainer, choose_algorithms, seed_rng


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see python -m trainer --help)\n")


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be positive and finite")
        return value

    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _fault(text: str) -> tuple[int, int]:
    rank, _, step = text.partition(":")
    if not (rank.isdigit() and step.isdigit() and int(step) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not RANK:STEP (e.g. 1:40)")
    return int(rank), int(step)


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, str, Path]:
    """The command line as a TrainConfig (plus the backend and data folder, which are not the run's identity)."""
    p = _OneLineParser(prog="python -m trainer", description="DDP trainer (run it under torchrun).")
    p.add_argument("--model", choices=MODELS, default="mnist-cnn")
    p.add_argument("--dataset", choices=("synthetic", "mnist", "cifar10"), default="synthetic")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="where data sets are (or go)")
    p.add_argument("--epochs", type=_positive(int), default=3)
    p.add_argument("--batch-size", type=_positive(int), default=32, help="per process")
    p.add_argument("--lr", type=_positive(float), default=0.01)
    p.add_argument("--momentum", type=_non_negative_float, default=0.0)
    p.add_argument("--save-every", type=_positive(int), default=1, help="snapshot every N epochs")
    p.add_argument("--keep-snapshots", type=_positive(int), default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--out-dir", type=Path, default=Path())
    p.add_argument("--snapshot-dir", type=Path, default=None, help="default: OUT_DIR/snapshots")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16: forward and loss under bf16 autocast (fp32 weights); default fp32")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic algorithms (bitwise repeatable on CUDA; slower)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false",
                   help="keep images and weights NCHW (rounds exactly as the reference loop does)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="one process on CUDA: run the plain step instead of replaying the captured one")
    p.add_argument("--synthetic-train-size", type=_positive(int), default=16384)
    p.add_argument("--synthetic-test-size", type=_positive(int), default=2048)
    p.add_argument(
        "--fault-kill",
        type=_fault,
        default=None,
        metavar="RANK:STEP",
        help="tests: on the first attempt, global rank RANK SIGKILLs itself at global step STEP",
    )
    p.add_argument(
        "--fault-hang",
        type=_fault,
        default=None,
        metavar="RANK:STEP",
        help="tests: on the first attempt, global rank RANK stops responding at global step STEP",
    )
    args = p.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        p.error(f"--seed must be in 0..{2**32 - 1}, got {args.seed}")
    config = TrainConfig(
        model=args.model, dataset=args.dataset, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        momentum=args.momentum, save_every=args.save_every, keep_snapshots=args.keep_snapshots,
        seed=args.seed, out_dir=args.out_dir, snapshot_dir=args.snapshot_dir,
        synthetic_train_size=args.synthetic_train_size, synthetic_test_size=args.synthetic_test_size,
        fault_kill=args.fault_kill, fault_hang=args.fault_hang, precision=args.precision,
        deterministic=args.deterministic, cuda_graphs=args.cuda_graphs,
        channels_last=args.channels_last,
    )  # fmt: skip
    return config, args.backend, args.data_dir


def run(config: TrainConfig, backend: str, data_dir: Path) -> None:
    """Set up, train, tear down."""
    choose_algorithms(config.deterministic)  # before setup: cuBLAS reads its workspace setting when it starts
    ctx = setup(backend)
    try:
        data = _load_in_turn(ctx, config, data_dir)
        torch.manual_seed(config.seed)  # the same initial weights on every rank
        model = build_model(config.model, data.image_shape)
        seed_rng(config.seed, ctx.rank)
        if ctx.is_rank0:
            config.out_dir.mkdir(parents=True, exist_ok=True)
        Trainer(config, ctx, data, model).train()
    finally:
        ctx.close()


def _load_in_turn(ctx: DistContext, config: TrainConfig, data_dir: Path) -> DataSplits:
    """Each node's local rank 0 reads first, downloading what is missing; the other ranks read once every node
    has its files, so no two processes download into one folder at once."""

    def load() -> DataSplits:
        return load_dataset(
            config.dataset, data_dir, seed=config.seed,
            synthetic_train_size=config.synthetic_train_size, synthetic_test_size=config.synthetic_test_size,
        )  # fmt: skip

    data, error = None, None
    if ctx.local_rank == 0:
        try:
            data = load()
        except DataError as exc:
            error = exc
    if not ctx.min_int(0 if error else 1):
        raise error or DataError(f"the {config.dataset} data set could not be read on another node; see its log")
    return data if data is not None else load()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """torchrun stops workers with SIGTERM: leave through SystemExit, so half-written files are removed."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    config, backend, data_dir = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        run(config, backend, data_dir)
    except TrainerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
