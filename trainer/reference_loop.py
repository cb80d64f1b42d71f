"""The reference write-ups' training loop: the baseline our trainer is measured against (bench/bench_trainer.py)
and checked equal to (tests/test_reference_equivalence.py).

As pytorch/examples' mnist and the DDP tutorial series write it: a per-item Dataset that turns each uint8 image
into a PIL image, then ToTensor + Normalize (rendered here without torchvision, which has no CPU build on our
machines); a DataLoader over DistributedSampler(shuffle=True, seed) (on a GPU with pin_memory and one worker);
`.to(device)` per batch and `.item()` per step; DDP when there are several processes. The liberties: the
DataLoader draws its workers' base seed from a generator of its own, not torch's global one, so that dropout
draws the same numbers as in our trainer (the seed itself changes nothing here); and after its process group is
torn down, a rank leaves without the interpreter's teardown, as our trainer does (after the last result is written).

    torchrun --nproc-per-node 2 -m trainer.reference_loop --out-dir DIR [--epochs 1 --lr 0.05 --seed 3 ...]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from trainer.data import MNIST_MEAN, MNIST_STD, synthetic_images
from trainer.determinism import seed_rng
from trainer.failure import exit_without_teardown
from trainer.models import MODELS, build_model

TEST_BATCH_SIZE = 1000


class ReferenceImages(Dataset[tuple[torch.Tensor, int]]):
    """torchvision's MNIST / CIFAR10 __getitem__ with transforms.Compose([ToTensor(), Normalize(mean, std)])."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: tuple[float, ...],
                 std: tuple[float, ...]) -> None:  # fmt: skip
        # As torchvision keeps them: MNIST (N, H, W) uint8, CIFAR-10 (N, H, W, C) uint8.
        self.images = images[:, 0].numpy() if images.shape[1] == 1 else images.permute(0, 2, 3, 1).numpy()
        self.labels = labels
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, target = self.images[index], int(self.labels[index])
        pil = Image.fromarray(image, mode="L" if image.ndim == 2 else "RGB")
        # transforms.ToTensor for an 8-bit PIL image
        array = np.array(pil, np.uint8, copy=True)
        tensor = torch.from_numpy(array).view(pil.size[1], pil.size[0], len(pil.getbands()))
        tensor = tensor.permute(2, 0, 1).contiguous().to(torch.float32).div(255)
        # transforms.Normalize
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return tensor.sub_(mean).div_(std), target


def reference_train(model: nn.Module, dataset: ReferenceImages, *, epochs: int, batch_size: int, lr: float,
                    seed: int, device: torch.device, rank: int = 0, world_size: int = 1) -> list[float]:  # fmt: skip
    """Train `model` (DDP-wrapped when world_size > 1) as the write-ups do; returns each epoch's seconds."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    gpu = device.type == "cuda"
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
    )
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=int(gpu), pin_memory=gpu,
                        generator=torch.Generator())  # fmt: skip
    seconds = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        start = time.perf_counter()
        total_loss, correct = 0.0, 0
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            output = model(images)
            loss = F.nll_loss(output, labels)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            correct += output.argmax(dim=1).eq(labels).sum().item()
        seconds.append(time.perf_counter() - start)
    return seconds


def reference_accuracy(model: nn.Module, dataset: ReferenceImages, device: torch.device) -> float:
    """Validation accuracy over the whole test set (on rank 0, as the write-ups validate)."""
    gpu = device.type == "cuda"
    loader = DataLoader(dataset, batch_size=TEST_BATCH_SIZE, num_workers=int(gpu), pin_memory=gpu)
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            correct += model(images).argmax(dim=1).eq(labels).sum().item()
    return correct / len(dataset)


def main(argv: list[str] | None = None) -> None:
    """Train on the synthetic MNIST-shaped set alone or under torchrun; rank 0 writes OUT/final_model.pt."""
    p = argparse.ArgumentParser(prog="python -m trainer.reference_loop", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="mnist-cnn")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-train-size", type=int, default=16384)
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else None
    device = device or torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    images, labels = synthetic_images(args.synthetic_train_size, args.seed, split=0)
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as our trainer makes them
    model = build_model(args.model, (1, 28, 28)).to(device)
    seed_rng(args.seed, rank)  # and the same dropout stream per rank
    trained = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world_size > 1 else model  # fmt: skip
    reference_train(trained, ReferenceImages(images, labels, MNIST_MEAN, MNIST_STD), epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, seed=args.seed, device=device, rank=rank,
                    world_size=world_size)  # fmt: skip
    if rank == 0:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out_dir / "final_model.pt")
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
        # Then out as our trainer leaves (trainer/__main__.py's leave_cleanly): past the interpreter's teardown,
        # where gloo's threads can still abort a rank that trained to its end ("terminate called without an
        # active exception", SIGABRT), as a two-process run of this loop did once under load.
        exit_without_teardown(0)


if __name__ == "__main__":
    main()
