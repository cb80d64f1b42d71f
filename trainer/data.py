"""Data sets read by our own code straight into tensors, once: MNIST IDX files, CIFAR-10 pickle batches and
a deterministic synthetic MNIST-shaped set. Images come out normalised float32 (N, C, H, W), labels int64.

When MNIST or CIFAR-10 files are missing, torchvision (if importable) downloads them into --data-dir.
"""

from __future__ import annotations

import gzip
import math
import pickle  # noqa: S403 - CIFAR-10 ships as pickles; _NumpyOnlyUnpickler admits only array classes
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainer.errors import DataError

# Normalisation as the reference write-ups use it.
MNIST_MEAN: tuple[float, ...] = (0.1307,)
MNIST_STD: tuple[float, ...] = (0.3081,)
CIFAR_MEAN: tuple[float, ...] = (0.5, 0.5, 0.5)
CIFAR_STD: tuple[float, ...] = (0.5, 0.5, 0.5)

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = ("test_batch",)

# IDX type codes -> big-endian numpy types.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True)
class DataSplits:
    """Train and test tensors; images normalised float32 (N, C, H, W), labels int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    def to(self, device: torch.device) -> DataSplits:
        return DataSplits(*(t.to(device) for t in (self.train_x, self.train_y, self.test_x, self.test_y)))

    def channels_last(self) -> DataSplits:
        """The same images stored channels-last (N, H, W, C in memory), which CPU kernels run faster on."""
        cl = torch.channels_last
        return DataSplits(self.train_x.contiguous(memory_format=cl), self.train_y,
                          self.test_x.contiguous(memory_format=cl), self.test_y)  # fmt: skip

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train_x.shape[1:]
        return int(c), int(h), int(w)


def load_dataset(
    name: str, data_dir: Path, *, seed: int = 0, synthetic_train_size: int = 0, synthetic_test_size: int = 0
) -> DataSplits:
    """Read (or make) the whole data set `name` into normalised tensors."""
    if name == "synthetic":
        train_x, train_y = synthetic_images(synthetic_train_size, seed, split=0)
        test_x, test_y = synthetic_images(synthetic_test_size, seed, split=1)
        mean, std = MNIST_MEAN, MNIST_STD
    elif name == "mnist":
        (train_x, train_y), (test_x, test_y) = read_mnist(data_dir)
        mean, std = MNIST_MEAN, MNIST_STD
    elif name == "cifar10":
        (train_x, train_y), (test_x, test_y) = read_cifar10(data_dir)
        mean, std = CIFAR_MEAN, CIFAR_STD
    else:
        raise DataError(f"unknown data set {name!r}: choose synthetic, mnist or cifar10")
    return DataSplits(normalise(train_x, mean, std), train_y, normalise(test_x, mean, std), test_y)


def normalise(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 (x/255 - mean) / std per channel, as ToTensor+Normalize do."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return ((images.to(torch.float32) / 255.0 - m) / s).contiguous()


# --- synthetic -----------------------------------------------------------------------------------------


def synthetic_images(n: int, seed: int, split: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n MNIST-shaped uint8 images (n, 1, 28, 28) of 10 classes, deterministic from (seed, split).

    Each class is a smooth random prototype; a sample is its prototype shifted by up to 3 pixels, with a
    random contrast and strong Gaussian noise, so a small CNN learns it well above chance but not at once.
    """
    prototypes = _prototypes(seed)
    gen = torch.Generator().manual_seed(seed * 1009 + 7 + split)
    labels = torch.randint(0, 10, (n,), generator=gen)
    images = prototypes[labels].clone()
    shifts = torch.randint(-3, 4, (n, 2), generator=gen)
    for dy in range(-3, 4):
        for dx in range(-3, 4):
            chosen = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero().flatten()
            if chosen.numel():
                images[chosen] = torch.roll(images[chosen], shifts=(dy, dx), dims=(2, 3))
    contrast = 0.5 + 0.5 * torch.rand(n, 1, 1, 1, generator=gen)
    noise = 0.4 * torch.randn(n, 1, 28, 28, generator=gen)
    pixels = (images * contrast + noise).clamp(0.0, 1.0)
    return (pixels * 255.0).round().to(torch.uint8), labels


