"""What `--strategy` and its options ask for, and whether this node can do it: checked before anything starts.

Pure (no torch): the node's GPU count and torchrun's environment are passed in, so the refusals are tested as
plain functions; `python -m trainer` turns a refusal into one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

STRATEGIES = ("ddp", "spawn", "dp", "mp", "ddp-mp", "hogwild", "local-sgd")
# Which options belong to which strategies (given to another one, they are refused, not ignored).
DEVICE_STRATEGIES = ("dp", "mp", "ddp-mp")
PROCESS_STRATEGIES = ("spawn", "hogwild")  # they start their own processes on one node, not under torchrun
DEFAULT_CPU_PROCESSES = 2  # as `ddpctl up --gpus` defaults to on a CPU-only machine


@dataclass(frozen=True)
class StrategyOptions:
    """The parallel strategy and the options that shape it."""

    name: str = "ddp"
    devices: tuple[str, ...] | None = None  # dp/mp/ddp-mp: "cpu" or "cuda:N" each; None: the GPUs, in order
    average_every: int | str = "epoch"  # local-sgd: a number of steps, "epoch" or "end"
    threads_per_process: int | None = None  # None: the node's cores / processes on the node
    processes: int | None = None  # spawn/hogwild; None: the node's GPUs, or 2 without any
    load_at_start: tuple[float, ...] | None = None  # os.getloadavg() when the command started


def parse_devices(text: str) -> tuple[str, ...]:
    """`cpu,cpu` / `cuda:0,cuda:1` / `0,1` as device names; ValueError saying what is wrong."""
    names = []
    for part in text.split(","):
        part = part.strip()
        if part.isdigit():
            part = f"cuda:{part}"
        if part != "cpu" and not (part.startswith("cuda:") and part[5:].isdigit()):
            raise ValueError(f"{part!r} is not a device: give cpu, cuda:N or N, comma-separated")
        names.append(part)
    return tuple(names)


def parse_average_every(text: str) -> int | str:
    """`--average-every`: a positive number of steps, `epoch` or `end`."""
    if text in ("epoch", "end"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(f"{text!r} is not a positive number of steps, 'epoch' or 'end'")


def node_cores() -> int:
    """The cores this process may run on (its affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def process_count(options: StrategyOptions, gpu_count: int) -> int:
    """How many processes spawn/hogwild start: --processes, else one per GPU, else 2."""
    return options.processes or gpu_count or DEFAULT_CPU_PROCESSES


def threads_per_process(options: StrategyOptions, processes_on_node: int) -> int:
    """Intra-op threads for each process: --threads-per-process, else OMP_NUM_THREADS where the environment sets
    it (torchrun sets 1 when it starts several processes per node), else the node's cores shared out evenly."""
    if options.threads_per_process:
        return options.threads_per_process
    from_env = os.environ.get("OMP_NUM_THREADS", "")
    if from_env.isdigit() and int(from_env) > 0:
        return int(from_env)
    return max(1, node_cores() // max(1, processes_on_node))


def refusal(options: StrategyOptions, env: Mapping[str, str], gpu_count: int) -> str | None:
    """Why this strategy cannot run here, in one line saying what it needs; None when it can."""
    name = options.name
    world = int(env.get("WORLD_SIZE", "1"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    devices = options.devices
    if name in PROCESS_STRATEGIES:
        if world > 1:
            return (f"--strategy {name} starts its own processes on one node: run one `python -m trainer` "
                    f"(not {world} torchrun workers, nor several nodes) and give --processes N")  # fmt: skip
        wanted = process_count(options, gpu_count)
        if name == "spawn" and gpu_count and wanted > gpu_count:
            return f"--strategy spawn with {wanted} processes needs {wanted} GPUs, this node has {gpu_count}"
    if name in ("dp", "mp") and world > 1:
        other = "ddp" if name == "dp" else "ddp-mp"
        return (f"--strategy {name} is one process per node; {world} torchrun workers were started: "
                f"run one, or use --strategy {other}")  # fmt: skip
    if name == "dp":
        if devices is None and gpu_count == 0:
            return ("--strategy dp needs a GPU and this node has none; pass --devices cpu for DataParallel's "
                    "CPU fallback (the plain model, nothing parallel)")  # fmt: skip
        if devices is not None and "cpu" in devices:
            if devices != ("cpu",):
                return "--strategy dp takes either --devices cpu or GPUs (cuda:N,...), not both"
            if gpu_count:
                return "--devices cpu for dp is for nodes without GPUs: hide them with CUDA_VISIBLE_DEVICES="
    if name == "mp":
        if devices is None and gpu_count < 2:
            return (f"--strategy mp needs two GPUs, this node has {gpu_count}; "
                    "pass --devices cpu,cpu to place both stages on the CPU")  # fmt: skip
        if devices is not None and len(devices) != 2:
            return f"--strategy mp takes two devices (one per stage), got {len(devices)}: {','.join(devices)}"
    if name == "ddp-mp":
        if devices is not None and devices != ("cpu", "cpu"):
            return ("--strategy ddp-mp places local rank k on GPUs 2k and 2k+1; "
                    "--devices takes only cpu,cpu there (both stages on the CPU)")  # fmt: skip
        if devices is None and gpu_count < 2 * local_world:
            return (f"--strategy ddp-mp needs two GPUs per process: {local_world} processes on this node need "
                    f"{2 * local_world}, it has {gpu_count}; start {gpu_count // 2} per node, "
                    "or pass --devices cpu,cpu")  # fmt: skip
    if devices is not None:
        missing = [d for d in devices if d.startswith("cuda:") and int(d[5:]) >= gpu_count]
        if missing:
            has = f"{gpu_count} GPUs (cuda:0..cuda:{gpu_count - 1})" if gpu_count else "no GPU"
            return f"--devices {','.join(missing)}: this node has {has}"
    if name == "local-sgd" and world < 2:
        return ("--strategy local-sgd averages parameters across processes: start at least 2 "
                "(torchrun --nproc-per-node 2, or several nodes)")  # fmt: skip
    return None
