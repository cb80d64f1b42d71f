"""Reference loop vs our trainer, one process, same synthetic data, model init, dropout stream, data order (both
DistributedSampler(shuffle=True, seed)), batch, lr and epochs, side by side in one run.

(a) The reference write-ups' loop (trainer/reference_loop.py): a per-item Dataset that turns each image into a
    PIL image, then ToTensor + Normalize, a DataLoader over DistributedSampler (on a GPU: pin_memory, one worker),
    `.to(device)` per batch, `loss.item()` and an accuracy `.item()` every step.
(b) trainer.Trainer._run_epoch: the data set resident on the device, index_select batches, metrics summed on
    the device and read once per epoch; on CUDA the whole step replayed as a CUDA Graph.

Models: mnist-cnn on MNIST-shaped data (the write-ups' MNIST setting), resnet18 on CIFAR-shaped data (write-up 4;
torchvision needed). `--model both` runs the two comparisons one after the other.

    python bench/bench_trainer.py [--model mnist-cnn|resnet18|both --epochs 4 --train-size 16384 --test-size 8192
                                   --seed 0 --threads 1 --device auto|cpu|cuda --precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from trainer.data import CIFAR_MEAN, CIFAR_STD, MNIST_MEAN, MNIST_STD, DataSplits, normalise, synthetic_images
from trainer.determinism import choose_algorithms, seed_rng
from trainer.distributed import DistContext, cpu_model
from trainer.models import build_model
from trainer.reference_loop import ReferenceImages, reference_accuracy, reference_train
from trainer.trainer import PRECISIONS, TrainConfig, Trainer

Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def cifar_shaped(n: int, seed: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n uint8 images (n, 3, 32, 32): the synthetic MNIST-shaped set padded to 32x32, tinted by class."""
    images, labels = synthetic_images(n, seed, split)
    tints = 0.4 + 0.6 * torch.rand(10, 3, 1, 1, generator=torch.Generator().manual_seed(seed * 31 + 5))
    padded = torch.nn.functional.pad(images.float(), (2, 2, 2, 2))
    return (padded * tints[labels]).round().to(torch.uint8), labels


def image_shape(images: torch.Tensor) -> tuple[int, int, int]:
    c, h, w = images.shape[1:]
    return int(c), int(h), int(w)


def reference_run(model_name: str, data: Data, stats: tuple[tuple[float, ...], tuple[float, ...]], epochs: int,
                  batch: int, lr: float, seed: int, device: torch.device) -> dict[str, Any]:  # fmt: skip
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    model = build_model(model_name, image_shape(train_x)).to(device)
    seed_rng(seed, 0)
    seconds = reference_train(model, ReferenceImages(train_x, train_y, *stats), epochs=epochs, batch_size=batch,
                              lr=lr, seed=seed, device=device)  # fmt: skip
    val_acc = reference_accuracy(model, ReferenceImages(test_x, test_y, *stats), device)
    return {"samples_per_s": epochs * len(train_y) / sum(seconds), "seconds": sum(seconds), "val_acc": val_acc,
            "epoch_seconds": seconds}  # fmt: skip


