"""What a Vast.ai machine must have to run ddpctl's image: a driver for its CUDA, a GPU its torch has kernels
for, enough GPU memory, and a contract that lasts the run. The image's labels record the same rule (Dockerfile:
org.ddpctl.cuda, org.ddpctl.cuda_min_driver, org.ddpctl.cuda_min, org.ddpctl.compute_caps) and are what a run
applies: image_labels reads them (or a foreign image's NVIDIA environment) from the image at run time. The
constants below are the fallback when the image cannot be read; a test parses the Dockerfile's labels to them.

The CUDA floor. The image is built for CUDA 12.8 (torch's cu128 wheel bundles the 12.8 runtime). NVIDIA's CUDA
minor-version compatibility lets an application built with any CUDA 12.x toolkit run on any 12.x driver, i.e.
driver >= 525.60.13 (Vast: cuda_max_good >= 12.0), provided it needs no PTX JIT of newer PTX: the wheel must carry
SASS for the GPU's architecture. So the floor is 12.0, not 12.8 (the strictest reading, driver >= 570, which
would shut out many RTX 3080 hosts), *and* the GPU's compute capability must be one the wheel has SASS for.

The architectures. `torch.cuda.get_arch_list()` measured on torch 2.11.0+cu130 (the GPU machine, H100):
['sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100', 'sm_120']; PyTorch's cu128 wheels ship the same list (sm_70 was
dropped from the 12.8+ builds). The base image's own cu128 build could not be inspected here (no registry), so
the list is the one measured, which is the safe side: a V100 (sm_70) is not rented.
SASS built for sm_XY runs on sm_XZ with Z >= Y (same major), so 8.6 SASS serves 8.9 (RTX 4090, L40) and 8.0
serves 8.6/8.7/8.9; a different major never runs it (11.0, 10.x on 12.0 code)."""

from __future__ import annotations

from dataclasses import dataclass

# The Dockerfile's labels, parsed (tests/test_image_labels.py): assumed when the image cannot be read.
IMAGE_CUDA = "12.8"
CUDA_MIN_DRIVER = "525.60.13"  # the first 12.x driver: minor-version compatibility's floor
CUDA_MIN = 12.0  # Vast's cuda_max_good for that driver
TORCH_ARCHES = (75, 80, 86, 90, 100, 120)  # compute capability x 10, from get_arch_list() above

# Every compute capability NVIDIA has shipped (x 10): the ones the image serves are sent to Vast as an `in` list.
KNOWN_CAPS = (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)

# GPU memory a model's training needs (MB, with batch size up to the presets' and room for the CUDA context);
# models not listed: unknown, no filter.
GPU_RAM_MB = {"mnist-cnn": 2048, "mnist-cnn-small": 2048, "resnet18": 4096}

DEFAULT_EXPECTED_HOURS = 1.0  # when the user does not say how long the run takes
CONTRACT_MARGIN = 1.25  # the expected duration is a guess: keep a quarter on top
CONTRACT_SLACK_S = 1800.0  # renting, the image pull, the final pull and teardown


def runs_on_cap(cap10: int, arches: tuple[int, ...] = TORCH_ARCHES) -> bool:
    """Whether a GPU of compute capability `cap10` (x 10) runs SASS built for one of `arches` (same major,
    minor at least the build's)."""
    return any(cap10 // 10 == arch // 10 and cap10 >= arch for arch in arches)


def supported_caps(arches: tuple[int, ...] = TORCH_ARCHES) -> tuple[int, ...]:
    """The known compute capabilities (x 10) that `arches` serve."""
    return tuple(cap for cap in KNOWN_CAPS if runs_on_cap(cap, arches))


def contract_seconds_needed(expected_hours: float | None) -> float:
    """How long an offer's contract must still last for a run expected to take `expected_hours`."""
    hours = DEFAULT_EXPECTED_HOURS if expected_hours is None else expected_hours
    return hours * 3600 * CONTRACT_MARGIN + CONTRACT_SLACK_S


@dataclass(frozen=True)
class MachineNeeds:
    """What an offer's machine must have (None: no requirement)."""

    min_cuda: float | None = CUDA_MIN
    arches: tuple[int, ...] | None = TORCH_ARCHES
    min_gpu_ram_mb: float | None = None
    min_contract_s: float | None = None

    @classmethod
    def for_run(cls, model: str | None, expected_hours: float | None) -> MachineNeeds:
        """The needs of ddpctl's image running `model` for about `expected_hours`."""
        return cls(min_gpu_ram_mb=GPU_RAM_MB.get(model or ""),
                   min_contract_s=contract_seconds_needed(expected_hours))
