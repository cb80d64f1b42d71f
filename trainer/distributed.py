"""torchrun's environment, the process group and the device of this process.

Run without torchrun (no RANK in the environment) the trainer is a world of one with no process group.
"""

from __future__ import annotations

import os
import platform
import secrets
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainer.errors import TrainerError


@dataclass
class DistContext:
    """Who this process is in the job, its device, and the few collectives the trainer needs."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    nnodes: int
    restart_count: int
    device: torch.device
    backend: str | None  # None: no process group (a world of one without torchrun)

    @property
    def grouped(self) -> bool:
        return self.backend is not None

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def min_int(self, value: int) -> int:
        if not self.grouped:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, indexed by global rank, on every rank."""
        if not self.grouped:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def close(self) -> None:
        """Tear the process group down after a clean end. Called while an exception propagates (a `finally`),
        it does nothing: a barrier there would wait on peers that are inside another collective; the failing
        rank aborts the group and leaves instead (trainer/failure.py)."""
        if sys.exc_info()[0] is not None:
            return
        if self.grouped and dist.is_initialized():
            # Every rank finishes its last collective before any tears gloo down; without it a rank can abort
            # at exit ("terminate called without an active exception") while its peer is still connected.
            dist.barrier()
            dist.destroy_process_group()
            global _group_torn_down
            _group_torn_down = True


_group_torn_down = False  # set once close() has destroyed this process's group after a clean end


def group_torn_down() -> bool:
    """Whether this process ended a process group cleanly (its peers are done with it)."""
    return _group_torn_down


def setup(backend: str = "auto", gpus_per_process: int = 1) -> DistContext:
    """Read torchrun's environment, pick this process's device and join the process group.

    With `gpus_per_process` 2 (ddp-mp) local rank k's device is its first GPU, 2k; 0 keeps it on the CPU."""
    env = os.environ
    under_torchrun = "RANK" in env and "WORLD_SIZE" in env
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    world_size = int(env.get("WORLD_SIZE", "1"))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(world_size)))
    nnodes = int(env.get("GROUP_WORLD_SIZE", str(max(1, world_size // max(1, local_world_size)))))
    restart_count = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))

    if gpus_per_process and torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        first_gpu = local_rank * gpus_per_process
        if gpus_per_process == 1 and backend == "gloo":
            # NCCL refuses two ranks on one GPU; gloo does not mind (it stages CUDA tensors through the host).
            first_gpu %= gpus
        elif first_gpu + gpus_per_process > gpus:
            share = ", or share the GPUs among more with --backend gloo" if gpus_per_process == 1 else ""
            raise TrainerError(
                f"local rank {local_rank} has no GPU: this machine has {gpus}; start at most "
                f"{gpus // gpus_per_process} processes per node{share}"
            )
        torch.cuda.set_device(first_gpu)
        device = torch.device("cuda", first_gpu)
    else:
        device = torch.device("cpu")

    if backend == "nccl" and device.type != "cuda":
        raise TrainerError("--backend nccl needs CUDA GPUs and none is available; use --backend gloo or auto")
    chosen: str | None = None
    if under_torchrun:
        chosen = ("nccl" if device.type == "cuda" else "gloo") if backend == "auto" else backend
        _init_process_group(chosen, rank, world_size)
        restart_count = _run_restart_count(restart_count, device)
    return DistContext(rank, local_rank, world_size, local_world_size, nnodes, restart_count, device, chosen)


def _run_restart_count(local_count: int, device: torch.device) -> int:
    """The run's restart count: the most any node's agent has restarted. Each torchrun counts only its own
    restarts, and a node that merely re-joined the rendezvous after another node's failure counts none."""
    count = torch.tensor([local_count], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _init_process_group(backend: str, rank: int, world_size: int) -> None:
    # torch's flight recorder keeps the group's last collectives, dumped on `ddpctl stacks` and a stall
    # (trainer/stack_dumps.py) and by NCCL on a collective's timeout; a few microseconds a collective
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend=backend)  # rank 0 hosts a fresh store on every attempt
        return
    # torchrun's agent keeps one store across restarts, and the keys of the previous attempt's process group
    # (its peers' dead addresses) are still in it: a restarted rank may connect to those and fail
    # (pytorch/pytorch#135712). Nor can a restart count name the attempt: a node that only re-joined after
    # another node's failure does not count it. So each attempt's rank 0 hosts a store of its own.
    shared = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store = attempt_store(shared, rank, os.environ["MASTER_ADDR"])
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)


ATTEMPT_KEY = "ddpctl-trainer/attempt-store"
STORE_TIMEOUT = timedelta(minutes=30)  # torch's default for a process group's store operations
_NONCE_KEY = "ddpctl-trainer/nonce"


def attempt_store(shared: dist.Store, rank: int, master_addr: str, timeout: float = 300.0,
                  probe_timeout: float = 3.0) -> dist.Store:
    """A store for this attempt alone. Rank 0 starts one on a free port and announces "PORT NONCE" in the shared
    store; the other ranks take the announcement once its store answers with that nonce. An announcement left by
    a dead attempt points at a store that is gone (every worker of the old attempt is stopped before a new
    rendezvous round completes), so they read again until this attempt's rank 0 has written its own."""
    if rank == 0:
        nonce = secrets.token_hex(8)
        store = dist.TCPStore(master_addr, 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
        store.set(_NONCE_KEY, nonce)
        shared.set(ATTEMPT_KEY, f"{store.port} {nonce}")
        return store
    deadline = time.monotonic() + timeout
    while True:
        try:
            port, nonce = shared.get(ATTEMPT_KEY).decode().split()
            store = dist.TCPStore(master_addr, int(port), is_master=False, timeout=timedelta(seconds=probe_timeout))
            if store.get(_NONCE_KEY).decode() == nonce:
                store.set_timeout(STORE_TIMEOUT)
                return store
        except (RuntimeError, dist.DistError):  # not announced yet, nobody listens there (any more), not ours
            pass
        if time.monotonic() > deadline:
            raise TrainerError(f"rank {rank}: rank 0 announced no live store at {master_addr} within {timeout:.0f}s")
        time.sleep(0.2)


def device_name(device: torch.device) -> str:
    """A readable name for this process's device: the GPU model, or the CPU model."""
    if device.type == "cuda":
        return f"{device}: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model()}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