def trainer_run(model_name: str, data: Data, stats: tuple[tuple[float, ...], tuple[float, ...]], epochs: int,
                batch: int, lr: float, seed: int, device: torch.device, precision: str,
                cudnn_benchmark: str) -> dict[str, Any]:  # fmt: skip
    train_x, train_y, test_x, test_y = data
    splits = DataSplits(normalise(train_x, *stats), train_y, normalise(test_x, *stats), test_y)
    benchmark_before = torch.backends.cudnn.benchmark
    choose_algorithms(deterministic=False)  # as `python -m trainer` does by default
    if cudnn_benchmark != "auto":
        torch.backends.cudnn.benchmark = cudnn_benchmark == "on"
    torch.manual_seed(seed)
    model = build_model(model_name, splits.image_shape)
    seed_rng(seed, 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ctx = DistContext(0, 0, 1, 1, 1, 0, device, None)
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(model=model_name, epochs=epochs, batch_size=batch, lr=lr, seed=seed, out_dir=Path(out),
                             precision=precision)  # fmt: skip
        trainer = Trainer(config, ctx, splits, model)
        seconds = [trainer._run_epoch(epoch).seconds for epoch in range(1, epochs + 1)]
        _, val_acc = trainer._evaluate()
        capture = trainer.graphed.capture_seconds if trainer.graphed is not None else 0.0
    torch.backends.cudnn.benchmark = benchmark_before
    return {"samples_per_s": epochs * len(train_y) / sum(seconds), "seconds": sum(seconds), "val_acc": val_acc,
            "epoch_seconds": seconds, "capture_seconds": capture}  # fmt: skip


def compare(model_name: str, args: argparse.Namespace, device: torch.device) -> None:
    if model_name == "resnet18":
        make, stats, shape = cifar_shaped, (CIFAR_MEAN, CIFAR_STD), "CIFAR-shaped (3x32x32)"
    else:
        make, stats, shape = synthetic_images, (MNIST_MEAN, MNIST_STD), "MNIST-shaped (1x28x28)"
    train_x, train_y = make(args.train_size, args.seed, 0)
    test_x, test_y = make(args.test_size, args.seed, 1)
    data = (train_x, train_y, test_x, test_y)
    print(f"\n{model_name} on synthetic {shape} data: {args.train_size} train / {args.test_size} test, "
          f"batch {args.batch_size}, lr {args.lr}, {args.epochs} epochs, seed {args.seed}, world size 1, "
          f"our precision {args.precision}", flush=True)  # fmt: skip
    common = (model_name, data, stats, args.epochs, args.batch_size, args.lr, args.seed, device)
    reference = reference_run(*common)
    ours = trainer_run(*common, args.precision, args.cudnn_benchmark)
    print(f"{'':28}{'samples/s':>12}{'train s':>10}{'val acc':>10}   epoch seconds")
    for name, r in (("reference loop (DataLoader)", reference), ("ddpctl trainer", ours)):
        epochs = " ".join(f"{s:.3f}" for s in r["epoch_seconds"])
        print(f"{name:28}{r['samples_per_s']:12.0f}{r['seconds']:10.2f}{100 * r['val_acc']:9.2f}%   {epochs}")
    speedup = ours["samples_per_s"] / reference["samples_per_s"]
    gap = 100 * (ours["val_acc"] - reference["val_acc"])
    print(f"speed-up: {speedup:.2f}x   accuracy difference: {gap:+.2f} points")
    if args.epochs > 1:  # the first epochs hold one-time costs: CUDA and cuDNN start-up, the step's capture
        later = sum(ours["epoch_seconds"][1:]) / sum(reference["epoch_seconds"][1:])
        steady = min(ours["epoch_seconds"])
        step_us = 1e6 * steady * args.batch_size / args.train_size
        capture = f"   ours, warm-up and capture: {ours['capture_seconds']:.2f} s (in epoch 1)"
        print(f"epochs 2-{args.epochs} alone: {1 / later:.2f}x   ours, fastest epoch: {args.train_size / steady:.0f} "
              f"samples/s ({step_us:.0f} us/step){capture if device.type == 'cuda' else ''}", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("mnist-cnn", "resnet18", "both"), default="mnist-cnn")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-size", type=int, default=16384)
    p.add_argument("--test-size", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: as torchrun sets per process)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda where available")
    p.add_argument("--cudnn-benchmark", choices=("auto", "on", "off"), default="auto",
                   help="our trainer's cuDNN algorithm search (auto: as python -m trainer sets it, off)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="our trainer's (the reference: fp32)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is available")
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), python {platform.python_version()}")  # fmt: skip
    print(f"device: {torch.cuda.get_device_name(device) if use_cuda else 'cpu'}")
    for model_name in ("mnist-cnn", "resnet18") if args.model == "both" else (args.model,):
        compare(model_name, args, device)


if __name__ == "__main__":
    main()
