"""Reading an image's configuration (its labels and environment) from its registry, without pulling it: the
Docker Registry HTTP API v2 / OCI distribution spec, with the standard library alone (the launcher has no HTTP
client of its own for this; `requests` is Vast's).

manifest (or index / manifest list -> the linux/amd64 manifest) -> its config blob -> `config.Labels`, `config.Env`.
A 401 answered with `WWW-Authenticate: Bearer realm=...,service=...,scope=...` gets a token from the realm,
anonymously or with the user's credentials (HTTP Basic to the realm, over HTTPS only), as Docker Hub and GHCR
want. Tokens and credentials travel in headers that are not forwarded on a redirect (blobs are often served from
another host), and are never printed. Every failure is a RegistryError with a short reason: the caller falls back.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from launcher.places.vast.registry_login import DOCKER_HUB, registry_of

DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's API answers
TIMEOUT_S = 8.0  # per request: a registry that does not answer in this time is not waited for
TOTAL_TIMEOUT_S = 20.0  # all requests of one image together (up to five: manifest, token, manifest, index, blob)
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024  # manifests and image configs are kilobytes; refuse to buffer more

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(Exception):
    """The registry could not tell us the image's configuration; the message is a short reason, no secret."""


@dataclass(frozen=True)
class ImageRef:
    """An image reference split the way the registry API wants it."""

    registry: str  # host[:port] the API answers on
    repository: str  # e.g. library/ubuntu
    reference: str  # a tag or a digest

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        """`[registry/]name[:tag][@digest]` with Docker's defaults (docker.io, `library/`, `latest`)."""
        registry = registry_of(image)
        rest = image[len(registry) + 1:] if image.startswith(registry + "/") else image
        name, _, digest = rest.partition("@")
        slash = name.rfind("/")
        colon = name.rfind(":")
        tag = name[colon + 1:] if colon > slash else ""
        name = name[:colon] if colon > slash else name
        if registry == DOCKER_HUB:
            registry = DOCKER_HUB_API
            if "/" not in name:
                name = f"library/{name}"
        return cls(registry, name, digest or tag or "latest")

    @property
    def base_url(self) -> str:
        """Docker's rule: loopback registries speak plain HTTP (insecure by default), every other one HTTPS."""
        scheme = "http" if _is_loopback(self.registry) else "https"
        return f"{scheme}://{self.registry}"


