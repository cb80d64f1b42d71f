"""Which torch build set-up installs, and from where (stdlib only: it runs before anything is installed).

The public package index serves torch for Linux x86_64 as the CUDA build (several GB with cuDNN, NCCL, cuBLAS,
triton), whatever the machine. So a CPU-only machine gets the CPU build from PyTorch's own CPU index, the one
PyTorch's install selector gives; a machine with an NVIDIA driver gets the newest CUDA build that driver can run
(the CUDA version `nvidia-smi` reports is the newest the driver supports). Where PyTorch's index does not answer,
plain pip resolution decides (a local wheel folder, a mirror, or the public index).

    python3 infra/torch_choice.py [--torch auto|cpu|cuda] [--version 2.13.0]

prints three lines for infra/setup.sh: the requirement, the index URL (empty: pip's own configuration), and the
one line that says which build and why. `DDPCTL_TORCH_VERSION` sets the version when --version is not given,
`DDPCTL_PYTORCH_INDEX` a mirror of PyTorch's index.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_VERSION = "2.13.0"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# CUDA builds PyTorch has published, newest first; the first the driver can run and the index has wins.
CUDA_TAGS = ("cu130", "cu129", "cu128", "cu126", "cu124", "cu121", "cu118")
PROBE_TIMEOUT_S = 8.0


@dataclass(frozen=True)
class Driver:
    """An NVIDIA driver on this machine; `cuda` is the newest CUDA it runs, None when nvidia-smi did not say."""

    cuda: tuple[int, int] | None


@dataclass(frozen=True)
class TorchChoice:
    """What to pip-install: `requirement`, from `index_url` (None: pip's own configuration), and why."""

    requirement: str
    index_url: str | None
    reason: str


# (index URL, version with its local tag) -> True: the index has a wheel of it for this python and platform,
# False: it answered without one, None: it did not answer.
IndexProbe = Callable[[str, str], "bool | None"]


def cuda_tag_version(tag: str) -> tuple[int, int]:
    """"cu126" -> (12, 6); "cu130" -> (13, 0)."""
    digits = tag.removeprefix("cu")
    return int(digits[:-1]), int(digits[-1])


def parse_nvidia_smi(output: str) -> tuple[int, int] | None:
    """The "CUDA Version: 12.4" of nvidia-smi's header, or None."""
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def detect_driver() -> Driver | None:
    """The NVIDIA driver here, if any: nvidia-smi answers, or the kernel module is loaded."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is not None and proc.returncode == 0:
            return Driver(cuda=parse_nvidia_smi(proc.stdout))
    if os.path.exists("/proc/driver/nvidia/version"):
        return Driver(cuda=None)
    return None


def wheel_tags() -> tuple[str, str]:
    """This python's wheel tag ("cp311") and machine ("x86_64"), to look for the right file in an index."""
    return f"cp{sys.version_info.major}{sys.version_info.minor}", platform.machine()


def probe_index(index_url: str, version: str, *, timeout: float = PROBE_TIMEOUT_S,
                python_tag: str | None = None) -> bool | None:
    """Whether the simple index at `index_url` has torch `version` for this python (or `python_tag`, "cp311") on
    Linux and this machine (None: no answer)."""
    own_tag, machine = wheel_tags()
    python_tag = python_tag or own_tag
    wanted = re.compile(re.escape(f"torch-{version}-{python_tag}-{python_tag}-") + r"[^\"'<>]*linux[^\"'<>]*"
                        + re.escape(machine) + r"\.whl")
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/torch/", timeout=timeout) as response:  # noqa: S310
            page = response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return False if e.code == 404 else None
    except (OSError, ValueError):
        return None
    # Local versions are URL-quoted in links ("2.13.0%2Bcpu").
    return bool(wanted.search(page.replace("%2B", "+").replace("%2b", "+")))


def choose(requested: str, version: str, driver: Driver | None, probe: IndexProbe,
           *, index_root: str = PYTORCH_INDEX) -> TorchChoice:
    """The build to install: `requested` is "auto", "cpu" or "cuda"; `probe` asks PyTorch's index."""
    base, _, named_tag = version.partition("+")
    if named_tag:  # the version names its build ("2.13.0+cu126"): that build, from that build's index
        index = f"{index_root}/{named_tag}"
        if probe(index, version):
            return TorchChoice(f"torch=={version}", index, f"DDPCTL_TORCH_VERSION names it, from {index}")
        return TorchChoice(f"torch=={version}", None, f"DDPCTL_TORCH_VERSION names it; PyTorch's index {index} "
                                                      "did not offer it, so pip's own configuration must")
    if requested == "cpu" or (requested == "auto" and driver is None):
        why = "--torch cpu" if requested == "cpu" else "no NVIDIA driver here"
        index = f"{index_root}/cpu"
        found = probe(index, f"{base}+cpu")
        if found:
            return TorchChoice(f"torch=={base}+cpu", index, f"the CPU build ({why}), from PyTorch's CPU index {index}")
        status = "did not answer" if found is None else f"has no torch {base}+cpu for this python"
        return _pip_resolves(base, f"{why}, but PyTorch's CPU index {index} {status}")
    if requested == "auto" and driver is not None and driver.cuda is None:
        return _pip_resolves(base, "an NVIDIA driver is loaded but nvidia-smi did not report its CUDA version")
    why = "--torch cuda" if requested == "cuda" else "an NVIDIA driver"
    runnable = list(CUDA_TAGS)
    if driver is not None and driver.cuda is not None:
        why += f" for CUDA {driver.cuda[0]}.{driver.cuda[1]}"
        runnable = [t for t in CUDA_TAGS if cuda_tag_version(t) <= driver.cuda]
    for tag in runnable:
        index = f"{index_root}/{tag}"
        found = probe(index, f"{base}+{tag}")
        if found is None:
            return _pip_resolves(base, f"{why}, but PyTorch's index {index_root} did not answer")
        if found:
            major, minor = cuda_tag_version(tag)
            return TorchChoice(f"torch=={base}+{tag}", index, f"the CUDA {major}.{minor} build ({why}), from {index}")
    return _pip_resolves(base, f"{why}, but PyTorch's index has torch {base} in none of the CUDA builds that "
                               f"driver runs ({', '.join(runnable) or 'none known'}); it may need a newer driver")


def _pip_resolves(base: str, why: str) -> TorchChoice:
    return TorchChoice(f"torch=={base}", None, f"{why}: torch=={base} as pip resolves it (a local wheel folder "
                                               "or mirror decides; the public index serves the CUDA build)")


def main(argv: list[str] | None = None) -> int:
    """Print the requirement, the index URL (or an empty line) and the reason, one per line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--version", default=os.environ.get("DDPCTL_TORCH_VERSION") or DEFAULT_VERSION)
    parser.add_argument("--index-root", default=os.environ.get("DDPCTL_PYTORCH_INDEX") or PYTORCH_INDEX,
                        help="PyTorch's wheel index or a mirror of it (DDPCTL_PYTORCH_INDEX)")
    parser.add_argument("--python-tag", help="choose for another python than this one, e.g. cp311 (an image's)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d+(\.\d+){1,2}(\+(cpu|cu\d{3}))?", args.version):
        print(f"torch version {args.version!r} (DDPCTL_TORCH_VERSION or --version) is not like 2.13.0 or "
              "2.13.0+cpu: set a release number", file=sys.stderr)
        return 2
    driver = None if args.torch == "cpu" else detect_driver()
    def probe(index_url: str, version: str) -> bool | None:
        return probe_index(index_url, version, python_tag=args.python_tag)

    choice = choose(args.torch, args.version, driver, probe, index_root=args.index_root.rstrip("/"))
    print(choice.requirement, choice.index_url or "", choice.reason, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
