"""Which files each real data set needs, so the launcher can refuse a missing data set before anything starts.

The trainer reads these files (trainer/data.py); this module only knows their names, without torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from launcher.errors import SpecError

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


def _mnist_present(root: Path) -> bool:
    for folder in (root / "MNIST" / "raw", root):
        if all((folder / n).is_file() or (folder / f"{n}.gz").is_file() for n in MNIST_FILES):
            return True
    return False


def _cifar10_present(root: Path) -> bool:
    return any(all((folder / n).is_file() for n in CIFAR10_FILES) for folder in (root / "cifar-10-batches-py", root))


def check_local_data(dataset: str, data_dir: str | None) -> None:
    """Raise SpecError naming the folder and files when a real data set is absent and cannot be downloaded."""
    if dataset == "synthetic":
        return
    root = Path(data_dir or "data")
    present = _mnist_present(root) if dataset == "mnist" else _cifar10_present(root)
    if present or importlib.util.find_spec("torchvision") is not None:
        return
    if dataset == "mnist":
        expected = f"{root}/MNIST/raw/{{{','.join(MNIST_FILES)}}}[.gz]"
    else:
        expected = f"{root}/cifar-10-batches-py/{{{','.join(CIFAR10_FILES)}}}"
    raise SpecError(f"data set {dataset} not found: expected {expected} (no torchvision here to download it); "
                    "pass --data-dir or use --dataset synthetic")
