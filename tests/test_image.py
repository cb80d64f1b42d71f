"""The trainer image on the real Docker engine: build, labels, layers, torchrun inside, push, errors."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest
import requests

import launcher
from launcher.errors import DdpctlError
from launcher.runtimes.image import (
    ImageError,
    build_image,
    check_reference,
    docker_client,
    push_image,
    trainer_code_hash,
)
from tests.docker_fixtures import REPO, base_image, requires_docker, test_image  # noqa: F401


# The engine tests; the checks of image references below them need no engine.
def on_docker(test):  # type: ignore[no-untyped-def]
    return requires_docker(pytest.mark.docker(test))


USER_SCRIPT = """\
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
if dist.get_rank() == 0:
    open(os.path.join(sys.argv[1], "allreduce.txt"), "w").write(str(int(t.item())))
dist.destroy_process_group()
"""


@on_docker
def test_image_labels_say_version_and_code_hash(test_image: str) -> None:  # noqa: F811
    labels = docker_client().images.get(test_image).labels
    assert labels["org.ddpctl.version"] == launcher.__version__
    assert labels["org.ddpctl.code-hash"] == trainer_code_hash(REPO)
    assert labels["org.ddpctl.base-image"].startswith("ddpctl-base:cpu-")
    assert labels["org.ddpctl.cuda"] == "none (CPU)"


@on_docker
def test_torchrun_trains_in_the_image_and_runs_a_mounted_script(test_image: str, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "out").mkdir()
    (tmp_path / "mine.py").write_text(USER_SCRIPT)
    torchrun = "python -m torch.distributed.run --standalone --nproc-per-node 2"
    script = (f"{torchrun} -m trainer --epochs 1 --backend gloo --out-dir /workspace/out "
              "--synthetic-train-size 128 --synthetic-test-size 32 "
              f"&& {torchrun} mine.py /workspace/out")
    done = subprocess.run(["docker", "run", "--rm", "-v", f"{tmp_path}:/workspace", test_image, "sh", "-c", script],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 1
    assert len((tmp_path / "out" / "timing.jsonl").read_text().splitlines()) == 1
    assert (tmp_path / "out" / "allreduce.txt").read_text() == "3"  # ranks 1 + 2


@on_docker
def test_a_code_change_rebuilds_only_the_code_layer(base_image: str, tmp_path: Path) -> None:  # noqa: F811
    context = tmp_path / "ctx"
    context.mkdir()
    for name in ("Dockerfile", ".dockerignore"):
        shutil.copy(REPO / name, context / name)
    shutil.copytree(REPO / "trainer", context / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    tag = f"ddpctl-layers:{uuid.uuid4().hex[:8]}"
    client = docker_client()
    try:
        first = build_image(context, tag, base_image, show_progress=False)
        with (context / "trainer" / "__init__.py").open("a") as f:
            f.write("# a change\n")
        second = build_image(context, tag, base_image, show_progress=False)
        assert first != second
        old = [layer["Id"] for layer in client.images.get(first).history()]
        new = [layer["Id"] for layer in client.images.get(second).history()]
        created_by = [layer["CreatedBy"] for layer in client.images.get(second).history()]
        copy_at = next(i for i, step in enumerate(created_by) if "/opt/ddpctl/trainer/" in step)
        # history() lists newest first: everything below the trainer COPY is reused, the RUN with pip included.
        assert new[copy_at + 1:] == old[copy_at + 1:]
        assert new[copy_at] != old[copy_at]
    finally:
        for image in (tag,):
            subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
        client.images.prune(filters={"dangling": True})


@on_docker
def test_build_context_holds_only_the_trainer(tmp_path: Path) -> None:
    from docker.utils.build import tar as context_tar

    patterns = [line for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "big.pt").write_bytes(b"0" * 1000)
    (tmp_path / ".git").mkdir()
    (tmp_path / "trainer" / "__pycache__").mkdir(parents=True)
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "__pycache__" / "x.pyc").write_bytes(b"")
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "cli.py").write_text("")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with tarfile.open(fileobj=context_tar(str(tmp_path), exclude=patterns)) as tar:
        names = {name for name in tar.getnames() if not tar.getmember(name).isdir()}
    assert names == {"Dockerfile", "trainer/__init__.py"}


@pytest.fixture
def local_registry(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real registry (Debian's docker-registry) on a free loopback port; Docker trusts 127.0.0.0/8 over HTTP."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed: run `bash infra/setup.sh --test`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            try:
                if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        else:
            pytest.fail("docker-registry did not answer within 10 s")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _tiny_image(tag: str) -> None:
    """Import a one-file image: pushing it is quick, unlike the 1 GB test image."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        payload = uuid.uuid4().hex.encode()
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    subprocess.run(["docker", "import", "-", tag], input=data.getvalue(), check=True, capture_output=True)


@on_docker
def test_push_reaches_a_real_registry(local_registry: str) -> None:
    tag = f"ddpctl-push:{uuid.uuid4().hex[:8]}"
    _tiny_image(tag)
    try:
        ref = push_image(tag, f"{local_registry}/team/ddpctl", show_progress=False)
        assert ref == f"{local_registry}/team/ddpctl:{tag.split(':')[1]}"
        tags = requests.get(f"http://{local_registry}/v2/team/ddpctl/tags/list", timeout=5).json()["tags"]
        assert tag.split(":")[1] in tags
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag, f"{local_registry}/team/ddpctl:{tag.split(':')[1]}"],
                       capture_output=True)


@on_docker
def test_push_to_an_unreachable_registry_is_one_line() -> None:
    tag = f"ddpctl-push:{uuid.uuid4().hex[:8]}"
    _tiny_image(tag)
    try:
        with pytest.raises(ImageError) as err:
            push_image(tag, "127.0.0.1:1/ddpctl", show_progress=False)
        assert "push failed" in str(err.value) and "\n" not in str(err.value)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag, "127.0.0.1:1/ddpctl:" + tag.split(":")[1]],
                       capture_output=True)


@on_docker
def test_push_of_a_missing_image_says_build_it() -> None:
    with pytest.raises(ImageError, match="ddpctl image build"):
        push_image("ddpctl-no-such-image:nope", "127.0.0.1:1/x", show_progress=False)


@on_docker
def test_a_base_image_that_cannot_be_pulled_fails_the_build_in_one_error(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="image build failed") as err:
        build_image(REPO, f"ddpctl-broken:{uuid.uuid4().hex[:8]}", "ddpctl-no-such-base:none", show_progress=False)
    assert "ddpctl-no-such-base" in str(err.value).splitlines()[0]


@on_docker
def test_a_context_without_a_dockerfile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="not a ddpctl source tree"):
        build_image(tmp_path, "x:y", show_progress=False)


@on_docker
def test_an_engine_that_is_not_running_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(DdpctlError, match="cannot reach the Docker engine.*start it"):
        docker_client()


@on_docker
def test_cli_image_push_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(["image", "push", "--registry", "127.0.0.1:1/x", "--tag", "ddpctl-no-such-image:nope"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no local image") and "\n" not in err


@pytest.mark.parametrize("reference", [
    "ddpctl:latest", "ddpctl", "docker.io/you/ddpctl:1", "127.0.0.1:5000/team/ddpctl", "localhost:5000/a_b/c__d-e:V1.2",
    "Registry.Example.com:443/x/y:tag", "[::1]:5000/x:y", "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime",
    "x@sha256:" + "a" * 64,
])  # fmt: skip
def test_valid_image_references_pass(reference: str) -> None:
    assert check_reference(reference, "--image") == reference


@pytest.mark.parametrize("reference, why", [
    ("Bad Tag", "it must not hold spaces"),
    ("ddpctl:latest\n", "it must not hold spaces"),
    ("", "it is empty"),
    ("-x", "it must not begin with '-'"),
    ("--help", "it must not begin with '-'"),
    ("Ddpctl:latest", "image names must be lowercase"),
    ("docker.io/You/ddpctl:1", "image names must be lowercase"),
    ("x:", "expected [registry[:port]/]name[:tag]"),
    ("x:-a", "expected [registry[:port]/]name[:tag]"),
    ("x::y", "expected [registry[:port]/]name[:tag]"),
    ("x/", "expected [registry[:port]/]name[:tag]"),
    ("x:" + "a" * 129, "expected [registry[:port]/]name[:tag]"),
    ("x:tág", "expected [registry[:port]/]name[:tag]"),
    ("x@sha256:abc", "expected [registry[:port]/]name[:tag]"),
    ("a" * 256, "the name is longer than 255 characters"),
])  # fmt: skip
def test_invalid_image_references_are_one_line_errors(reference: str, why: str) -> None:
    with pytest.raises(ImageError) as err:
        check_reference(reference, "--tag", example="ddpctl:latest")
    message = str(err.value)
    assert message.startswith(f"--tag {reference!r} is not a valid image reference: {why}"), message
    assert message.endswith("; e.g. --tag ddpctl:latest") and "\n" not in message


def test_a_digest_is_refused_where_a_tag_is_made() -> None:
    with pytest.raises(ImageError, match="without an @digest"):
        check_reference("x@sha256:" + "a" * 64, "--registry", digest=False)


@pytest.mark.parametrize("argv, message", [
    (["image", "build", "--tag", "Bad Tag"], "--tag 'Bad Tag' is not a valid image reference: it must not hold "
                                             "spaces; e.g. --tag ddpctl:latest"),
    (["image", "build", "--base-image", "-x"], "--base-image '-x' is not a valid image reference"),
    (["image", "push", "--registry", "Docker.io/You/x"], "--registry 'Docker.io/You/x' is not a valid image "
                                                         "reference: image names must be lowercase"),
    (["image", "push", "--registry", "docker.io/you/x", "--tag", "-x"], "--tag '-x' is not a valid image reference"),
])  # fmt: skip
def test_cli_image_references_are_checked_before_the_engine_is_asked(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.cli.app import main

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # no engine is needed (or reached)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


class RefusingEngine:
    """A Docker client whose every call fails as the SDK does (no engine needed)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.api = self
        self.images = self

    def build(self, **kwargs: object) -> None:
        raise self.error

    def get(self, name: str) -> RefusingEngine:
        return self

    def tag(self, repository: str, tag: str) -> None:
        raise self.error


@pytest.mark.parametrize("call, prefix", [
    (lambda: build_image(REPO, "ddpctl:x", show_progress=False), "error: image build failed: "),
    (lambda: push_image("ddpctl:x", "docker.io/you/ddpctl", show_progress=False),
     "error: cannot tag ddpctl:x as docker.io/you/ddpctl:x: "),
])  # fmt: skip
def test_docker_sdk_errors_become_one_image_error_line(call, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from docker.errors import DockerException

    import launcher.runtimes.image

    engine = RefusingEngine(DockerException("invalid reference format\n  more detail"))
    monkeypatch.setattr(launcher.runtimes.image, "docker_client", lambda: engine)
    with pytest.raises(ImageError) as err:
        call()
    assert f"error: {err.value}" == prefix + "invalid reference format"
