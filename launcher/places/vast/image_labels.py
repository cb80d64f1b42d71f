"""What the image a run rents machines for needs of them (a CUDA floor, compute capabilities), read from the
image itself when `up --provider vast` / `offers --image` run, each result with one line saying where it came from:

1. the local Docker engine, when it holds the image (cheap, no network);
2. the image's registry (registry_api: manifest -> config blob), anonymously or with --registry-login's
   credentials;
3. else image_needs' constants (ddpctl's own image), said as an assumption with the reason.

From the image's configuration (`needs_from_config`, the one parser; tests parse the Dockerfile's labels with it):
- ddpctl's labels when they state a CUDA version: org.ddpctl.cuda_min (the driver floor) and
  org.ddpctl.compute_caps (x 10). org.ddpctl.cuda "none ..." is a CPU-only build; "unknown" (a custom base whose
  CUDA `ddpctl image build` was not told) leaves the default labels untrusted, so the environment decides.
- Otherwise NVIDIA's image environment. CUDA_VERSION=12.8.1 alone gives 12.0, as image_needs' docstring explains
  (minor-version compatibility: any 12.x driver runs a 12.x build). But NVIDIA_REQUIRE_CUDA="cuda>=12.8 ..." is
  checked by NVIDIA's container toolkit *before* the container starts (it refuses it with "unsatisfied condition:
  cuda>=12.8" on an older driver, unless NVIDIA_DISABLE_REQUIRE is set): minor-version compatibility never gets
  its chance, so that value is the floor, for our labels too. (Its `brand=...,driver>=470` alternatives are
  datacenter forward-compatibility drivers that Vast's offers do not describe: the safe reading ignores them.)
- Compute capabilities of a foreign image are unknown (its torch's get_arch_list() cannot be read from metadata):
  the known torch list (image_needs.TORCH_ARCHES) is kept, said as such. Renting a GPU the image has no kernels
  for costs a paid machine that falls back to CPU or fails ("no kernel image"); the list only shuts out sm_70 and
  older, which current CUDA 12.8+ torch builds no longer serve.
- No CUDA anywhere (no label, no CUDA_VERSION / NVIDIA_REQUIRE_CUDA): a CPU-only image, no driver or GPU filter.
  org.ddpctl.cuda "unknown" with no CUDA in the environment: not known, the constants.
  NVIDIA_VISIBLE_DEVICES without a version (pytorch/pytorch images set only that) is a GPU image of unknown CUDA:
  the constants, said as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from launcher.places.vast.image_needs import CUDA_MIN, TORCH_ARCHES, MachineNeeds
from launcher.places.vast.registry_api import RegistryError, read_image_config
from launcher.places.vast.registry_login import registry_credentials

LABEL_CUDA, LABEL_CUDA_MIN, LABEL_CAPS = "org.ddpctl.cuda", "org.ddpctl.cuda_min", "org.ddpctl.compute_caps"
ENGINE_TIMEOUT_S = 5.0
_VERSION = re.compile(r"^(\d+)\.(\d+)")
_REQUIRE = re.compile(r"(?:^|\s)cuda>=(\d+\.\d+)")


@dataclass(frozen=True)
class ImageNeeds:
    """What an image needs of a machine's GPU (None: nothing), where that was read, and the line that says so."""

    min_cuda: float | None
    arches: tuple[int, ...] | None
    source: str  # "local engine" | "registry" | "constants"
    note: str

    def applied_to(self, needs: MachineNeeds) -> MachineNeeds:
        """`needs` with this image's CUDA floor and compute capabilities instead of the constants."""
        return replace(needs, min_cuda=self.min_cuda, arches=self.arches)

    @property
    def summary(self) -> str:
        """'the image needs ... (source)': for an error that no offer matched."""
        where = "assumed: it could not be read" if self.source == "constants" else f"from the {self.source}"
        return f"the image needs {_describe(self.min_cuda, self.arches)} ({where}; `offers --explain --image` " \
               "shows each offer's reason)"

    def to_json(self) -> dict[str, Any]:
        """For run.json: the filter applied and where it came from."""
        return {"min_cuda": self.min_cuda, "compute_caps": list(self.arches) if self.arches is not None else None,
                "source": self.source, "note": self.note}


def _caps_text(arches: tuple[int, ...]) -> str:
    return ", ".join(f"{a / 10:.1f}" for a in arches)


def _describe(min_cuda: float | None, arches: tuple[int, ...] | None) -> str:
    if min_cuda is None and arches is None:
        return "no driver or GPU filter"
    return f"driver CUDA >= {min_cuda or 0:.1f}, compute capability {_caps_text(arches or ())}"


def _parse_caps(text: str | None) -> tuple[int, ...] | None:
    try:
        caps = tuple(int(c) for c in (text or "").replace(" ", "").split(",") if c)
    except ValueError:
        return None
    return caps if caps and all(10 <= c < 1000 for c in caps) else None


def _floor(text: str | None) -> float | None:
    match = _VERSION.match((text or "").strip())
    return float(f"{match[1]}.{match[2]}") if match else None