def _is_loopback(registry: str) -> bool:
    host = urllib.parse.urlsplit(f"//{registry}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ImageConfig:
    """What the image's config blob says: its labels and its environment (NAME=VALUE lines as a dict)."""

    labels: dict[str, str]
    env: dict[str, str]
    digest: str  # the config blob's digest: which image this was


class RegistryReader:
    """Fetches one image's config; `credentials` (user, secret) are used only when the registry asks for them."""

    def __init__(self, ref: ImageRef, credentials: tuple[str, str] | None = None, timeout: float = TIMEOUT_S) -> None:
        self.ref, self.credentials, self.timeout = ref, credentials, timeout
        self._deadline = time.monotonic() + max(timeout, TOTAL_TIMEOUT_S)
        self._token: str | None = None
        self._basic = False

    def image_config(self) -> ImageConfig:
        """The linux/amd64 image's config: manifest (index resolved), then the config blob."""
        manifest, media_type = self._manifest(self.ref.reference)
        if media_type in (OCI_INDEX, DOCKER_LIST) or "manifests" in manifest:
            manifest, media_type = self._manifest(_amd64_digest(manifest))
        config = manifest.get("config")
        digest = config.get("digest") if isinstance(config, dict) else None
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            raise RegistryError(f"the manifest names no config blob ({media_type or 'no media type'})")
        blob = self._json(self._get(f"blobs/{digest}", "application/json")[0], "the config blob")
        inner = blob.get("config")
        inner = inner if isinstance(inner, dict) else {}
        labels = inner.get("Labels") or {}
        env_lines = inner.get("Env") or []
        if not isinstance(labels, dict) or not isinstance(env_lines, list):
            raise RegistryError("the config blob's Labels or Env is malformed")
        env = dict(str(line).partition("=")[::2] for line in env_lines)
        return ImageConfig({str(k): str(v) for k, v in labels.items()}, env, digest)

    def _manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        body, media_type = self._get(f"manifests/{reference}", ", ".join(MANIFEST_TYPES))
        manifest = self._json(body, "the manifest")
        return manifest, str(manifest.get("mediaType") or media_type)

    def _get(self, path: str, accept: str) -> tuple[bytes, str]:
        url = f"{self.ref.base_url}/v2/{self.ref.repository}/{path}"
        for _attempt in range(2):  # once anonymously or with the token so far, once after a 401's challenge
            request = urllib.request.Request(url, headers={"Accept": accept})  # noqa: S310 (http/https only)
            auth = self._authorization()
            if auth:  # not forwarded on a redirect: blobs often come from a CDN that must not see it
                request.add_unredirected_header("Authorization", auth)
            try:
                with urllib.request.urlopen(request, timeout=self._time_left()) as response:  # noqa: S310
                    body = response.read(MAX_DOCUMENT_BYTES + 1)
                    if len(body) > MAX_DOCUMENT_BYTES:
                        raise RegistryError(f"{path.split('/')[0]} larger than {MAX_DOCUMENT_BYTES} bytes")
                    return body, response.headers.get("Content-Type", "").split(";")[0].strip()
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and _attempt == 0 and self._answer_challenge(exc.headers.get("WWW-Authenticate")):
                    continue
                raise RegistryError(_http_reason(exc.code, self.credentials is not None)) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise RegistryError(f"cannot reach {self.ref.registry}: {reason}") from None
        raise RegistryError("the registry refused the credentials it asked for (401)")

    def _time_left(self) -> float:
        left = min(self.timeout, self._deadline - time.monotonic())
        if left <= 0:
            raise RegistryError(f"{self.ref.registry} took more than {TOTAL_TIMEOUT_S:g} s in all")
        return left

    def _authorization(self) -> str | None:
        if self._token:
            return f"Bearer {self._token}"
        if self._basic and self.credentials:
            return "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        return None

    def _answer_challenge(self, header: str | None) -> bool:
        """Act on a 401's WWW-Authenticate: fetch a Bearer token, or use Basic credentials; False: nothing to do."""
        scheme, _, params_text = (header or "").partition(" ")
        if scheme.lower() == "basic":
            self._basic = self.credentials is not None
            return self._basic
        if scheme.lower() != "bearer":
            return False
        params = dict(_CHALLENGE_PARAM.findall(params_text))
        realm = params.pop("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("http", "https") or (parts.scheme == "http" and not _is_loopback(parts.netloc)):
            raise RegistryError(f"the registry's token service is not an HTTPS address ({parts.scheme or 'none'})")
        params.setdefault("scope", f"repository:{self.ref.repository}:pull")
        request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(params)}")  # noqa: S310 (checked above)
        if self.credentials:
            request.add_unredirected_header(
                "Authorization", "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=self._time_left()) as response:  # noqa: S310
                answer = self._json(response.read(MAX_DOCUMENT_BYTES), "the token")
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"its token service answered {exc.code}: " + (
                "it refused the --registry-login credentials" if self.credentials
                else "a private image? pass --registry-login")) from None
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryError(f"cannot reach its token service: {getattr(exc, 'reason', exc)}") from None
        token = answer.get("token") or answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise RegistryError("its token service gave no token")
        self._token = token
        return True

    @staticmethod
    def _json(body: bytes, what: str) -> dict[str, Any]:
        try:
            value = json.loads(body)
        except ValueError:
            raise RegistryError(f"{what} is not JSON") from None
        if not isinstance(value, dict):
            raise RegistryError(f"{what} is not a JSON object")
        return value


def _amd64_digest(index: dict[str, Any]) -> str:
    """The digest of the linux/amd64 manifest of an OCI index or Docker manifest list (Vast's hosts are x86_64)."""
    for entry in index.get("manifests") or []:
        platform = entry.get("platform") if isinstance(entry, dict) else None
        if isinstance(platform, dict) and platform.get("os") == "linux" and platform.get("architecture") == "amd64":
            digest = entry.get("digest")
            if isinstance(digest, str) and digest.startswith("sha256:"):
                return digest
    raise RegistryError("the image has no linux/amd64 variant")


def _http_reason(code: int, with_credentials: bool) -> str:
    if code in (401, 403):
        return (f"access denied ({code}) even with the --registry-login credentials" if with_credentials
                else f"access denied ({code}): a private image? pass --registry-login")
    if code == 404:
        return "not found (404): no such image or tag"
    if code == 429:
        return "rate-limited by the registry (429)"
    return f"the registry answered HTTP {code}"


def read_image_config(image: str, credentials: tuple[str, str] | None = None,
                      timeout: float = TIMEOUT_S) -> ImageConfig:
    """The configuration of `image` as its registry serves it; RegistryError with a short reason otherwise."""
    return RegistryReader(ImageRef.parse(image), credentials, timeout).image_config()
