"""A Vast.ai run's cost as Vast bills it: GPU time and storage per second (storage for as long as the instance
exists, GPU while it is not stopped), and bandwidth per GB at each host's own prices (inet_down_cost for what
comes into the machine: the image pull and what ddpctl ships; inet_up_cost for what leaves it: what ddpctl
pulls back). Bytes moved come from the run's events ("shipped" bytes_sent, "pulled" bytes_fetched, per node)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GB = 1e9  # Vast prices bandwidth per GB (decimal)
# What pulling ddpctl's image costs a machine that has none of its layers: pytorch/pytorch:2.11.0-cuda12.8-cudnn9-
# runtime is about 3.5 GB compressed, plus the trainer layer. Counted once per instance created (a host that has
# the layers cached pulls less: the cost shown is then a little high, never low).
IMAGE_PULL_GB = 4.0


def moved_bytes(events: Iterable[Mapping[str, Any]]) -> dict[int, tuple[int, int]]:
    """Per node: (bytes sent to it, bytes pulled from it) by ddpctl, from the run's events."""
    moved: dict[int, tuple[int, int]] = {}
    for event in events:
        node = event.get("node")
        if not isinstance(node, int):
            continue
        down, up = moved.get(node, (0, 0))
        if event.get("event") in ("shipped", "image"):  # what ddpctl sent to the node (code, data, an image)
            down += int(event.get("bytes_sent") or 0)
        elif event.get("event") == "pulled":
            up += int(event.get("bytes_fetched") or 0)
        moved[node] = (down, up)
    return moved


def bandwidth_usd(instances: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
                  image_gb: float = IMAGE_PULL_GB) -> float:
    """Dollars of bandwidth: the image pull on every instance created, what ddpctl shipped to and pulled from the
    instance that ran each node."""
    moved = moved_bytes(events)
    total = 0.0
    for inst in instances:
        down_cost, up_cost = float(inst.get("inet_down_cost") or 0), float(inst.get("inet_up_cost") or 0)
        total += image_gb * down_cost
        if inst.get("overlay_ip") is not None or inst.get("ssh_host") is not None:  # it ran its node
            down, up = moved.get(int(inst.get("node") or 0), (0, 0))
            total += down / GB * down_cost + up / GB * up_cost
    return total


def cost_split(instances: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
               now: float) -> dict[str, float]:
    """The run's cost in Vast's three parts (USD): gpu, storage and bandwidth, and their total."""
    instances = list(instances)
    gpu = storage = 0.0
    for inst in instances:
        end = inst.get("destroyed_at") or now
        hours = max(0.0, end - float(inst.get("created_at") or end)) / 3600.0
        dph = float(inst.get("dph") or 0.0)
        storage_dph = min(dph, float(inst.get("storage_dph") or 0.0))
        stopped = sum(max(0.0, min(end, stop[1] or end) - stop[0]) for stop in inst.get("stops") or []) / 3600.0
        gpu += (dph - storage_dph) * max(0.0, hours - stopped)  # a stopped machine (autostop) bills storage only
        storage += storage_dph * hours
    bandwidth = bandwidth_usd(instances, events)
    return {"gpu_usd": round(gpu, 6), "storage_usd": round(storage, 6), "bandwidth_usd": round(bandwidth, 6),
            "total_usd": round(gpu + storage + bandwidth, 6)}


def reserve_usd(offers: Iterable[Any], data_gb: float, image_gb: float = IMAGE_PULL_GB) -> float:
    """Bandwidth --max-cost keeps back before renting: the image pull and `data_gb` each way on every machine
    (`offers` are models.Offer: their inet_down_cost / inet_up_cost)."""
    return sum((image_gb + data_gb) * o.inet_down_cost + data_gb * o.inet_up_cost for o in offers)


def split_line(split: Mapping[str, Any]) -> str:
    """'GPU $a + storage $b + bandwidth $c' for the summary table."""
    return (f"GPU ${float(split.get('gpu_usd') or 0):.4f} + storage ${float(split.get('storage_usd') or 0):.4f} + "
            f"bandwidth ${float(split.get('bandwidth_usd') or 0):.4f}")
