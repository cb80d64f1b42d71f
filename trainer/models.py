"""The models the trainer knows: the reference write-ups' MNIST CNN, write-up 5's smaller CNN, and
torchvision's ResNet-18; and for each, its split into two consecutive stages (model parallel: `mp`, `ddp-mp`).

All end in log_softmax, so the loss is nll_loss for any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.errors import TrainerError

MODELS = ("mnist-cnn", "mnist-cnn-small", "resnet18")


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
        return self.head(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 1 of the model-parallel split: the convolutions."""
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 2 of the split: the linear layers."""
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


# --- write-up 5's model and every model's two-stage split (issue 14) ----------------------------------------


class SmallMnistCnn(nn.Module):
    """Write-up 5's CNN: conv 1->8 k5, conv 8->16 k5, Dropout2d(0.2), fc 64->120, fc 120->10 (12,434 weights).

    The write-up gives the layer sizes, not the pooling; fc1 taking 64 = 16 x 2 x 2 features means a 2x2 map
    after conv2, so 28x28 goes conv 24 -> max-pool 3 -> 8 -> conv 4 -> max-pool 2 -> 2.
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.conv2_drop = nn.Dropout2d(0.2)
        side = ((image_size - 4) // 3 - 4) // 2
        self.flat_features = 16 * side * side  # 64 for 28x28 MNIST
        self.fc1 = nn.Linear(self.flat_features, 120)
        self.fc2 = nn.Linear(120, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 1 of the split: the convolutions."""
        x = F.relu(F.max_pool2d(self.conv1(x), 3))
        return F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 2 of the split: the linear layers."""
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


class _Stage(nn.Module):
    """One stage of a split model: a bound method of the model plus the submodules it uses (for .to())."""

    run: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        object.__setattr__(self, "run", run)  # a plain attribute: the model is not registered twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)


def two_stages(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """`model` as two consecutive stages sharing its parameters: stage2(stage1(x)) computes model(x) exactly.

    mnist-cnn models split between the convolutions and the linear layers, resnet18 after layer2.
    """
    if isinstance(model, MnistCnn | SmallMnistCnn):
        return (_Stage(model.features, [model.conv1, model.conv2, model.conv2_drop]),
                _Stage(model.head, [model.fc1, model.fc2]))  # fmt: skip
    if isinstance(model, nn.Sequential) and len(model) == 3 and isinstance(model[0], RepeatChannels):
        net: Any = model[1]  # torchvision's ResNet: its forward is these modules in this order
        first = nn.Sequential(model[0], net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2)
        second = nn.Sequential(net.layer3, net.layer4, net.avgpool, nn.Flatten(1), net.fc, model[2])
        return first, second
    raise TrainerError(f"no two-stage split is declared for {type(model).__name__}")


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
    if name == "mnist-cnn-small":
        if height != width or height < 22:
            raise TrainerError(f"mnist-cnn-small needs square images of at least 22x22, got {height}x{width}")
        return SmallMnistCnn(channels, height, num_classes)
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
