"""The stand-in's machine lives, as Vast.ai behaves (each behaviour a switch a test turns on; all off by default):
instances that take time to start (`actual_status` null, then "loading"), image pulls that fail with Docker's
real messages, a per-endpoint minimum-interval rate limiter answering 429 in plain text, request quotas per window
(search: 10 a minute, its OpenAPI file's `x-rate-limit`) answered with 429 and, when a test asks, Retry-After,
error bodies that carry only `message` (docs.vast.ai/api-reference/rate-limits-and-errors), SSH through a proxy
host other than the direct address, instances that stop (billing storage only) and start again, and scoped API
keys (create/delete api-key, permissions with `constraints`). Called by infra/vast_standin.py. Not shipped."""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.vast_scoped_keys import KeyStore, ScopedKey

# Docker's own errors as Vast shows them in status_msg (the daemon's text after "Error response from daemon").
MANIFEST_UNKNOWN = ("Error response from daemon: manifest for {image} not found: manifest unknown: "
                    "manifest unknown")
PULL_ACCESS_DENIED = ("Error response from daemon: pull access denied for {image}, repository does not exist "
                      "or may require 'docker login': denied: requested access to the resource is denied")
DISK_FULL = ("failed to register layer: write /var/lib/docker/overlay2/l/x/usr/lib/libcudnn.so.9: "
             "no space left on device")
RATE_LIMITED = "API requests too frequent endpoint threshold={threshold}"


class PlainText(str):
    """A response body sent as text/plain, not JSON (Vast's limiter answers so); `headers` go out with it."""

    headers: dict[str, str]

    def __new__(cls, text: str, headers: dict[str, str] | None = None) -> PlainText:
        body = super().__new__(cls, text)
        body.headers = dict(headers or {})
        return body


@dataclass
class Switches:
    """What the lifecycle does; tests flip these while the stand-in runs."""

    null_status_s: float = 0.0  # after create, actual_status is null this long, then "loading"
    missing_images: set[str] = field(default_factory=set)  # pulls fail "manifest unknown"
    private_images: dict[str, str] = field(default_factory=dict)  # image -> image_login that pulls it
    disk_full_machines: set[int] = field(default_factory=set)  # pulls there fail "no space left on device"
    unknown_machines: dict[int, float] = field(default_factory=dict)  # machine -> seconds "unknown" after boot
    rebooting_machines: dict[int, float] = field(default_factory=dict)  # machine -> seconds "rebooting" after boot
    offline_machines: set[int] = field(default_factory=set)  # their host disconnected: "offline" (docs' state)
    rate_limits: dict[tuple[str, str], float] = field(default_factory=dict)  # (method, template) -> seconds
    # (method, template) -> (requests, per seconds): more in any such window is answered 429 (search: (10, 60))
    windows: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    retry_after: str | None = None  # a window's 429 carries this Retry-After header (None: no header, as mostly)
    message_only_errors: bool = False  # error bodies hold only {"message": ...} (no success, error or msg)
    proxy_host: str | None = None  # show ssh_host as this proxy (the direct address stays public_ipaddr)
    manage_permission: str = "api.instance.manage"  # the permission name scoped keys need for manage instance
    # Every instance gets its own key (the create answer's `instance_api_key`), injected into the container as
    # CONTAINER_API_KEY; it "can only start, stop, or destroy that specific instance" (Vast's docs, Hello World).
    # Here it reaches the instance's SSH sessions (a test-bed host's ~/.ssh/environment); False: instances without
    # it (the fallback to scoped keys).
    container_keys: bool = True


