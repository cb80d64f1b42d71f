"""The models the trainer knows: the reference write-ups' MNIST CNN, and torchvision's ResNet-18.

Both end in log_softmax, so the loss is nll_loss for either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.errors import TrainerError

MODELS = ("mnist-cnn", "resnet18")


class MnistCnn(nn.Module):
    """pytorch/examples' MNIST network: two 5x5 convolutions, dropout, two linear layers, log_softmax."""

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        side = ((image_size - 4) // 2 - 4) // 2
        self.flat_features = 20 * side * side  # 320 for 28x28 MNIST
        self.fc1 = nn.Linear(self.flat_features, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class RepeatChannels(nn.Module):
    """Feeds 1-channel (MNIST-shaped) images to a 3-channel network by repeating the channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.expand(-1, self.channels, -1, -1) if x.shape[1] == 1 else x


def build_model(name: str, image_shape: tuple[int, int, int], num_classes: int = 10) -> nn.Module:
    """A freshly initialised model (from torch's current RNG state) for images of `image_shape` (C, H, W)."""
    channels, height, width = image_shape
    if name == "mnist-cnn":
        if height != width or height < 16:
            raise TrainerError(f"mnist-cnn needs square images of at least 16x16, got {height}x{width}")
        return MnistCnn(channels, height, num_classes)
    if name == "resnet18":
        try:
            from torchvision.models import resnet18  # noqa: PLC0415 - optional, imported only when asked for
        except Exception as exc:  # a torchvision built for another torch raises RuntimeError
            raise TrainerError(
                f"--model resnet18 needs torchvision, which cannot be imported here ({exc}); "
                "install the torchvision matching this torch, or use --model mnist-cnn"
            ) from None
        # ResNet's adaptive average pool takes 28x28 as well as 32x32; 1-channel images are repeated to 3.
        return nn.Sequential(RepeatChannels(3), resnet18(num_classes=num_classes), nn.LogSoftmax(dim=1))
    raise TrainerError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
