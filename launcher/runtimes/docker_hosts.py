"""The Docker runtime's hosts, over SSH connections: `host_docker_info` (engine, NVIDIA runtime, image ID) and
`ensure_image` (ship the image where it is missing or different: `docker save` read once from the local engine,
gzip-compressed, streamed to all hosts at once into `docker load`; or `docker pull` from a registry).
"""

from __future__ import annotations

import json
import queue
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.errors import DdpctlError, HostError
from launcher.transport.connection import HostConnection
from launcher.transport.parallel import HostOutcome, run_on_hosts


@dataclass(frozen=True)
class DockerHostInfo:
    """A host's Docker engine as its login user sees it. `problem` says why there is none."""

    has_engine: bool
    nvidia_runtime: bool = False
    image_id: str | None = None
    repo_digests: tuple[str, ...] = ()  # REPOSITORY@sha256:... of the image, for one pulled from a registry
    problem: str | None = None


@dataclass(frozen=True)
class ShipResult:
    """How the image got to one host: `bytes_sent` compressed bytes streamed, or skipped (it had it)."""

    bytes_sent: int
    skipped: bool
    replaced: bool = False  # the host had another image under this name
    pulled: bool = False
    image_id: str | None = None  # the ID the host has under the name now
    repo_digests: tuple[str, ...] = ()


# Prints `engine RUNTIMES-JSON` or `problem TEXT`, then `image ID` and `digests REPO@DIGEST...` (empty when the
# host lacks it).
INFO_SCRIPT = r"""
command -v docker >/dev/null 2>&1 || { echo "problem no docker command on this host"; exit 0; }
if ! out=$(docker info --format '{{json .Runtimes}}' 2>&1); then
  echo "problem $(echo "$out" | grep -v '^$' | tail -n 1)"; exit 0
fi
echo "engine $out"
echo "image $(docker image inspect --format '{{.Id}}' "$1" 2>/dev/null)"
echo "digests $(docker image inspect --format '{{join .RepoDigests " "}}' "$1" 2>/dev/null)"
"""

SHIP_TIMEOUT = 3600.0  # seconds: a multi-GB CUDA image over a slow link
STALL_TIMEOUT = 120.0  # seconds a host may take to accept the next chunk before it is given up
CHUNK = 1 << 20


def host_docker_info(conn: HostConnection, image: str) -> DockerHostInfo:
    """Ask the host's engine (over SSH) whether it runs, has the NVIDIA runtime, and which ID `image` has there."""
    return docker_info_from(conn.run(docker_info_argv(image), timeout=60))


def docker_info_argv(image: str) -> list[str]:
    """The engine check as a quoted argv (run alone, or within the probe's round trip)."""
    return ["sh", "-c", INFO_SCRIPT, "ddpctl-docker-info", image]


def docker_info_from(result: Any) -> DockerHostInfo:
    """The engine check's answer (anything with `stdout` and `stderr`) read."""
    fields = dict(line.partition(" ")[::2] for line in result.stdout.splitlines() if line.strip())
    if "engine" not in fields:
        problem = fields.get("problem") or (result.stderr.strip().splitlines() or ["no answer"])[-1]
        return DockerHostInfo(False, problem=problem)
    try:
        runtimes = json.loads(fields["engine"]) or {}
    except (ValueError, RecursionError):
        runtimes = {}
    return DockerHostInfo(True, nvidia_runtime="nvidia" in runtimes, image_id=fields.get("image", "").strip() or None,
                          repo_digests=tuple(fields.get("digests", "").split()))


def require_engine(info: DockerHostInfo, label: str) -> DockerHostInfo:
    """`info`, or a HostError naming the host when it has no usable Docker engine."""
    if not info.has_engine:
        raise HostError(label, f"no usable Docker engine ({info.problem}): install Docker and let the login user "
                               "use it, or run with --runtime native")
    return info


