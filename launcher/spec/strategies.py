"""How each parallel strategy is laid out by the launcher (docs/contracts.md, trainer section): which options
apply to it, how many torchrun workers and trainer processes one node gets, and how many GPUs it needs.

`--gpus N` keeps meaning "processes / GPUs to use" for the user; these functions turn it into the trainer's
layout. Pure functions of values: no torch, no I/O.
"""

from __future__ import annotations

import re

from launcher.errors import SpecError

STRATEGIES = ("ddp", "spawn", "dp", "mp", "ddp-mp", "hogwild", "local-sgd")
PRECISIONS = ("fp32", "bf16")
# Strategies that start their own processes inside one `python -m trainer` (torchrun's single worker).
SELF_SPAWNING = ("spawn", "hogwild")
# Strategies that run one process holding every device it uses.
ONE_PROCESS = ("dp", "mp")
DEVICE_STRATEGIES = ("dp", "mp", "ddp-mp")
ONE_NODE = ("spawn", "hogwild", "dp", "mp")

_DEVICE = re.compile(r"^(cpu|cuda:\d+|\d+)$")


def check_strategy(strategy: str, *, devices: str | None, average_every: str | None, user_command: bool,
                   nnodes: int, nproc_per_node: int) -> None:
    """Raise SpecError (one line: what it needs) when the strategy cannot run with these options and layout."""
    if strategy not in STRATEGIES:
        raise SpecError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if user_command and strategy != "ddp":
        raise SpecError(f"`-- CMD` runs your own command under torchrun (ddp): drop --strategy {strategy}, "
                        "or drop the command to run our trainer")
    if devices is not None:
        if strategy not in DEVICE_STRATEGIES:
            raise SpecError(f"--devices is for --strategy dp, mp or ddp-mp, not {strategy}: drop --devices")
        _check_devices(strategy, devices)
    if average_every is not None:
        if strategy != "local-sgd":
            raise SpecError(f"--average-every is for --strategy local-sgd, not {strategy}: drop --average-every")
        if average_every not in ("epoch", "end") and not (average_every.isdigit() and int(average_every) >= 1):
            raise SpecError(f"--average-every {average_every!r}: give a number of steps >= 1, 'epoch' or 'end'")
    if strategy in ONE_NODE and nnodes > 1:
        raise SpecError(f"--strategy {strategy} runs on one node, not {nnodes}: use one host, or --strategy ddp "
                        "or local-sgd across nodes")
    if strategy == "local-sgd" and nnodes * nproc_per_node < 2:
        raise SpecError("--strategy local-sgd averages parameters across processes and needs at least 2: "
                        "give --gpus 2 or more (or more nodes)")
    if strategy == "ddp-mp" and nproc_per_node % 2:
        raise SpecError(f"--strategy ddp-mp gives each process two devices: --gpus must be even (2, 4, ...), "
                        f"got {nproc_per_node}")


def _check_devices(strategy: str, devices: str) -> None:
    names = [d.strip() for d in devices.split(",")]
    if not all(_DEVICE.fullmatch(d) for d in names):
        raise SpecError(f"--devices {devices!r}: give cpu or cuda:N (or N), comma-separated, e.g. cpu,cpu")
    if strategy in ("mp", "ddp-mp") and len(names) != 2:
        raise SpecError(f"--strategy {strategy} splits the model in two stages: --devices names two devices, "
                        f"e.g. cuda:0,cuda:1 or cpu,cpu (got {len(names)})")
    if strategy == "ddp-mp" and any(d != "cpu" for d in names):
        raise SpecError("--strategy ddp-mp places its stages on GPUs 2k, 2k+1 itself: --devices takes only "
                        "cpu,cpu (both stages on the CPU)")


def torchrun_workers(strategy: str, nproc_per_node: int) -> int:
    """torchrun's --nproc-per-node for the strategy: 1 where the trainer starts its own processes or runs one."""
    if strategy in SELF_SPAWNING or strategy in ONE_PROCESS:
        return 1
    if strategy == "ddp-mp":
        return max(1, nproc_per_node // 2)
    return nproc_per_node


def trainer_processes(strategy: str, nproc_per_node: int) -> int | None:
    """The trainer's --processes (spawn, hogwild: the processes it starts itself); None where it does not apply."""
    return nproc_per_node if strategy in SELF_SPAWNING else None


def processes_per_node(strategy: str, nproc_per_node: int) -> int:
    """How many training processes one node runs (what the trainer records as processes_per_node)."""
    if strategy in ONE_PROCESS:
        return 1
    return torchrun_workers(strategy, nproc_per_node) if strategy == "ddp-mp" else nproc_per_node


def default_devices(strategy: str, devices: str | None, nproc_per_node: int) -> str | None:
    """The --devices the trainer gets: the user's, else for dp the first --gpus GPUs (mp, ddp-mp: its own)."""
    if devices is not None or strategy != "dp":
        return devices
    return ",".join(f"cuda:{i}" for i in range(nproc_per_node))


def gpus_needed(strategy: str, devices: str | None, nproc_per_node: int) -> int:
    """GPUs one node must have for the strategy (0: runs on CPU as well)."""
    if devices is not None:
        names = [d.strip() for d in devices.split(",")]
        cuda = {d.removeprefix("cuda:") for d in names if d != "cpu"}
        return 1 + max(map(int, cuda)) if cuda else 0
    if strategy == "dp":
        return nproc_per_node
    if strategy == "mp":
        return 2
    if strategy == "ddp-mp":
        return 2 * torchrun_workers(strategy, nproc_per_node)
    return 0


def check_gpus(strategy: str, devices: str | None, nproc_per_node: int, gpus: int, where: str) -> None:
    """Refuse a strategy that needs more GPUs than `where` has (`gpus`), saying what it needs."""
    needed = gpus_needed(strategy, devices, nproc_per_node)
    if needed > gpus:
        cpu = "cpu" if strategy == "dp" else "cpu,cpu"
        fewer = "give fewer with --gpus, or " if strategy == "dp" and gpus else ""
        raise SpecError(f"--strategy {strategy} needs {needed} GPU(s) and {where} has {gpus}: {fewer}add "
                        f"--devices {cpu} to run it on the CPU")
