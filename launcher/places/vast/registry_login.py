"""`up --registry-login`: the credentials Vast.ai needs to pull a private image (`image_login` of create instance,
the arguments of `docker login`: "-u USER -p PASSWORD REGISTRY").

They come from the environment (REGISTRY_LOGIN_ENV, "USER:TOKEN") or from Docker's own credential file
(~/.docker/config.json `auths`, written by `docker login`), never from a command line; they travel only in the
create request's body and are never printed, logged or written to the run directory.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shlex
from pathlib import Path

from launcher.errors import SpecError

REGISTRY_LOGIN_ENV = "DDPCTL_REGISTRY_LOGIN"
DOCKER_HUB = "docker.io"
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


def registry_of(image: str) -> str:
    """The registry an image reference names (Docker's rule: a first part with a dot, a colon or `localhost`)."""
    first, sep, _rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def _docker_config() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def _from_docker_config(registry: str) -> tuple[str, str] | None:
    path = _docker_config()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecError(f"--registry-login: cannot read {path} ({type(exc).__name__}); set {REGISTRY_LOGIN_ENV}="
                        "USER:TOKEN instead") from None
    auths = config.get("auths") if isinstance(config, dict) else None
    keys = _HUB_KEYS if registry == DOCKER_HUB else (registry, f"https://{registry}", f"https://{registry}/v1/")
    for key in keys:
        entry = auths.get(key) if isinstance(auths, dict) else None
        encoded = entry.get("auth") if isinstance(entry, dict) else None
        if encoded:
            try:
                user, _, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise SpecError(f"--registry-login: the `auth` of {key} in {path} is not base64 USER:PASSWORD; "
                                f"run `docker login {registry}` again") from None
            if user and secret:
                return user, secret
    helper = isinstance(config, dict) and (config.get("credsStore") or (config.get("credHelpers") or {}).get(registry))
    if helper:
        raise SpecError(f"--registry-login: Docker keeps the {registry} credentials in a credential helper "
                        f"({helper}) that ddpctl does not read; set {REGISTRY_LOGIN_ENV}=USER:TOKEN instead")
    return None


def registry_login(image: str) -> str:
    """The `image_login` value for `image`; SpecError (one line, no secret in it) when none is found."""
    user, secret = registry_credentials(image)
    return f"-u {shlex.quote(user)} -p {shlex.quote(secret)} {registry_of(image)}"


def registry_credentials(image: str) -> tuple[str, str]:
    """(user, secret) for `image`'s registry, from the environment or Docker's file; SpecError when none."""
    registry = registry_of(image)
    value = os.environ.get(REGISTRY_LOGIN_ENV, "").strip()
    if value:
        user, _, secret = value.partition(":")
        if not user or not secret:
            raise SpecError(f"--registry-login: {REGISTRY_LOGIN_ENV} must be USER:TOKEN (a token or password "
                            "after the first colon)")
        found: tuple[str, str] | None = (user, secret)
    else:
        found = _from_docker_config(registry)
    if found is None:
        raise SpecError(f"--registry-login: no credentials for {registry}: run `docker login {registry}` (ddpctl "
                        f"reads {_docker_config()}) or set {REGISTRY_LOGIN_ENV}=USER:TOKEN")
    return found
