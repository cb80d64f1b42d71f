"""How many bytes one step's gradient all-reduce carries, per model and data set (float32 parameters x 4): the
largest message `doctor --bandwidth` measures, and what a run's network has to carry each step.

Counted from the trainer's models (trainer/models.py) on each data set's image shape; tests/test_bandwidth_units.py
checks the table against the models themselves wherever they can be built."""

from __future__ import annotations

# (model, image channels) -> bytes. MNIST and the synthetic set are 1x28x28, CIFAR-10 3x32x32. resnet18 is
# torchvision's with 10 classes (11,181,642 parameters), whatever the image size (its pool is adaptive).
GRADIENT_BYTES = {
    ("mnist-cnn", "mnist"): 87_360,
    ("mnist-cnn", "synthetic"): 87_360,
    ("mnist-cnn", "cifar10"): 125_360,
    ("mnist-cnn-small", "mnist"): 49_736,
    ("mnist-cnn-small", "synthetic"): 49_736,
    ("mnist-cnn-small", "cifar10"): 51_336,
    ("resnet18", "mnist"): 44_726_568,
    ("resnet18", "synthetic"): 44_726_568,
    ("resnet18", "cifar10"): 44_726_568,
}
DEFAULT_MODEL = "mnist-cnn"


def gradient_bytes(model: str, dataset: str) -> int:
    """The model's gradient in bytes on `dataset`; an unknown pair gets the default model's on MNIST."""
    return GRADIENT_BYTES.get((model, dataset), GRADIENT_BYTES[(DEFAULT_MODEL, "mnist")])