def needs_from_config(labels: dict[str, str], env: dict[str, str]) -> tuple[float | None, tuple[int, ...] | None,
                                                                               str] | None:
    """(CUDA floor, compute capabilities x 10, why) from an image's labels and environment; None when they
    name a GPU image without saying which CUDA (the caller assumes the constants)."""
    require = None if env.get("NVIDIA_DISABLE_REQUIRE", "").lower() in ("1", "true", "yes") else \
        _REQUIRE.search(env.get("NVIDIA_REQUIRE_CUDA", ""))
    gate = float(require[1]) if require else None
    gate_why = (f"; NVIDIA_REQUIRE_CUDA cuda>={require[1]}, which NVIDIA's container toolkit checks before the "
                "container starts") if require else ""
    label_cuda = labels.get(LABEL_CUDA, "").strip()
    if label_cuda.lower().startswith("none"):
        return None, None, f"{LABEL_CUDA}={label_cuda!r}: a CPU-only image"
    label_floor, label_caps = _floor(labels.get(LABEL_CUDA_MIN)), _parse_caps(labels.get(LABEL_CAPS))
    if _floor(label_cuda) is not None and label_floor is not None:
        floor = max(label_floor, gate or 0.0)
        caps_why = LABEL_CAPS if label_caps else f"no valid {LABEL_CAPS}: the known torch list"
        return floor, label_caps or TORCH_ARCHES, f"{LABEL_CUDA_MIN}={label_floor:.1f}, {caps_why}{gate_why}"
    version = _floor(env.get("CUDA_VERSION"))
    if version is not None or gate is not None:
        minor_floor = float(int(version)) if version is not None else 0.0
        why = (f"CUDA_VERSION={env['CUDA_VERSION']}: any {int(version)}.x driver (minor-version compatibility)"
               if version is not None else "no CUDA_VERSION")
        return (max(minor_floor, gate or 0.0), TORCH_ARCHES,
                f"{why}{gate_why}; its compute capabilities are unknown: the known torch list")
    if "NVIDIA_VISIBLE_DEVICES" in env or label_cuda:
        return None
    return None, None, "no CUDA in its labels or environment: a CPU-only image"


def _from_config(image: str, labels: dict[str, str], env: dict[str, str], source: str, where: str) -> ImageNeeds:
    derived = needs_from_config(labels, env)
    if derived is None:
        return constants(image, f"{where} does not say which CUDA it needs")
    floor, arches, why = derived
    tail = "; its torch will not use the GPUs" if floor is None and arches is None else ""
    return ImageNeeds(floor, arches, source, f"image needs of {image} from {where}: {_describe(floor, arches)} "
                                             f"({why}){tail}")


def constants_note() -> str:
    """What the constants require, for `offers` without --image."""
    return f"ddpctl's image (image_needs' constants): {_describe(CUDA_MIN, TORCH_ARCHES)}"


def constants(image: str, reason: str) -> ImageNeeds:
    """ddpctl's own image's needs (image_needs' constants), with the note that says they are assumed and why."""
    return ImageNeeds(CUDA_MIN, TORCH_ARCHES, "constants",
                      f"could not read the labels of {image} ({reason}): assuming {constants_note()}")


def _local_config(image: str) -> tuple[dict[str, str], dict[str, str]] | None:
    """The local Docker engine's copy of `image`: (labels, env), or None (no engine, or not there)."""
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError:
        return None
    try:
        client = docker.from_env(timeout=int(ENGINE_TIMEOUT_S))
    except DockerException:
        return None
    try:
        config = client.images.get(image).attrs.get("Config") or {}
    except (ImageNotFound, DockerException, OSError):
        return None
    finally:
        client.close()
    labels = config.get("Labels") or {}
    env = dict(str(line).partition("=")[::2] for line in config.get("Env") or [])
    return {str(k): str(v) for k, v in labels.items()}, env


def read_image_needs(image: str, credentials: tuple[str, str] | None = None, local: bool = True) -> ImageNeeds:
    """The needs of `image`: from the local engine, else its registry, else the constants; never raises for an
    unreadable image (the run goes on with the note saying what was assumed)."""
    if local:
        found = _local_config(image)
        if found is not None:
            return _from_config(image, *found, "local engine", "the local Docker engine's copy")
    try:
        config = read_image_config(image, credentials)
    except RegistryError as exc:
        return constants(image, str(exc))
    except Exception as exc:  # noqa: BLE001 (a broken answer must not stop the run: it falls back, said so)
        return constants(image, f"unreadable answer from its registry: {type(exc).__name__}")
    return _from_config(image, config.labels, config.env, "registry",
                        f"its registry (config {config.digest[:19]})")


def image_needs_for(image: str, registry_login: bool) -> ImageNeeds:
    """`read_image_needs` for a Vast.ai run: with --registry-login's credentials when it was given (SpecError, as
    for the login itself, when there are none)."""
    return read_image_needs(image, registry_credentials(image) if registry_login else None)
