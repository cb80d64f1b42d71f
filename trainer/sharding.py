"""Which training samples each rank sees in an epoch: DistributedSampler's exact order, as index tensors.

Same semantics as torch.utils.data.DistributedSampler (shuffle with a generator seeded seed+epoch, pad by
wrapping around to a multiple of the world size, or drop the tail; then take every world_size-th index
from `rank`), but computed once per epoch as one tensor instead of a Python iterator over the sampler.
"""

from __future__ import annotations

import math

import torch


def samples_per_rank(n: int, world_size: int, drop_last: bool = False) -> int:
    """How many samples each rank gets per epoch (DistributedSampler.num_samples)."""
    if drop_last and n % world_size != 0:
        return math.ceil((n - world_size) / world_size)
    return math.ceil(n / world_size)


def shard_indices(
    n: int,
    world_size: int,
    rank: int,
    epoch: int,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
) -> torch.Tensor:
    """This rank's sample indices for `epoch` (0-based, as DistributedSampler.set_epoch takes it)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator)
    else:
        order = torch.arange(n)
    per_rank = samples_per_rank(n, world_size, drop_last)
    total = per_rank * world_size
    # Pad by wrapping around (several times when n < world_size - 1), or cut the tail when dropping it.
    order = order.repeat(math.ceil(total / n))[:total] if total > n else order[:total]
    return order[rank:total:world_size]