def local_image_id(engine: Any, image: str) -> str:
    """The image's ID in the local engine, or a DdpctlError saying how to build it."""
    from docker.errors import DockerException

    try:
        return str(engine.images.get(image).id)
    except DockerException:
        raise DdpctlError(f"no local image {image!r}: build it with `ddpctl image build --tag {image}`") from None


def ensure_image(conns: Sequence[HostConnection], image: str, local_engine: Any = None, *, pull: bool = False,
                 show_progress: bool = True) -> list[HostOutcome[HostConnection, ShipResult]]:
    """Make `image` on every host the local engine's image (same ID); a result or an error per host.

    Hosts that have it are skipped; the others get it streamed from `local_engine` (all at once, read once),
    or with `pull`, pull it from its registry (`image` is then a registry reference).
    """
    want = local_image_id(local_engine, image) if local_engine is not None else None
    if want is None and not pull:
        raise ValueError("streaming the image needs the local engine")
    infos = run_on_hosts(list(conns), lambda c: require_engine(host_docker_info(c, image), c.label), timeout=90)
    outcomes: list[HostOutcome[HostConnection, ShipResult]] = [HostOutcome(o.item, o.label) for o in infos]
    todo: list[int] = []
    for i, info in enumerate(infos):
        if info.error is not None:
            outcomes[i].error = info.error
        elif want is not None and info.value is not None and info.value.image_id == want:
            outcomes[i].value = ShipResult(0, skipped=True, image_id=info.value.image_id,
                                           repo_digests=info.value.repo_digests)
        else:
            todo.append(i)
    if not todo:
        return outcomes
    if pull:
        pulled = run_on_hosts([conns[i] for i in todo], lambda c: _pull(c, image), timeout=SHIP_TIMEOUT)
        results = [(o.value or 0, o.error) for o in pulled]
    else:
        results = _stream(local_engine, image, [conns[i] for i in todo], show_progress)
    for i, (sent, error) in zip(todo, results, strict=True):
        before = infos[i].value
        old = before.image_id if before is not None else None
        now = None
        if error is None:
            error, now = _verify(conns[i], image, want, old)
        if error is not None or now is None:
            outcomes[i].error = error
        else:
            outcomes[i].value = ShipResult(sent or 0, skipped=False, replaced=old is not None, pulled=pull,
                                           image_id=now.image_id, repo_digests=now.repo_digests)
    return outcomes


def _pull(conn: HostConnection, image: str) -> int:
    result = conn.run(["docker", "pull", "-q", image], timeout=SHIP_TIMEOUT)
    if result.exit_code != 0:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise HostError(conn.label, f"docker pull {image} failed: {tail[0]}")
    return 0


def _verify(conn: HostConnection, image: str, want: str | None,
            old: str | None) -> tuple[HostError | None, DockerHostInfo]:
    """(None, what the host has now) when the host now has `want` under `image` (and its superseded image is
    removed); else the error naming the host."""
    info = host_docker_info(conn, image)
    if want is not None and info.image_id != want:
        return HostError(conn.label, f"after loading, {image} there has ID {info.image_id}, not ours ({want})"), info
    if old and old != info.image_id:
        conn.run(["docker", "image", "rm", old], timeout=120)  # best effort: it may still be in use
    return None, info


