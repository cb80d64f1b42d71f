"""`python -m trainer ...`: the command line (run under torchrun, or alone as a world of one)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from trainer import failure, requeue
from trainer.determinism import choose_algorithms
from trainer.distributed import group_torn_down
from trainer.models import MODELS
from trainer.strategies import STRATEGIES, StrategyOptions, check_runnable, run_strategy
from trainer.strategies.options import (
    DEVICE_STRATEGIES,
    PROCESS_STRATEGIES,
    parse_average_every,
    parse_devices,
)
from trainer.trainer import PRECISIONS, TrainConfig


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


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_or_complain(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_or_complain


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, str, Path]:
    """The command line as a TrainConfig (plus the backend and data folder, which are not the run's identity)."""
    config, backend, data_dir, _ = parse_command_line(argv)
    return config, backend, data_dir


def parse_command_line(argv: list[str] | None = None) -> tuple[TrainConfig, str, Path, StrategyOptions]:
    """The whole command line: parse_args's three, and the parallel strategy with its options."""
    p = _OneLineParser(prog="python -m trainer", description="DDP trainer (under torchrun; --strategy: others)")
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
    p.add_argument(
        "--step-pause",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="tests: every rank sleeps SECONDS after each training step (a long run that leaves the CPU to others)",
    )
    # --- the parallel strategy (issue 14; docs/contracts.md, the trainer section) ---
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp", help="how the work is parallelised")
    p.add_argument(
        "--devices",
        type=_checked(parse_devices),
        default=None,
        help="dp/mp/ddp-mp: cpu or cuda:N, comma-separated (mp: one per stage; default the GPUs)",
    )
    p.add_argument(
        "--average-every",
        type=_checked(parse_average_every),
        default=None,
        help="local-sgd: average parameters every N steps, each 'epoch' (default) or at the 'end'",
    )
    p.add_argument(
        "--threads-per-process",
        type=_positive(int),
        default=None,
        help="intra-op threads per process (default: OMP_NUM_THREADS if set, else the node's cores / its processes)",
    )
    p.add_argument(
        "--processes",
        type=_positive(int),
        default=None,
        help="spawn/hogwild: processes to start on this node (default: its GPUs, or 2)",
    )
    args = p.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        p.error(f"--seed must be in 0..{2**32 - 1}, got {args.seed}")
    hangable = tuple(name for name in STRATEGIES if name != "hogwild")  # hogwild's workers do not hang on cue
    for option, value, allowed in (("--devices", args.devices, DEVICE_STRATEGIES),
                                   ("--processes", args.processes, PROCESS_STRATEGIES),
                                   ("--average-every", args.average_every, ("local-sgd",)),
                                   ("--fault-hang", args.fault_hang, hangable),
                                   ("--step-pause", args.step_pause or None, hangable)):  # fmt: skip
        if value is not None and args.strategy not in allowed:
            p.error(f"{option} applies to --strategy {'/'.join(allowed)}, not {args.strategy}")
    options = StrategyOptions(
        name=args.strategy, devices=args.devices, average_every=args.average_every or "epoch",
        threads_per_process=args.threads_per_process, processes=args.processes,
    )  # fmt: skip
    config = TrainConfig(
        model=args.model, dataset=args.dataset, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        momentum=args.momentum, save_every=args.save_every, keep_snapshots=args.keep_snapshots,
        seed=args.seed, out_dir=args.out_dir, snapshot_dir=args.snapshot_dir,
        synthetic_train_size=args.synthetic_train_size, synthetic_test_size=args.synthetic_test_size,
        fault_kill=args.fault_kill, fault_hang=args.fault_hang, step_pause=args.step_pause, precision=args.precision,
        deterministic=args.deterministic, cuda_graphs=args.cuda_graphs,
        channels_last=args.channels_last,
    )  # fmt: skip
    return config, args.backend, args.data_dir, options


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """torchrun stops workers with SIGTERM: leave through SystemExit, so half-written files are removed."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    config, backend, data_dir, options = parse_command_line(argv)
    options = dataclasses.replace(options, load_at_start=os.getloadavg())
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if options.name in requeue.STRATEGIES:  # the batch job's signal before its time limit: save and stop
            requeue.arm_from_environment()
        check_runnable(options)
        choose_algorithms(config.deterministic)  # before setup: cuBLAS reads its workspace setting when it starts
        run_strategy(config, backend, data_dir, options)
    except BaseException as exc:  # a full disk, a bad batch, SIGTERM's SystemExit: no peer may be left waiting
        # One line (a traceback first for what is not a TrainerError); with a process group up, it is aborted
        # and this process ends here, which releases every peer at once.
        return failure.leave(exc)
    finally:
        requeue.disarm()  # a signal while Python shuts down would meet the default action, which ends the process
    failure.discard()
    return 0


def leave_cleanly(code: int) -> NoReturn:
    """End a run: after a clean end with a process group torn down, without the interpreter's and C++'s
    teardown, where gloo's threads can still abort a rank whose training ended well ("terminate called without
    an active exception", SIGABRT); every result is written and closed by then. Otherwise (a world of one,
    hogwild's processes, whose semaphores the teardown releases) through Python's exit."""
    if code == 0 and group_torn_down():
        failure.exit_without_teardown(code)
    sys.exit(code)


if __name__ == "__main__":
    leave_cleanly(main())
