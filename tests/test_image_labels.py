"""The image's needs read from the image at run time (launcher/places/vast/image_labels.py): from the local
Docker engine, from a registry over real HTTP (infra/registry_standin.py: manifest list -> manifest -> config blob
behind a Bearer challenge; no real registry can be reached from here), else the constants with a note saying why.
Ends with `up --provider vast --dry-run` and `offers --explain --image` on an image that only the registry knows."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.registry_standin import RegistryStandIn
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.image_labels import needs_from_config, read_image_needs
from launcher.places.vast.image_needs import CUDA_MIN, CUDA_MIN_DRIVER, IMAGE_CUDA, TORCH_ARCHES
from launcher.places.vast.registry_api import ImageRef
from tests.docker_fixtures import base_image, requires_docker, test_image  # noqa: F401
from tests.test_vast_up import KEY, Launcher

ROOT = Path(__file__).resolve().parent.parent
OURS = {"org.ddpctl.cuda": "12.8", "org.ddpctl.cuda_min": "12.0", "org.ddpctl.compute_caps": "75,80,86,90,100,120"}
FOREIGN_ENV = ["PATH=/usr/local/nvidia/bin:/usr/bin", "CUDA_VERSION=12.8.1",
               "NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471"]


def _dockerfile_labels() -> dict[str, str]:
    """The org.ddpctl.* labels a default `docker build` of the Dockerfile gives: its LABEL lines with the ARGs'
    defaults substituted."""
    text = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    return {name: re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], value)
            for name, value in re.findall(r'(org\.ddpctl\.[\w-]+)="([^"]*)"', text)}


def test_the_dockerfile_labels_parse_to_the_constants_the_fallback_assumes() -> None:
    """The parser the run uses reads the Dockerfile's own labels as image_needs' constants."""
    labels = _dockerfile_labels()
    assert labels["org.ddpctl.cuda"] == IMAGE_CUDA and labels["org.ddpctl.cuda_min_driver"] == CUDA_MIN_DRIVER
    assert needs_from_config(labels, {})[:2] == (CUDA_MIN, TORCH_ARCHES)  # type: ignore[index]


@pytest.mark.parametrize(("labels", "env", "floor", "arches", "why"), [
    # NVIDIA's image environment alone: minor-version compatibility gives the major's floor...
    ({}, {"CUDA_VERSION": "12.8.1"}, 12.0, TORCH_ARCHES, "any 12.x driver"),
    # ...unless the container toolkit itself refuses older drivers before the container starts.
    ({}, {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=470,driver<471"},
     12.8, TORCH_ARCHES, "container toolkit"),
    ({}, {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "true"},
     12.0, TORCH_ARCHES, "any 12.x driver"),
    # our labels win over the environment, but not over the toolkit's check
    ({**OURS, "org.ddpctl.compute_caps": "80,90"}, {"CUDA_VERSION": "11.8.0"}, 12.0, (80, 90), "compute_caps"),
    (OURS, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, 12.8, TORCH_ARCHES, "container toolkit"),
    # a CPU build of ours (its other labels are the Dockerfile's defaults), a foreign CPU image
    ({**OURS, "org.ddpctl.cuda": "none (CPU)"}, {}, None, None, "CPU-only"),
    ({}, {"PATH": "/usr/bin", "LANG": "C.UTF-8"}, None, None, "CPU-only"),
    # a custom base whose CUDA `image build` was not told: the environment decides
    ({**OURS, "org.ddpctl.cuda": "unknown"}, {"CUDA_VERSION": "11.8.0"}, 11.0, TORCH_ARCHES, "any 11.x driver"),
])
def test_needs_from_labels_and_environment(labels, env, floor, arches, why) -> None:
    derived = needs_from_config(labels, env)
    assert derived is not None and derived[:2] == (floor, arches) and why in derived[2]


def test_a_gpu_image_that_names_no_cuda_version_gets_the_constants_said_as_such() -> None:
    assert needs_from_config({}, {"NVIDIA_VISIBLE_DEVICES": "all"}) is None  # pytorch/pytorch images set only this
    assert needs_from_config({"org.ddpctl.cuda": "unknown"}, {}) is None


def test_image_references_split_as_docker_does() -> None:
    assert ImageRef.parse("ubuntu") == ImageRef("registry-1.docker.io", "library/ubuntu", "latest")
    assert ImageRef.parse("docker.io/you/ddpctl:1") == ImageRef("registry-1.docker.io", "you/ddpctl", "1")
    assert ImageRef.parse("ghcr.io/me/img@sha256:" + "a" * 64) == ImageRef("ghcr.io", "me/img", "sha256:" + "a" * 64)
    local = ImageRef.parse("localhost:5000/team/x:v2")
    assert local == ImageRef("localhost:5000", "team/x", "v2") and local.base_url == "http://localhost:5000"
    assert ImageRef.parse("ghcr.io/me/img:1").base_url == "https://ghcr.io"


@pytest.fixture(scope="module")
def registry() -> Iterator[RegistryStandIn]:
    with RegistryStandIn() as standin:
        standin.add_image("me/ddpctl", "1", OURS, ["PATH=/opt/venv/bin:/usr/bin"])  # an index: amd64 + arm64
        standin.add_image("me/foreign", "12.8", {}, FOREIGN_ENV, index=False)  # a single manifest
        standin.add_image("me/private", "1", OURS, [], private=True)
        yield standin


def test_our_labels_from_the_registry_behind_a_bearer_token(registry: RegistryStandIn) -> None:
    seen = len(registry.requests)
    needs = read_image_needs(f"{registry.host}/me/ddpctl:1", local=False)
    assert (needs.source, needs.min_cuda, needs.arches) == ("registry", 12.0, TORCH_ARCHES)  # amd64's, not arm64's
    assert needs.note.startswith(f"image needs of {registry.host}/me/ddpctl:1 from its registry")
    asked = registry.requests[seen:]
    assert asked[0]["auth"] is None and asked[1]["path"] == "/token" and "scope=repository%3Ame%2Fddpctl" in \
        asked[1]["query"]
    assert all(r["auth"] == "Bearer" for r in asked[2:] if r["path"].startswith("/v2/"))
    cdn = [r for r in asked if r["path"].startswith("/cdn/")]
    assert len(cdn) == 1 and cdn[0]["auth"] is None  # the token is not forwarded to where the blob redirects


def test_a_foreign_image_is_judged_by_nvidia_s_environment(registry: RegistryStandIn) -> None:
    needs = read_image_needs(f"{registry.host}/me/foreign:12.8", local=False)
    assert (needs.source, needs.min_cuda, needs.arches) == ("registry", 12.8, TORCH_ARCHES)
    assert "NVIDIA_REQUIRE_CUDA cuda>=12.8" in needs.note and "compute capabilities are unknown" in needs.note


def test_a_private_image_needs_credentials_and_they_stay_in_headers(registry: RegistryStandIn) -> None:
    image = f"{registry.host}/me/private:1"
    anonymous = read_image_needs(image, local=False)
    assert (anonymous.source, anonymous.min_cuda) == ("constants", CUDA_MIN)
    assert anonymous.note.startswith(f"could not read the labels of {image} (access denied (401)")
    assert "--registry-login" in anonymous.note and "assuming ddpctl's image" in anonymous.note

    seen = len(registry.requests)
    with_login = read_image_needs(image, registry.credentials, local=False)
    assert with_login.source == "registry"
    asked = registry.requests[seen:]
    assert [r["auth"] for r in asked if r["path"] == "/token"] == ["Basic"]
    secret = registry.credentials[1]
    assert not any(secret in r["path"] + r["query"] for r in registry.requests) and secret not in with_login.note

    wrong = read_image_needs(image, ("tester", "not-it"), local=False)
    assert wrong.source == "constants" and "refused the --registry-login credentials" in wrong.note


def test_an_unreachable_registry_falls_back_at_once() -> None:
    with socket.socket() as sock:  # a port that was just free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    needs = read_image_needs(f"127.0.0.1:{port}/me/ddpctl:1", local=False)
    assert (needs.source, needs.min_cuda, needs.arches) == ("constants", CUDA_MIN, TORCH_ARCHES)
    assert f"cannot reach 127.0.0.1:{port}" in needs.note and "\n" not in needs.note


def test_a_registry_that_never_answers_is_given_up_on_within_the_timeout() -> None:
    import time

    from launcher.places.vast.registry_api import RegistryError, read_image_config

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections (backlog), never answers
        started = time.monotonic()
        with pytest.raises(RegistryError) as err:
            read_image_config(f"127.0.0.1:{silent.getsockname()[1]}/me/ddpctl:1", timeout=0.5)
        assert time.monotonic() - started < 5 and "timed out" in str(err.value)


@requires_docker
def test_the_local_engine_s_copy_is_read_first(test_image: str) -> None:  # noqa: F811
    """ddpctl:test is the Dockerfile built on the offline CPU base: org.ddpctl.cuda says "none (CPU)"."""
    needs = read_image_needs(test_image)
    assert (needs.source, needs.min_cuda, needs.arches) == ("local engine", None, None)
    assert "local Docker engine" in needs.note and "CPU-only" in needs.note


def test_up_dry_run_and_offers_explain_filter_with_what_the_registry_says(registry: RegistryStandIn,
                                                                          tmp_path: Path) -> None:
    """The cheapest offer's driver (CUDA 12.4) runs ddpctl's 12.x build but not an image whose toolkit check asks
    for 12.8: the dry run plans on the next offer and says where the rule came from; run.json is not written."""
    offers = [make_offer(1, 501, dph_base=0.10, cuda_max_good=12.4), make_offer(2, 502, dph_base=0.30,
                                                                              cuda_max_good=12.8)]
    image = f"{registry.host}/me/foreign:12.8"
    with VastStandIn(api_key=KEY, offers=offers) as vast:
        ddpctl = Launcher(tmp_path, vast)
        plan = ddpctl("up", "--provider", "vast", "--image", image, "--disk", "16", "--gpus", "1", "--dry-run",
                      "--runs-dir", str(ddpctl.runs))
        assert plan.returncode == 0, plan.stderr
        assert "vast offer 2" in plan.stdout and "vast offer 1" not in plan.stdout
        assert f"image needs of {image} from its registry" in plan.stderr and "CUDA >= 12.8" in plan.stderr
        assert vast.instances == {} and not ddpctl.runs.exists()

        none = ddpctl("up", "--provider", "vast", "--image", image, "--max-price", "0.2", "--dry-run")
        assert none.returncode == 1 and none.stderr.count("\n") == 1 and "no Vast.ai offer matches" in none.stderr
        assert "the image needs driver CUDA >= 12.8" in none.stderr and "from the registry" in none.stderr

        listed = ddpctl("offers", "--image", image, "--explain", "--json")
        assert listed.returncode == 0, listed.stderr
        why = {o["id"]: o["excluded"] for o in json.loads(listed.stdout)}
        assert why[2] == [] and any("CUDA 12.4 < 12.8" in reason for reason in why[1])
        assert f"image needs of {image} from its registry" in listed.stderr
