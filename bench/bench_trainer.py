"""Reference loop vs our trainer's epoch loop, one process, same synthetic data, model init, batch and epochs.

(a) The reference write-ups' loop (pytorch/examples mnist, the DDP tutorial series): a per-item Dataset
    that turns each image into a PIL image, then ToTensor + Normalize (rendered here without torchvision,
    which has no CPU build on our machines), a DataLoader (batch 32, shuffle), and `loss.item()` plus an
    accuracy `.item()` every step.
(b) trainer.Trainer._run_epoch: pre-normalised tensors, index_select batches, metrics summed on the device
    and read once per epoch.

On a GPU (`--device cuda`, the default where CUDA is available) the reference loop moves each batch to the
GPU as the write-ups do (DataLoader with pin_memory and one worker, as pytorch/examples' mnist sets them).

    python bench/bench_trainer.py [--epochs 4 --train-size 16384 --test-size 8192 --seed 0 --threads 1
                                   --device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from trainer.data import MNIST_MEAN, MNIST_STD, DataSplits, normalise, synthetic_images
from trainer.distributed import DistContext, cpu_model
from trainer.models import MnistCnn
from trainer.trainer import TrainConfig, Trainer


class ReferenceMnist(Dataset[tuple[torch.Tensor, int]]):
    """torchvision.datasets.MNIST's __getitem__ with transforms.Compose([ToTensor(), Normalize(...)])."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images[:, 0]  # (N, 28, 28) uint8, as torchvision keeps MNIST
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, target = self.images[index], int(self.labels[index])
        pil = Image.fromarray(image.numpy(), mode="L")
        # transforms.ToTensor for an 8-bit PIL image
        tensor = torch.from_numpy(np.array(pil, np.uint8, copy=True)).view(pil.size[1], pil.size[0], 1)
        tensor = tensor.permute(2, 0, 1).contiguous().to(torch.float32).div(255)
        # transforms.Normalize
        mean = torch.as_tensor(MNIST_MEAN, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(MNIST_STD, dtype=tensor.dtype).view(-1, 1, 1)
        return tensor.sub_(mean).div_(std), target


def reference_run(data: tuple[torch.Tensor, ...], epochs: int, batch: int, lr: float, seed: int,
                  device: torch.device) -> dict[str, float]:
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    model = MnistCnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    gpu = device.type == "cuda"
    train_loader = DataLoader(ReferenceMnist(train_x, train_y), batch_size=batch, shuffle=True,
                              num_workers=int(gpu), pin_memory=gpu)
    test_loader = DataLoader(ReferenceMnist(test_x, test_y), batch_size=1000, num_workers=int(gpu), pin_memory=gpu)
    samples, seconds = 0, 0.0
    for _ in range(epochs):
        model.train()
        start = time.perf_counter()
        total_loss, correct = 0.0, 0
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            output = model(images)
            loss = F.nll_loss(output, labels)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            correct += output.argmax(dim=1).eq(labels).sum().item()
        seconds += time.perf_counter() - start
        samples += len(train_y)
    model.eval()
    test_correct = 0
    with torch.no_grad():
        for images, labels in test_loader:
            images, labels = images.to(device), labels.to(device)
            test_correct += model(images).argmax(dim=1).eq(labels).sum().item()
    return {"samples_per_s": samples / seconds, "seconds": seconds, "val_acc": test_correct / len(test_y)}


def trainer_run(data: tuple[torch.Tensor, ...], epochs: int, batch: int, lr: float, seed: int,
                device: torch.device) -> dict[str, float]:
    train_x, train_y, test_x, test_y = data
    splits = DataSplits(
        normalise(train_x, MNIST_MEAN, MNIST_STD), train_y, normalise(test_x, MNIST_MEAN, MNIST_STD), test_y
    )
    torch.manual_seed(seed)
    model = MnistCnn()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ctx = DistContext(0, 0, 1, 1, 1, 0, device, None)
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(epochs=epochs, batch_size=batch, lr=lr, seed=seed, out_dir=Path(out))
        trainer = Trainer(config, ctx, splits, model)
        samples, seconds = 0, 0.0
        for epoch in range(1, epochs + 1):
            result = trainer._run_epoch(epoch)
            samples += result.samples
            seconds += result.seconds
        _, val_acc = trainer._evaluate()
    return {"samples_per_s": samples / seconds, "seconds": seconds, "val_acc": val_acc}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-size", type=int, default=16384)
    p.add_argument("--test-size", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: as torchrun sets per process)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda where available")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is available")
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")

    train_x, train_y = synthetic_images(args.train_size, args.seed, split=0)
    test_x, test_y = synthetic_images(args.test_size, args.seed, split=1)
    data = (train_x, train_y, test_x, test_y)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), python {platform.python_version()}")  # fmt: skip
    print(f"device: {torch.cuda.get_device_name(device) if use_cuda else 'cpu'}")
    print(f"synthetic MNIST-shaped data: {args.train_size} train / {args.test_size} test, mnist-cnn, "
          f"batch {args.batch_size}, lr {args.lr}, {args.epochs} epochs, seed {args.seed}, world size 1")  # fmt: skip
    reference = reference_run(data, args.epochs, args.batch_size, args.lr, args.seed, device)
    ours = trainer_run(data, args.epochs, args.batch_size, args.lr, args.seed, device)
    print(f"{'':28}{'samples/s':>12}{'train s':>10}{'val acc':>10}")
    for name, r in (("reference loop (DataLoader)", reference), ("ddpctl trainer", ours)):
        print(f"{name:28}{r['samples_per_s']:12.0f}{r['seconds']:10.2f}{100 * r['val_acc']:9.2f}%")
    speedup = ours["samples_per_s"] / reference["samples_per_s"]
    gap = 100 * (ours["val_acc"] - reference["val_acc"])
    print(f"speed-up: {speedup:.2f}x   accuracy difference: {gap:+.2f} points")


if __name__ == "__main__":
    main()
