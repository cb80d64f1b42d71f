"""A stand-in of the Vast.ai API for tests: a real HTTP server following the official contract (paths,
methods, request schemas, status codes, documented error bodies), whose instances are hosts made by an
injected factory (real test-bed SSH hosts, or BannerHosts for client-level tests). Not shipped.

One addition to the documented show-instance object: `ssh_user`, the host's login user (Vast's is always
root and it sends no such field; test-bed hosts each have their own user)."""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from infra import vast_bids, vast_market
from infra.vast_contract import example, find_operation, validate_request
from infra.vast_hosts import BannerHost, install_key
from infra.vast_lifecycle import Lifecycle, PlainText

HostFactory = Callable[[int], Any]  # instance id -> object with .address, .port, .user (e.g. Testbed.add_host)
HostRemover = Callable[[Any], None]  # e.g. Testbed.remove_host


def make_offer(offer_id: int, machine_id: int, **fields: Any) -> dict[str, Any]:
    """A catalogue offer: the documented search example with sane defaults, then `fields` on top."""
    offer = example("search_offers.post.200")["offers"]  # type: ignore[index]
    offer.update(id=offer_id, ask_contract_id=offer_id, machine_id=machine_id, host_id=machine_id,
                 gpu_name="RTX 3080", num_gpus=1, dph_base=0.20, storage_cost=0.15, reliability=0.99,
                 reliability2=0.99, inet_down=800.0, disk_space=200.0, cuda_max_good=12.4,
                 direct_port_count=20, cluster_id=None, verified=True, verification="verified", rentable=True,
                 rented=False, external=False, public_ipaddr="127.0.0.1",
                 inet_up_cost=0.0, inet_down_cost=0.0)  # free bandwidth unless a test prices it (vast_market)
    offer.update(fields)
    if "min_bid" not in fields:  # the documented example's min_bid fits no price here: a share of dph_base
        offer["min_bid"] = round(float(offer["dph_base"]) * vast_bids.MIN_BID_SHARE, 4)
    return offer


@dataclass
class Faults:
    """Knobs for what goes wrong. Each list/set may be changed by tests while the server runs."""

    burst: list[int] = field(default_factory=list)  # statuses answered to the next requests (429, 503...)
    burst_paths: str = ""  # only requests whose path starts with this get the burst
    vanished_offers: dict[int, int] = field(default_factory=dict)  # offer id -> 404 or 410 on create
    stuck_machines: set[int] = field(default_factory=set)  # instances there stay "loading"
    oci_machines: set[int] = field(default_factory=set)  # instances there fail with an OCI runtime error
    exited_machines: set[int] = field(default_factory=set)  # instances there exit right away
    failing_creates: dict[int, int] = field(default_factory=dict)  # k-th create (1-based) -> status
    lost_create_answers: set[int] = field(default_factory=set)  # k-th create rents, then answers 500
    # A new instance is missing from the instance list (GET /api/v1/instances/) for this many list requests after
    # its create: the list lags behind creates (1: "one read behind"); show instance by id sees it at once.
    list_lag_reads: int = 0
    destroy_lag_s: float = 0.0  # destroyed instances stay listed this long (released: cur_state `destroyed_state`)
    destroyed_state: str = "unloaded"  # what a destroyed, still listed instance shows (docs: "released on destroy")
    ignored_destroys: set[int] = field(default_factory=set)  # instances whose destroy answers 200 and does nothing
    # operation (the yaml file's stem, e.g. "attach_ssh") -> how many of its next requests are carried out and
    # then answered 502 by the gateway in front (the answer is lost, the action happened)
    gateway_after_acting: dict[str, int] = field(default_factory=dict)


@dataclass
class Instance:
    id: int
    offer: dict[str, Any]
    request: dict[str, Any]
    created: float
    host: Any = None
    address: tuple[str, int] = ("", 0)  # the host's SSH address, kept after the host is removed
    user: str = "root"
    destroyed_at: float | None = None
    keys: list[str] = field(default_factory=list)
    start_error: str | None = None  # the container cannot start (e.g. its docker network does not exist)
    unlisted_reads: int = 0  # list requests that still leave it out (Faults.list_lag_reads)