class Lifecycle:
    """State the lifecycle keeps beside the stand-in's instances: stops, keys, the limiter's clock."""

    def __init__(self) -> None:
        self.switches = Switches()
        self.key_store = KeyStore()  # scoped API keys; their switches: key_store.switches
        self.rate_limited: list[tuple[str, str]] = []  # every 429 the limiter sent
        self.stops: dict[int, list[list[float | None]]] = {}  # instance id -> [[stopped_at, started_at|None]]
        self.frozen: set[int] = set()  # instances paused with memory kept (their GPU still bills; a start resumes)
        self.container_keys: dict[str, int] = {}  # each instance's own key -> its instance id
        self.started: dict[int, float] = {}  # instance id -> when it was last started again
        self.manage_calls: list[tuple[int, str, str]] = []  # (instance id, state, "owner" | key name)
        self._last: dict[tuple[str, str], float] = {}
        self.window_log: dict[tuple[str, str], deque[float]] = {}  # when each windowed request came (clock())
        self.clock: Callable[[], float] = time.monotonic  # the limiter's clock: tests inject theirs
        self._lock = threading.Lock()

    # -- rate limiter --------------------------------------------------------------------------------------

    def limited(self, method: str, template: str) -> tuple[int, Any] | None:
        """A plain-text 429 when this endpoint was called sooner than its threshold, or more often than its window
        allows (per caller: we have one). Every windowed request counts, refused ones too."""
        window = self.switches.windows.get((method, template))
        if window is not None:
            most, period = window
            with self._lock:
                now = self.clock()
                log = self.window_log.setdefault((method, template), deque())
                while log and log[0] <= now - period:
                    log.popleft()
                log.append(now)
                if len(log) > most:
                    self.rate_limited.append((method, template))
                    retry = self.switches.retry_after
                    return 429, PlainText("API requests too frequent", {"Retry-After": retry} if retry else None)
        threshold = self.switches.rate_limits.get((method, template))
        if threshold is None:
            return None
        with self._lock:
            now = time.monotonic()
            last = self._last.get((method, template))
            if last is not None and now - last < threshold:
                self.rate_limited.append((method, template))
                return 429, PlainText(RATE_LIMITED.format(threshold=threshold))
            self._last[(method, template)] = now
        return None

    # -- scoped keys (infra/vast_scoped_keys.py) -----------------------------------------------------------

    @property
    def keys(self) -> dict[int, ScopedKey]:
        return self.key_store.keys

    def create_key(self, body: dict[str, Any]) -> tuple[int, Any]:
        return self.key_store.create(body)

    def delete_key(self, key_id: int) -> tuple[int, Any]:
        return self.key_store.delete(key_id)

    def scoped(self, bearer: str | None) -> ScopedKey | None:
        """The live scoped key this Authorization header carries, if any."""
        return self.key_store.bearer(bearer)

    def refusal(self, key: ScopedKey, op_name: str, method: str, path_id: str | None,
                body: Any) -> tuple[int, Any] | None:
        """None when the key may make this request, else Vast's refusal (see vast_scoped_keys)."""
        return self.key_store.refusal(key, op_name, method, path_id, body, self.switches.manage_permission)

    # -- the instance's own key (CONTAINER_API_KEY) ------------------------------------------------------------

    def new_container_key(self, iid: int, host: Any) -> str:
        """Make instance `iid`'s own key and put it into the instance (when the switch says so)."""
        key = "vck-" + secrets.token_hex(16)
        self.container_keys[key] = iid
        if self.switches.container_keys and hasattr(host, "update_ssh_environment"):
            host.update_ssh_environment({"CONTAINER_API_KEY": key})
        return key

    def container_instance(self, bearer: str | None) -> int | None:
        """The instance whose own key this Authorization header carries, if any."""
        return self.container_keys.get((bearer or "").removeprefix("Bearer "))

    @staticmethod
    def container_refusal(iid: int, live: bool, op_name: str, path_id: str | None, body: Any) -> tuple[int, Any] | None:
        """None when an instance's own key may make this request (start, stop or destroy that instance), else the
        refusal: 401 once the instance is gone (its key went with it), 403 for anything else."""
        if not live:
            return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
        own = path_id == str(iid)
        if own and op_name == "destroy_instance":
            return None
        if own and op_name == "manage_instance" and isinstance(body, dict) and set(body) <= {"state"}:
            return None
        return 403, {"success": False, "error": "forbidden", "msg": "instance key may only manage its own instance"}

    # -- stop / start ----------------------------------------------------------------------------------------

    def is_stopped(self, iid: int) -> bool:
        return bool(self.stops.get(iid)) and self.stops[iid][-1][1] is None

    def manage(self, iid: int, state: str, who: str) -> None:
        """Stop (GPU billing ends, storage goes on) or start the instance again."""
        now = time.time()
        self.manage_calls.append((iid, state, who))
        if state == "stopped" and not self.is_stopped(iid):
            self.stops.setdefault(iid, []).append([now, None])
        elif state == "running" and self.is_stopped(iid):
            self.stops[iid][-1][1] = now
            self.started[iid] = time.monotonic()
        elif state == "running" and iid in self.frozen:
            self.frozen.discard(iid)
            self.started[iid] = time.monotonic()

    def stopped_seconds(self, iid: int, until: float) -> float:
        return sum((end or until) - begin for begin, end in self.stops.get(iid, []) if begin is not None)

    # -- what show instance says ---------------------------------------------------------------------------

    def state(self, inst: Any, age: float, boot_delay_s: float) -> tuple[str | None, str, bool] | None:
        """(actual_status, status_msg, ssh_shown) when the lifecycle decides it, else None (the stand-in's own)."""
        sw = self.switches
        machine = inst.offer["machine_id"]
        image = inst.request["image"]
        if self.is_stopped(inst.id):
            return "stopped", "stopped by request", False
        if inst.id in self.frozen:
            return "frozen", "container paused", False
        if machine in sw.offline_machines:
            return "offline", "", False
        if inst.id in self.started and time.monotonic() - self.started[inst.id] < boot_delay_s:
            return "loading", "starting container", False
        if age < sw.null_status_s:
            return None, "", False
        if age < boot_delay_s + sw.null_status_s:
            return "loading", "pulling image", False
        if image in sw.missing_images:
            return "created", MANIFEST_UNKNOWN.format(image=image), False
        if image in sw.private_images and inst.request.get("image_login") != sw.private_images[image]:
            return "created", PULL_ACCESS_DENIED.format(image=image.split(":")[0]), False
        if machine in sw.disk_full_machines:
            return "created", DISK_FULL, False
        unknown_for = sw.unknown_machines.get(machine)
        if unknown_for is not None and age < boot_delay_s + sw.null_status_s + unknown_for:
            return "unknown", "", False
        rebooting_for = sw.rebooting_machines.get(machine)
        if rebooting_for is not None and age < boot_delay_s + sw.null_status_s + rebooting_for:
            return "rebooting", "restarting the container", False
        if sw.null_status_s and age >= boot_delay_s + sw.null_status_s:
            return "running", "success, running " + image, True
        return None

    def dress(self, obj: dict[str, Any], iid: int) -> None:
        """Final touches to a shown instance: the proxy SSH host; stopped ones keep only their storage price."""
        if self.switches.proxy_host and obj.get("ports"):
            obj["ssh_host"] = self.switches.proxy_host
        if self.is_stopped(iid):
            obj["intended_status"] = obj["next_state"] = "stopped"
            obj["dph_total"] = obj["storage_total_cost"]
        if iid in self.frozen:
            obj["intended_status"] = obj["next_state"] = "frozen"
