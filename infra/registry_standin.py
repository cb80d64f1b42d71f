"""A container registry stand-in for tests: the Docker Registry HTTP API v2 / OCI distribution spec's read side,
real HTTP on 127.0.0.1 (no registry can be reached from the test machines, and no registry image can be pulled).

What it serves, as Docker Hub and GHCR do: GET /v2/NAME/manifests/REF (tag or digest) answering with an OCI index
(linux/amd64 and linux/arm64, different configs) or a single manifest, chosen by the Accept header; GET
/v2/NAME/blobs/DIGEST answered with a redirect to a "CDN" path that serves the config blob (as registries hand
blobs to a CDN); every /v2/ request without a token for the repository gets 401 with
`WWW-Authenticate: Bearer realm=".../token",service="...",scope="repository:NAME:pull"`; GET /token gives any
client a token, which may pull a private repository only when asked for with the right HTTP Basic credentials
(wrong ones: 401).
Every request is recorded (path, whether it carried an Authorization header, its scheme) for the tests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
SERVICE = "standin-registry"


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass
class StoredImage:
    """One repository's tag: the documents served for it, by digest."""

    private: bool
    tag_target: str  # the digest the tag points at (an index, or a manifest)
    documents: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # digest -> (media type, body)


class RegistryStandIn:
    """The registry: `add_image` what it serves, `url` / `host` to name it, `requests` to see what was asked."""

    def __init__(self, credentials: tuple[str, str] = ("tester", "s3cret-registry-token")) -> None:
        self.credentials = credentials
        self.images: dict[str, StoredImage] = {}
        self.blobs: dict[str, bytes] = {}
        self.tokens: dict[str, set[str]] = {}  # token -> repositories it may pull
        self.requests: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        """host:port, the registry part of an image reference."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def __enter__(self) -> RegistryStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_image(self, repository: str, tag: str, labels: dict[str, str], env: list[str], *,
                  private: bool = False, index: bool = True) -> str:
        """Serve `repository:tag` with that linux/amd64 config (and, with `index`, an arm64 variant whose labels
        differ); return the amd64 config's digest."""
        image = StoredImage(private, "")
        amd64 = self._manifest(image, labels, env, "amd64")
        if not index:
            image.tag_target = amd64
        else:
            arm64 = self._manifest(image, {**labels, "org.ddpctl.cuda_min": "99.0"}, env, "arm64")
            entries = [{"mediaType": OCI_MANIFEST, "digest": d, "size": len(image.documents[d][1]),
                        "platform": {"os": "linux", "architecture": arch}}
                       for arch, d in (("arm64", arm64), ("amd64", amd64))]
            body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
            image.tag_target = _digest(body)
            image.documents[image.tag_target] = (OCI_INDEX, body)
        self.images[f"{repository}:{tag}"] = image
        config_digest = json.loads(image.documents[amd64][1])["config"]["digest"]
        return str(config_digest)

    def _manifest(self, image: StoredImage, labels: dict[str, str], env: list[str], arch: str) -> str:
        config = json.dumps({"architecture": arch, "os": "linux",
                             "config": {"Labels": labels, "Env": env, "Cmd": ["python"]},
                             "rootfs": {"type": "layers", "diff_ids": []}}).encode()
        self.blobs[_digest(config)] = config
        media = DOCKER_MANIFEST if arch == "amd64" else OCI_MANIFEST
        body = json.dumps({"schemaVersion": 2, "mediaType": media,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": _digest(config), "size": len(config)}, "layers": []}).encode()
        image.documents[_digest(body)] = (media, body)
        return _digest(body)

    def _grant(self, authorization: str, repository: str) -> str | None:
        """A token, or None for wrong credentials. As Docker Hub does, an anonymous client asking for a private
        repository still gets a token, one that may pull nothing (the manifest then answers 401)."""
        image = next((i for k, i in self.images.items() if k.partition(":")[0] == repository), None)
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        if authorization and authorization != expected:
            return None
        token = secrets.token_hex(16)
        self.tokens[token] = {repository} if image is None or not image.private or authorization else set()
        return token

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _send(self, code: int, body: bytes = b"", content_type: str = "application/json",
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parts = urllib.parse.urlsplit(self.path)
                auth = self.headers.get("Authorization") or ""
                registry.requests.append({"path": parts.path, "query": parts.query,
                                          "auth": auth.partition(" ")[0] or None})
                if parts.path == "/token":
                    query = dict(urllib.parse.parse_qsl(parts.query))
                    repository = query.get("scope", "").split(":")[1] if ":" in query.get("scope", "") else ""
                    token = registry._grant(auth, repository) if query.get("service") == SERVICE else None
                    if token is None:
                        self._send(401, b'{"details":"incorrect username or password"}')
                    else:
                        self._send(200, json.dumps({"token": token, "expires_in": 300}).encode())
                    return
                if parts.path.startswith("/cdn/"):
                    blob = registry.blobs.get(parts.path[len("/cdn/"):])
                    self._send(200 if blob else 404, blob or b"", "application/octet-stream")
                    return
                self._v2(parts.path, auth)

            def _v2(self, path: str, auth: str) -> None:
                name, kind, reference = _split_v2(path)
                if name is None:
                    self._send(404, b'{"errors":[{"code":"NOT_FOUND"}]}')
                    return
                token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
                if name not in registry.tokens.get(token, set()):
                    challenge = (f'Bearer realm="{registry.url}/token",service="{SERVICE}",'
                                 f'scope="repository:{name}:pull"')
                    self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', headers={"WWW-Authenticate": challenge})
                    return
                if kind == "blobs":
                    found = reference in registry.blobs
                    self._send(307 if found else 404, headers={"Location": f"/cdn/{reference}"} if found else None)
                    return
                image = registry.images.get(f"{name}:{reference}")
                if image is None:
                    image = next((i for k, i in registry.images.items()
                                  if k.partition(":")[0] == name and reference in i.documents), None)
                    target = reference
                else:
                    target = image.tag_target
                if image is None:
                    self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                    return
                media, body = image.documents[target]
                if media not in self.headers.get("Accept", ""):
                    self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"not in Accept"}]}')
                    return
                self._send(200, body, media, {"Docker-Content-Digest": target})

        return Handler


def _split_v2(path: str) -> tuple[str | None, str, str]:
    """/v2/NAME/(manifests|blobs)/REF -> (NAME, kind, REF); (None, '', '') for anything else."""
    if not path.startswith("/v2/"):
        return None, "", ""
    for kind in ("manifests", "blobs"):
        name, sep, reference = path[len("/v2/"):].rpartition(f"/{kind}/")
        if sep and name and reference:
            return name, kind, reference
    return None, "", ""