class VastStandIn:
    """Use as a context manager; `url` is the base URL to give the client."""

    def __init__(self, *, api_key: str = "test-key", offers: list[dict[str, Any]] | None = None,
                 host_factory: HostFactory = BannerHost, host_remover: HostRemover | None = None,
                 boot_delay_s: float = 0.3, overlay_subnet: str | None = None, bind: str = "127.0.0.1") -> None:
        self.api_key = api_key
        self.offers = {o["id"]: o for o in (offers or [])}
        self.host_factory = host_factory
        self.host_remover = host_remover or (lambda h: h.close() if hasattr(h, "close") else None)
        self.boot_delay_s = boot_delay_s
        self.overlay_subnet = overlay_subnet
        self.faults = Faults()
        self.market = vast_market.Market()  # market behaviours (infra/vast_market.py)
        self.bids = vast_bids.Bids()  # interruptible instances and the market that outbids them (infra/vast_bids.py)
        self.lifecycle = Lifecycle()  # start delays, pull failures, rate limits, stop/start, scoped keys
        self.bind = bind
        self.requests: list[dict[str, Any]] = []  # every request: method, path, query, body, problems, status, at
        self.instances: dict[int, Instance] = {}
        self.account_keys: list[str] = []
        self.overlays: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(5001)
        self._creates = 0
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> VastStandIn:
        handler = type("Handler", (_Handler,), {"standin": self})
        self._server = ThreadingHTTPServer((self.bind, 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        with self._lock:  # whatever a test left behind must not outlive it
            for inst in self.instances.values():
                if inst.destroyed_at is None:
                    inst.destroyed_at = time.monotonic()
                    self._remove_host(inst)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.bind}:{self._server.server_address[1]}"

    def live_instances(self) -> list[int]:
        """Ids of instances created and not destroyed (what would still be billing)."""
        with self._lock:
            return sorted(i.id for i in self.instances.values() if i.destroyed_at is None)

    def validation_failures(self) -> list[str]:
        """Every contract violation in the requests received so far."""
        return [f"{r['method']} {r['path']}: {p}" for r in self.requests for p in r["problems"]]

    # -- dispatch --------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = dict(parse_qsl(parts.query))
        record: dict[str, Any] = {"method": method, "path": parts.path, "query": query, "problems": [],
                                  "at": time.monotonic()}  # when it came: tests check the pacing of clients
        with self._lock:
            self.requests.append(record)
            status, body = self._handle(method, parts.path, query, headers, raw_body, record)
            record["status"] = status
            if status >= 400 and isinstance(body, dict) and self.lifecycle.switches.message_only_errors:
                # "Some omit error and return only msg or message" (docs.vast.ai/api-reference/rate-limits-and-errors)
                body = {"message": body.get("msg") or body.get("message") or body.get("detail") or body.get("error")}
            return status, body

    def _handle(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], raw_body: bytes,
                record: dict[str, Any]) -> tuple[int, Any]:
        found = find_operation(method, path)
        if found is None:
            record["problems"].append("undocumented method or path")
            return 404, {"success": False, "error": "not_found", "msg": f"no such endpoint {method} {path}"}
        op, path_id = found
        try:
            body = json.loads(raw_body) if raw_body else None
        except ValueError:
            record["problems"].append("body is not JSON")
            return 400, example("search_offers.post.400") or {}
        record["body"] = body
        limited = self.lifecycle.limited(method, op.template)
        if limited is not None:
            return limited
        refused = self._authorize(op.name, method, path_id, body, headers.get("authorization"), record)
        if refused is not None:
            return refused
        if self.faults.burst and path.startswith(self.faults.burst_paths):
            status = self.faults.burst.pop(0)
            fallback = {"detail": "API requests too frequent" if status == 429 else "Service Unavailable"}
            return status, example(f"{op.name}.{method.lower()}.{status}") or fallback
        problems = validate_request(op, body, query)
        if problems:
            record["problems"] += problems
            return 400, {"success": False, "error": "invalid_args", "msg": "; ".join(problems)}
        if path_id is not None and not path_id.isdigit():
            return 400, example("destroy_instance.delete.400")
        handler = getattr(self, f"_{op.name}_{method.lower()}")
        answer = handler(int(path_id) if path_id else None, body, query)
        if self.faults.gateway_after_acting.get(op.name, 0) > 0:
            self.faults.gateway_after_acting[op.name] -= 1
            return 502, {"detail": "Bad Gateway"}
        return answer

    def _authorize(self, op_name: str, method: str, path_id: str | None, body: Any, bearer: str | None,
                   record: dict[str, Any]) -> tuple[int, Any] | None:
        """None when this key may make this request: an instance's own key (its documented scope), a scoped key
        (its permissions), or the account's key; else Vast's refusal."""
        container = self.lifecycle.container_instance(bearer)
        scoped = self.lifecycle.scoped(bearer)
        if container is not None:
            record["container_key"] = container
            inst = self.instances.get(container)
            live = inst is not None and inst.destroyed_at is None
            return self.lifecycle.container_refusal(container, live, op_name, path_id, body)
        if scoped is not None:
            record["scoped_key"] = scoped.name
            return self.lifecycle.refusal(scoped, op_name, method, path_id, body)
        if bearer != f"Bearer {self.api_key}":
            record["auth_failed"] = True
            if op_name == "search_offers":  # documented: search answers a bad key with 404
                return 404, example("search_offers.post.404")
            return 401, example("show_instance.get.401")
        return None

    # -- endpoints -------------------------------------------------------------------------------------

    def _search_offers_post(self, _id: Any, q: dict[str, Any], _query: Any) -> tuple[int, Any]:
        storage = float(q.get("allocated_storage", 8))
        matches, filters = [], vast_market.search_filters(self.market, q)
        for offer in self.offers.values():
            priced = dict(offer, storage_total_cost=offer["storage_cost"] * storage / 720)
            priced["dph_total"] = priced["dph_base"] + priced["storage_total_cost"]
            priced = vast_bids.priced(self.bids, priced, q)
            if all(_matches(priced, k, v) for k, v in filters.items()):
                matches.append(priced)
        for col, direction in reversed(q.get("order", [])):
            matches.sort(key=lambda o, c=col: float(o.get(c) or 0), reverse=direction == "desc")  # type: ignore[misc]
        return 200, {"offers": matches[: int(q.get("limit", 64))]}

    def _create_instance_put(self, offer_id: int, req: dict[str, Any], _query: Any) -> tuple[int, Any]:
        self._creates += 1
        failing = self.faults.failing_creates.get(self._creates)
        if failing:
            return failing, example(f"create_instance.put.{failing}", ask_id=offer_id) or {"detail": "error"}
        gone = self.faults.vanished_offers.get(offer_id)
        offer = self.offers.get(offer_id)
        if gone or offer is None or offer["rented"]:
            status = gone or 404
            return status, example(f"create_instance.put.{status}", ask_id=offer_id)
        refusal = vast_bids.refused(self.bids, offer, req)
        if refusal is not None:
            return refusal
        iid = next(self._ids)
        offer["rented"] = True  # the whole machine's GPUs are ours now
        inst = Instance(iid, offer, req, time.monotonic(), unlisted_reads=self.faults.list_lag_reads)
        self.instances[iid] = inst
        inst.host = self.host_factory(iid)
        inst.address = (inst.host.address, int(inst.host.port))
        inst.user = inst.host.user
        inst.start_error = vast_market.on_created(self, inst)
        instance_key = self.lifecycle.new_container_key(iid, inst.host)
        for key in self.account_keys:
            self._add_key(inst, key)
        if self._creates in self.faults.lost_create_answers:
            return 500, {"detail": "Internal Server Error"}
        return 200, example("create_instance.put.200", new_contract=iid, instance_api_key=instance_key)

    def _show_instance_get(self, iid: int, _body: Any, _query: Any) -> tuple[int, Any]:
        inst = self.instances.get(iid)
        if inst is None or not self._visible(inst):
            return 200, {"instances": None}
        return 200, {"instances": self._show(inst)}

    def _show_instances_get(self, _id: Any, _body: Any, query: dict[str, str]) -> tuple[int, Any]:
        filters = json.loads(query.get("select_filters", "{}"))
        after = int(base64.b64decode(query["after_token"])) if "after_token" in query else 0
        limit = int(query.get("limit", 25))
        lagging = {i.id for i in self.instances.values() if i.unlisted_reads > 0}
        for iid in lagging:
            self.instances[iid].unlisted_reads -= 1
        shown = [self._show(i) for i in sorted(self.instances.values(), key=lambda i: i.id)
                 if self._visible(i) and i.id > after and i.id not in lagging]
        shown = [s for s in shown if all(_matches(s, k, v) for k, v in filters.items())]
        page = shown[:limit]
        token = base64.b64encode(str(page[-1]["id"]).encode()).decode() if len(shown) > limit else None
        return 200, {"success": True, "instances_found": len(page), "total_instances": len(shown),
                     "next_token": token, "instances": page}

    def _destroy_instance_delete(self, iid: int, _body: Any, _query: Any) -> tuple[int, Any]:
        inst = self.instances.get(iid)
        if inst is None or inst.destroyed_at is not None:
            return 404, example("destroy_instance.delete.404")
        if iid in self.faults.ignored_destroys:
            return 200, example("destroy_instance.delete.200")
        inst.destroyed_at = time.monotonic()
        self._remove_host(inst)
        for overlay in self.overlays.values():
            if iid in overlay["instances"]:
                overlay["instances"].remove(iid)
        return 200, example("destroy_instance.delete.200")

    def _manage_instance_put(self, iid: int, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        inst = self.instances.get(iid)
        if inst is None or inst.destroyed_at is not None:
            return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}
        if "state" in body:
            record = self.requests[-1]
            who = f"container:{record['container_key']}" if "container_key" in record else None
            self.lifecycle.manage(iid, body["state"], who or record.get("scoped_key") or "owner")
        return 200, {"success": True}

    def _create_api_key_post(self, _id: Any, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        return self.lifecycle.create_key(body)

    def _delete_api_key_delete(self, key_id: int, _body: Any, _query: Any) -> tuple[int, Any]:
        return self.lifecycle.delete_key(key_id)

    def _show_api_keys_get(self, *_: Any) -> tuple[int, Any]:
        return self.lifecycle.key_store.listing()

    def _show_user_get(self, *_: Any) -> tuple[int, Any]:
        return 200, {"id": 1, "username": "standin", "email": "standin@example.com", "balance": 10.0, "credit": 0.0}

    def _attach_ssh_post(self, iid: int, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        inst = self.instances.get(iid)
        if inst is None or inst.destroyed_at is not None:
            return 404, example("attach_ssh.post.404", msg="Instance not found")
        self._add_key(inst, body["ssh_key"])
        return 200, example("attach_ssh.post.200")

    def _show_instance_ssh_keys_get(self, iid: int, _body: Any, _query: Any) -> tuple[int, Any]:
        inst = self.instances.get(iid)
        if inst is None or inst.destroyed_at is not None:
            return 400, {"success": False, "error": "invalid_args", "msg": "Invalid instance ID"}
        keys = [{"id": k, "name": f"key-{k}", "public_key": key} for k, key in enumerate(inst.keys, 1)]
        return 200, {"success": True, "ssh_keys": json.dumps(keys)}  # documented: a JSON string

    def _create_ssh_key_post(self, _id: Any, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        if not body["ssh_key"].strip():
            return 400, example("create_ssh_key.post.400")
        self.account_keys.append(body["ssh_key"])
        key = {"id": len(self.account_keys), "user_id": 1, "public_key": body["ssh_key"],
               "created_at": "2026-01-01T00:00:00Z", "deleted_at": None}
        return 200, {"success": True, "key": key}

    def _overlay_get(self, *_: Any) -> tuple[int, Any]:
        return 200, vast_market.listed_overlays(self)

    def _overlay_post(self, _id: Any, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        if not re.fullmatch(r"[a-z0-9-]+", str(body["name"])):  # vast-cli's rule for `-n NAME`
            return 400, {"success": False, "error": "invalid_args",
                         "msg": "overlay name may hold only lower-case letters, digits and -"}
        if body["name"] in self.overlays:
            return 400, {"success": False, "error": "invalid_args", "msg": "overlay name already in use"}
        if not any(o.get("cluster_id") == body["cluster_id"] for o in self.offers.values()):
            return 400, {"success": False, "error": "invalid_args", "msg": "no such cluster"}
        self.overlays[body["name"]] = {"overlay_id": len(self.overlays) + 1, "name": body["name"],
                                       "cluster_id": body["cluster_id"], "instances": [],
                                       "internal_subnet": self.overlay_subnet}
        vast_market.on_overlay_created(self, body["name"])
        return 200, {"success": True, "msg": f"Overlay network {body['name']} created"}

    def _overlay_put(self, _id: Any, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        overlay = self.overlays.get(body["name"])
        inst = self.instances.get(body["instance_id"])
        if overlay is None or inst is None or inst.destroyed_at is not None:
            return 400, {"success": False, "error": "invalid_args", "msg": "no such overlay or instance"}
        if inst.offer.get("cluster_id") != overlay["cluster_id"]:
            return 400, {"success": False, "error": "invalid_args", "msg": "instance is not on the cluster"}
        if overlay["internal_subnet"] is None:
            overlay["internal_subnet"] = ".".join(inst.address[0].split(".")[:3]) + ".0/24"
        overlay["instances"].append(inst.id)
        return 200, {"success": True, "msg": f"Instance {inst.id} joined overlay {overlay['name']}"}

    def _overlay_delete(self, _id: Any, body: dict[str, Any], _query: Any) -> tuple[int, Any]:
        name = body.get("overlay_name") or next(
            (n for n, o in self.overlays.items() if o["overlay_id"] == body.get("overlay_id")), None)
        if name not in self.overlays:
            return 404, {"success": False, "error": "not_found", "msg": "Overlay not found"}
        del self.overlays[name]
        return 200, {"success": True, "msg": f"Overlay {name} deleted"}

    # -- instance state --------------------------------------------------------------------------------

    def _visible(self, inst: Instance) -> bool:
        return inst.destroyed_at is None or time.monotonic() - inst.destroyed_at < self.faults.destroy_lag_s

    def _show(self, inst: Instance) -> dict[str, Any]:
        """The instance as show instance documents it, in its current lifecycle state."""
        machine = inst.offer["machine_id"]
        age = time.monotonic() - inst.created
        status, msg, ports = "loading", "pulling image", {}
        if inst.destroyed_at is not None:  # released, listed a while longer (cur_state below)
            status, msg = "exited", "destroying"
        elif inst.start_error and age >= self.boot_delay_s:
            status, msg = "created", inst.start_error
        elif machine in self.faults.oci_machines and age >= self.boot_delay_s:
            status, msg = "created", ("Error response from daemon: failed to create task for container: "
                                      "OCI runtime create failed: runc create failed")
        elif machine in self.faults.exited_machines and age >= self.boot_delay_s:
            status, msg = "exited", "container exited"
        elif machine not in self.faults.stuck_machines and age >= self.boot_delay_s:
            status, msg = "running", "success, running " + inst.request["image"]
            ports = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst.address[1])}]}
        decided = self.lifecycle.state(inst, age, self.boot_delay_s) if inst.destroyed_at is None else None
        if decided is not None:
            status, msg, ssh_shown = decided  # type: ignore[assignment]
            ports = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst.address[1])}]} if ssh_shown else {}
        disk = float(inst.request.get("disk", 10))
        obj = example("show_instance.get.200")["instances"]  # type: ignore[index]
        released = inst.destroyed_at is not None
        obj.update(
            id=inst.id, actual_status=status, cur_state=self.faults.destroyed_state if released else status,
            intended_status="stopped" if released else "running", next_state="running", status_msg=msg,
            label=inst.request.get("label"),
            image_uuid=inst.request["image"], image_runtype=inst.request.get("runtype", "ssh"),
            onstart=inst.request.get("onstart"), machine_id=machine, host_id=machine,
            public_ipaddr=inst.address[0], ports=ports, ssh_host=inst.address[0], ssh_port=inst.address[1],
            gpu_name=inst.offer["gpu_name"], num_gpus=inst.offer["num_gpus"], disk_space=disk,
            dph_base=inst.offer["dph_base"], storage_cost=inst.offer["storage_cost"],
            storage_total_cost=inst.offer["storage_cost"] * disk / 720,
            dph_total=inst.offer["dph_base"] + inst.offer["storage_cost"] * disk / 720,
            start_date=time.time() - age, uptime_mins=age / 60, ssh_user=inst.user,
        )
        self.lifecycle.dress(obj, inst.id)
        vast_bids.dress(self.bids, inst, obj)
        return obj

    def _add_key(self, inst: Instance, key: str) -> None:
        inst.keys.append(key)
        if inst.host is not None:
            install_key(inst.host, key)

    def _remove_host(self, inst: Instance) -> None:
        if inst.host is not None:
            host, inst.host = inst.host, None
            self.host_remover(host)


def _matches(obj: dict[str, Any], key: str, cond: Any) -> bool:
    """Vast's filter semantics: {op: value} with eq neq gt gte lt lte in notin; unknown fields pass."""
    if not isinstance(cond, dict) or key not in obj:
        return True
    value = obj[key]
    checks = {"eq": lambda v: value == v, "neq": lambda v: value != v, "in": lambda v: value in v,
              "notin": lambda v: value not in v, "gt": lambda v: value is not None and value > v,
              "gte": lambda v: value is not None and value >= v, "lt": lambda v: value is not None and value < v,
              "lte": lambda v: value is not None and value <= v}
    return all(checks[op](v) for op, v in cond.items() if op in checks)


class _Handler(BaseHTTPRequestHandler):
    standin: VastStandIn
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, body = self.standin.handle(self.command, self.path, headers, raw)
        plain = isinstance(body, PlainText)
        data = str(body).encode() if plain else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if plain else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (body.headers.items() if plain else ()):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass
