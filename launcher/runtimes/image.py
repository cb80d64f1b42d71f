"""The trainer image: build it from the Dockerfile and push it to a registry, through the Docker SDK.

`ddpctl image build [--base-image IMG] [--tag TAG]` and `ddpctl image push --registry REPO`. SSH hosts need
no registry (the Docker runtime streams the image to them); Vast.ai instances pull a pushed image.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

import launcher
from launcher.errors import DdpctlError

# The Dockerfile's default base: torch 2.11 for CUDA 12.8 (Ampere sm_86 and newer; the host driver must be >= 570).
DEFAULT_BASE_IMAGE = "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime"
DEFAULT_BASE_CUDA = "12.8"
DEFAULT_TAG = "ddpctl:latest"
_STEP = re.compile(r"^Step (\d+)/(\d+) :")

# Docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest], where the
# path's components are lowercase letters and digits joined by '.', '_', '__' or runs of '-'.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
_NAME_MAX = 255


class ImageError(DdpctlError):
    """The Docker engine refused or failed a build, push or pull."""


def check_reference(reference: str, option: str, *, digest: bool = True,
                    example: str = "docker.io/you/ddpctl:1") -> str:
    """`reference` if it is a valid image reference ([registry[:port]/]name[:tag][@digest]; no digest unless
    `digest`), else ImageError naming `option` and what is wrong with it."""
    m = _REFERENCE.fullmatch(reference)
    if m and len(m["name"]) <= _NAME_MAX and (digest or not m["digest"]):
        return reference
    if not reference.strip():
        why = "it is empty"
    elif reference.startswith("-"):
        why = "it must not begin with '-'"
    elif any(c.isspace() for c in reference):
        why = "it must not hold spaces"
    elif m and len(m["name"]) > _NAME_MAX:
        why = f"the name is longer than {_NAME_MAX} characters"
    elif m:
        why = "give a name and tag here, without an @digest"
    elif _REFERENCE.fullmatch(reference.lower()):
        why = "image names must be lowercase"
    else:
        why = ("expected [registry[:port]/]name[:tag]: a name of lowercase letters, digits and . _ - between them, "
               "a tag of up to 128 letters, digits, . _ - not starting with . or -")
    raise ImageError(f"{option} {reference!r} is not a valid image reference: {why}; e.g. {option} {example}")


def docker_client() -> Any:
    """A client for the local Docker engine (DOCKER_HOST or the default socket), checked with a ping."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as e:
        raise ImageError(
            f"cannot reach the Docker engine ({_first_line(e)}): start it (`sudo systemctl start docker`, "
            "or `sudo dockerd &` where there is no systemd) or set DOCKER_HOST"
        ) from None
    return client