def _stream(engine: Any, image: str, conns: Sequence[HostConnection],
            show_progress: bool) -> list[tuple[int, BaseException | None]]:
    """`docker save` once, gzip once, into `docker load` on every host at once; (bytes sent, error) per host."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from launcher.results.progress import console

    feeds = [_HostFeed(conn) for conn in conns]
    total = int(engine.images.get(image).attrs.get("Size") or 0) or None
    gzip = zlib.compressobj(1, zlib.DEFLATED, 31)  # level 1: CPU, not the link, is what limits us here
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, disable=not show_progress, transient=True) as progress:
        read_task = progress.add_task(f"reading {image}", total=total)
        host_tasks = [progress.add_task(f"  -> {feed.label} (compressed)", total=None) for feed in feeds]
        try:
            for raw in engine.api.get_image(image, chunk_size=CHUNK):
                progress.advance(read_task, len(raw))
                _fan_out(feeds, gzip.compress(raw), progress, host_tasks)
                if all(feed.error for feed in feeds):
                    break
            _fan_out(feeds, gzip.flush(), progress, host_tasks)
        except Exception as e:  # the local engine failed mid-save: every host's load is incomplete
            for feed in feeds:
                feed.fail(DdpctlError(f"reading {image} from the local engine failed: {e}"))
        for feed in feeds:
            feed.finish()
    return [(feed.sent, feed.error) for feed in feeds]


def _fan_out(feeds: Sequence[_HostFeed], data: bytes, progress: Any, tasks: Sequence[Any]) -> None:
    if not data:
        return
    for feed, task in zip(feeds, tasks, strict=True):
        feed.put(data)
        progress.update(task, completed=feed.sent)


class _HostFeed:
    """One host's `docker load`, fed from a bounded queue by a writer thread so a slow host only slows itself
    down to the queue's depth; a host that stops accepting data is given up, not waited for forever."""

    def __init__(self, conn: HostConnection) -> None:
        self.conn = conn
        self.label = conn.label
        self.sent = 0
        self.error: BaseException | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self._chan: Any = None
        try:
            self._chan = conn.open_channel_command(["docker", "load", "-q"])
            self._chan.set_combine_stderr(True)
        except Exception as e:
            self.error = e
        self._thread = threading.Thread(target=self._write, daemon=True, name=f"ddpctl-load-{self.label}")
        self._thread.start()

    def put(self, data: bytes) -> None:
        if self.error is None:
            self._safely(lambda: self._queue.put(data, timeout=STALL_TIMEOUT), "stopped accepting the image")

    def fail(self, error: BaseException) -> None:
        self.error = self.error or error

    def finish(self) -> None:
        """Close the stream and collect docker load's answer."""
        self._safely(lambda: self._queue.put(None, timeout=STALL_TIMEOUT), "stopped accepting the image")
        self._thread.join(timeout=STALL_TIMEOUT + 600)
        if self._thread.is_alive() and self.error is None:
            self.error = HostError(self.label, "docker load did not finish")
        if self.error is not None and self._chan is not None:
            self._chan.close()

    def _safely(self, action: Callable[[], None], what: str) -> None:
        try:
            action()
        except queue.Full:
            self.fail(HostError(self.label, f"{what} for {STALL_TIMEOUT:g} s"))

    def _write(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                break
            if self.error is not None:
                continue  # keep draining so the reader never blocks on a failed host
            try:
                self._chan.sendall(data)
                self.sent += len(data)
            except Exception as e:
                self.fail(HostError(self.label, f"sending the image failed: {e or type(e).__name__}"))
        if self.error is not None or self._chan is None:
            return
        try:
            self._chan.shutdown_write()
            output = b""
            while chunk := self._chan.recv(65536):
                output += chunk
            status = self._chan.recv_exit_status()
        except Exception as e:
            self.fail(HostError(self.label, f"docker load failed: {e or type(e).__name__}"))
            return
        if status != 0:
            tail = output.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            self.fail(HostError(self.label, f"docker load failed (exit {status}): {tail[0]}"))


def registry_digest(reference: str, repo_digests: Sequence[str]) -> str | None:
    """The `sha256:...` digest under which `reference`'s repository holds the image (None: not from a registry)."""
    last = reference.rpartition("/")[2]
    repository = reference.partition("@")[0]
    if ":" in last and "@" not in reference:
        repository = reference.rpartition(":")[0]
    for entry in repo_digests:
        name, _, digest = entry.partition("@")
        if name == repository and digest:
            return digest
    return None