def _prototypes(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1009 + 3)
    coarse = torch.rand(10, 1, 7, 7, generator=gen)
    smooth = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    # Stretch each prototype to 0..1, then keep only its brighter half: strokes on a dark ground, as in MNIST.
    low = smooth.amin(dim=(2, 3), keepdim=True)
    high = smooth.amax(dim=(2, 3), keepdim=True)
    return (((smooth - low) / (high - low) - 0.5) * 2.0).clamp(min=0.0)


# --- MNIST (IDX files) ---------------------------------------------------------------------------------


def read_idx(path: Path) -> torch.Tensor:
    """One IDX file (raw, or gzip-compressed when its name ends in .gz) as a tensor of its shape."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated (header)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    count = math.prod(dims)
    if len(raw) - header < count * dtype.itemsize:
        raise DataError(f"{path} is truncated: expected {count} values of shape {dims}")
    values = np.frombuffer(raw, dtype=dtype, count=count, offset=header).astype(dtype.newbyteorder("="))
    return torch.from_numpy(values.reshape(dims))


def read_mnist(data_dir: Path) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """MNIST train and test as uint8 images (N, 1, 28, 28) and int64 labels, downloading if it must."""
    names = [name for pair in MNIST_FILES.values() for name in pair]
    found = {name: _find_mnist_file(data_dir, name) for name in names}
    if any(path is None for path in found.values()):
        _download("MNIST", data_dir, names, f"{data_dir}/MNIST/raw or {data_dir}", "(or .gz)")
        found = {name: _find_mnist_file(data_dir, name) for name in names}
    splits = []
    for images_name, labels_name in MNIST_FILES.values():
        images_path, labels_path = found[images_name], found[labels_name]
        assert images_path is not None and labels_path is not None
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.dim() != 3 or labels.dim() != 1 or images.shape[0] != labels.shape[0]:
            raise DataError(f"{images_path} and {labels_path} do not hold matching images and labels")
        splits.append((images.to(torch.uint8).unsqueeze(1).contiguous(), labels.to(torch.int64)))
    return splits[0], splits[1]


def _find_mnist_file(data_dir: Path, name: str) -> Path | None:
    for folder in (data_dir / "MNIST" / "raw", data_dir):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


# --- CIFAR-10 (python pickle batches) ------------------------------------------------------------------


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles CIFAR-10 batches: plain containers and numpy arrays, nothing that could run code."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how Python 3's protocol-2 pickles spell bytes
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR-10 batch")


def read_cifar_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR-10 python batch as uint8 images (N, 3, 32, 32) and int64 labels."""
    try:
        with path.open("rb") as f:
            batch = _NumpyOnlyUnpickler(f, encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path} is not a CIFAR-10 python batch: {exc}") from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise DataError(f"{path} does not hold 3x32x32 images with one label each")
    return torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()), torch.from_numpy(labels.copy())


def read_cifar10(data_dir: Path) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """CIFAR-10 train (5 batches) and test as uint8 images and int64 labels, downloading if it must."""
    names = CIFAR_TRAIN + CIFAR_TEST
    folder = _find_cifar_folder(data_dir)
    if folder is None:
        _download("CIFAR10", data_dir, names, f"{data_dir}/{CIFAR_FOLDER} or {data_dir}", "")
        folder = _find_cifar_folder(data_dir)
        assert folder is not None
    splits = []
    for split in (CIFAR_TRAIN, CIFAR_TEST):
        parts = [read_cifar_batch(folder / name) for name in split]
        splits.append((torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])))
    return splits[0], splits[1]


def _find_cifar_folder(data_dir: Path) -> Path | None:
    for folder in (data_dir / CIFAR_FOLDER, data_dir):
        if all((folder / name).is_file() for name in CIFAR_TRAIN + CIFAR_TEST):
            return folder
    return None


def _download(dataset: str, data_dir: Path, names: tuple[str, ...] | list[str], where: str, note: str) -> None:
    missing = f"{dataset} files not found in {where}: expected {', '.join(names)} {note}".rstrip()
    try:
        import torchvision.datasets as tv_datasets  # noqa: PLC0415 - optional, and heavy
    except Exception as exc:  # torchvision built for another torch raises RuntimeError, not ImportError
        raise DataError(f"{missing}; put them there, or install torchvision to download them ({exc})") from None
    try:
        for train in (True, False):
            getattr(tv_datasets, dataset)(root=str(data_dir), train=train, download=True)
    except Exception as exc:
        raise DataError(f"{missing}; downloading them with torchvision failed: {exc}") from None
