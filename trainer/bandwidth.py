"""All-reduce bus bandwidth and latency between the nodes (`ddpctl doctor --bandwidth`, `up --check-bandwidth`).

One process per node, started by the launcher over SSH as `python -c THIS_FILE RANK WORLD ADDR PORT IFACE MAX_BYTES
BACKEND SECONDS` (this file's text: the hosts need torch only, not ddpctl). It measures as nccl-tests'
all_reduce_perf does: for message sizes from 8 bytes up to MAX_BYTES (the model's gradient), the time of one
all-reduce (the slowest rank's mean over several), algbw = bytes / time and busbw = algbw * 2(n-1)/n, the figure
that compares with a link's rate whatever the node count. With more than two nodes, every pair of nodes is then
measured alone at MAX_BYTES (the others wait), and the slowest pair is named. Rank 0 prints one line,
`DDPCTL_BANDWIDTH {json}`. gloo on CPU (over IFACE, as GLOO_SOCKET_IFNAME is for a run), NCCL on GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

RESULT_MARK = "DDPCTL_BANDWIDTH "
SMALLEST = 8  # bytes: two float32 values, where the time is the latency


def message_sizes(max_bytes: int) -> list[int]:
    """8 B, 64 B, 512 B, ... (x8) below max_bytes, then max_bytes itself: all float32-aligned."""
    top = max(SMALLEST, max_bytes - max_bytes % 4)
    sizes = []
    size = SMALLEST
    while size < top:
        sizes.append(size)
        size *= 8
    return [*sizes, top]


def repeats(size: int) -> int:
    """How many timed all-reduces of `size` bytes: many for small ones (the clock's resolution), two at least."""
    return max(2, min(50, (8 << 20) // max(size, 1)))


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce factor: busbw = algbw * 2(n-1)/n."""
    return 2 * (world - 1) / world if world > 1 else 1.0


def timed_all_reduce(size: int, device: torch.device, group: Any = None) -> float:
    """Seconds per all-reduce of `size` bytes in `group`, the slowest member's mean after one warm-up."""
    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)
    count = repeats(size)
    dist.barrier(group=group)
    _sync(device)
    start = time.perf_counter()
    for _ in range(count):
        dist.all_reduce(tensor, group=group)
    _sync(device)
    took = torch.tensor([(time.perf_counter() - start) / count], dtype=torch.float64, device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return float(took.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sweep(max_bytes: int, device: torch.device) -> dict[str, Any]:
    """The sizes' rows and the run's figures: bus bandwidth at max_bytes, latency at the smallest size."""
    world = dist.get_world_size()
    rows = []
    for size in message_sizes(max_bytes):
        seconds = timed_all_reduce(size, device)
        algbw = size / seconds
        rows.append({"bytes": size, "time_ms": seconds * 1e3, "algbw_gbit_s": algbw * 8 / 1e9,
                     "busbw_gbit_s": algbw * bus_factor(world) * 8 / 1e9})
    return {"nodes": world, "backend": dist.get_backend(), "max_bytes": rows[-1]["bytes"], "sizes": rows,
            "busbw_gbit_s": rows[-1]["busbw_gbit_s"], "latency_ms": rows[0]["time_ms"]}


def pairwise(max_bytes: int, device: torch.device) -> list[dict[str, Any]]:
    """Each pair of nodes alone (the others wait at a barrier): its bus bandwidth at max_bytes."""
    world, rank = dist.get_world_size(), dist.get_rank()
    pairs = [(i, j) for i in range(world) for j in range(i + 1, world)]
    groups = [dist.new_group(list(pair)) for pair in pairs]  # every rank makes every group, in the same order
    found = []
    size = message_sizes(max_bytes)[-1]
    for pair, group in zip(pairs, groups, strict=True):
        if rank in pair:
            seconds = timed_all_reduce(size, device, group)  # two ranks: busbw = algbw
            found.append({"nodes": list(pair), "busbw_gbit_s": (size / seconds) * 8 / 1e9})
        dist.barrier()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, found)
    merged = {tuple(p["nodes"]): p for part in gathered for p in part}
    return [merged[pair] for pair in pairs]


def main(argv: list[str]) -> int:
    rank, world, addr, port, iface, max_bytes, backend, seconds = argv
    signal.alarm(int(float(seconds)))  # never outlive the launcher's wait, whatever a peer does
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        os.environ["NCCL_SOCKET_IFNAME"] = iface
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=int(rank), world_size=int(world),
                            timeout=timedelta(seconds=float(seconds)))
    try:
        result = sweep(int(max_bytes), device)
        if int(world) > 2:
            result["pairs"] = pairwise(int(max_bytes), device)
        if int(rank) == 0:
            print(RESULT_MARK + json.dumps(result), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # `python -c SOURCE ARGS...` on a node
    sys.exit(main(sys.argv[1:]))