def trainer_code_hash(context: Path) -> str:
    """sha256 (16 hex digits) over the trainer's source files in a build context: what the image runs."""
    digest = hashlib.sha256()
    for file in sorted((context / "trainer").rglob("*.py")):
        digest.update(str(file.relative_to(context)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def build_image(context: Path, tag: str = DEFAULT_TAG, base_image: str | None = None,
                labels: Mapping[str, str] | None = None, show_progress: bool = True,
                cuda: str | None = None) -> str:
    """Build the Dockerfile in `context` as `tag`, labelled with the ddpctl version and code hash; return the ID.

    `cuda` is the base image's CUDA version for the label (default: known for the default base, else "unknown").
    """
    check_reference(tag, "--tag", digest=False, example=DEFAULT_TAG)
    if base_image:
        check_reference(base_image, "--base-image", example=DEFAULT_BASE_IMAGE)
    context = context.resolve()
    if not (context / "Dockerfile").is_file() or not (context / "trainer").is_dir():
        raise ImageError(f"{context} is not a ddpctl source tree (no Dockerfile or trainer/): pass --context")
    buildargs = {"DDPCTL_VERSION": launcher.__version__, "CODE_HASH": trainer_code_hash(context)}
    if base_image:
        buildargs["BASE_IMAGE"] = base_image
    if cuda or (base_image and base_image != DEFAULT_BASE_IMAGE):
        buildargs["BASE_CUDA"] = cuda or "unknown"
    client = docker_client()
    with _engine_errors("image build failed"):
        stream = client.api.build(path=str(context), tag=tag, buildargs=buildargs, labels=dict(labels or {}),
                                  rm=True, forcerm=True, decode=True)
        try:
            image_id = _follow_build(stream, f"building {tag}", show_progress)
        except _FromFailed as e:
            raise ImageError(f"image build failed: the base image {base_image or 'in the Dockerfile'} is neither "
                             f"local nor pullable ({e}): build or pull it first, or pass --base-image") from None
        if image_id is None:  # older engines report the ID only by name: ask for it
            image_id = str(client.images.get(tag).id)
    return image_id


def push_image(tag: str, registry: str, show_progress: bool = True) -> str:
    """Tag the local image `tag` as `registry[:its tag]` and push it; return the pushed reference."""
    from docker.errors import NotFound

    check_reference(tag, "--tag", digest=False, example=DEFAULT_TAG)
    check_reference(registry, "--registry", digest=False)
    client = docker_client()
    with _engine_errors(f"cannot look up the local image {tag!r}"):
        try:
            image = client.images.get(tag)
        except NotFound:
            raise ImageError(f"no local image {tag!r}: build it first with `ddpctl image build --tag {tag}`") from None
    repository, _, version = registry.rpartition(":") if _has_tag(registry) else (registry, "", "")
    version = version or (tag.rpartition(":")[2] if ":" in tag.rpartition("/")[2] else "latest")
    ref = f"{repository}:{version}"
    with _engine_errors(f"cannot tag {tag} as {ref}"):
        image.tag(repository, version)
    with _engine_errors(f"push failed for {ref}"):
        stream = client.api.push(repository, tag=version, stream=True, decode=True)
        _follow_push(stream, f"pushing {ref}", show_progress)
    return ref


@contextmanager
def _engine_errors(what: str) -> Iterator[None]:
    """Turn the Docker SDK's errors (and a connection to the engine lost mid-stream) into one ImageError line."""
    import requests
    from docker.errors import DockerException

    try:
        yield
    except (DockerException, requests.RequestException) as e:
        raise ImageError(f"{what}: {_engine_message(e)}") from e


def _engine_message(error: Exception) -> str:
    """The engine's own words where it gave some (an APIError's explanation), else the error's first line."""
    explanation = getattr(error, "explanation", None)
    return _first_line(explanation or error)


class _FromFailed(Exception):
    """The build failed at its FROM step: the base image is missing."""


def _last_step(lines: list[str]) -> str:
    return next((line for line in reversed(lines) if _STEP.match(line)), "")


def _has_tag(reference: str) -> bool:
    return ":" in reference.rpartition("/")[2]


def _follow_build(stream: Iterator[dict[str, Any]], title: str, show_progress: bool) -> str | None:
    """Show the build's steps as a progress bar; raise ImageError with the engine's message on failure."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from launcher.results.progress import console

    image_id: str | None = None
    tail: list[str] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  disable=not show_progress, transient=True) as progress:
        task = progress.add_task(title, total=None)
        for chunk in stream:
            if "error" in chunk:
                if any(line.startswith("Step ") for line in tail) and " FROM " in _last_step(tail):
                    raise _FromFailed(_first_line(chunk["error"]))
                detail = "".join(f"\n  {line}" for line in tail[-5:])
                raise ImageError(f"image build failed: {_first_line(chunk['error'])}{detail}")
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = str(aux["ID"])
            line = str(chunk.get("stream", "")).strip()
            if not line:
                continue
            tail = (tail + [line])[-20:]
            step = _STEP.match(line)
            if step:
                progress.update(task, completed=int(step[1]) - 1, total=int(step[2]),
                                description=f"{title}: {line[:70]}")
            elif line.startswith("Successfully built ") and image_id is None:
                image_id = line.split()[-1]
        progress.update(task, completed=progress.tasks[0].total or 1)
    return image_id


def _follow_push(stream: Iterator[dict[str, Any]], title: str, show_progress: bool) -> None:
    """Show bytes pushed over all layers; raise ImageError with the registry's message on failure."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from launcher.results.progress import console

    layers: dict[str, tuple[int, int]] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=console,
                  disable=not show_progress, transient=True) as progress:
        task = progress.add_task(title, total=None)
        for chunk in stream:
            if "error" in chunk:
                raise ImageError(f"push failed: {_first_line(chunk['error'])}: check `docker login` and the "
                                 "repository name")
            detail = chunk.get("progressDetail") or {}
            if chunk.get("id") and detail.get("total"):
                layers[chunk["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
                progress.update(task, completed=sum(c for c, _ in layers.values()),
                                total=sum(t for _, t in layers.values()))


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def register(app: typer.Typer) -> None:
    """Add the `image` command group (build, push) to the CLI."""
    image_app = typer.Typer(help="Build and push the trainer image.", no_args_is_help=True)

    @image_app.command("build")
    def build(
        base_image: str = typer.Option(DEFAULT_BASE_IMAGE, "--base-image", help="FROM image (needs torch)."),
        tag: str = typer.Option(DEFAULT_TAG, "--tag", help="Name:tag of the image to build."),
        context: Path = typer.Option(Path("."), "--context", help="The ddpctl source tree (holds the Dockerfile)."),
        cuda: str | None = typer.Option(None, "--cuda", help="The base image's CUDA version, for the image label."),
    ) -> None:
        """Build the trainer image from the Dockerfile."""
        image_id = build_image(context, tag, base_image, cuda=cuda)
        print(f"{tag} {image_id}")

    @image_app.command("push")
    def push(
        registry: str = typer.Option(..., "--registry", help="Repository to push to, e.g. docker.io/you/ddpctl."),
        tag: str = typer.Option(DEFAULT_TAG, "--tag", help="Local image to push."),
    ) -> None:
        """Push the trainer image so that hosts (e.g. Vast.ai instances) can pull it."""
        print(push_image(tag, registry))

    app.add_typer(image_app, name="image")
