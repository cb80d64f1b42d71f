"""Renting the machines for a run: create one instance per node, wait until each runs and answers SSH,
replace the ones that fail, join them to an overlay network for multi-node, and on any failure destroy
exactly what this call created."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import ProvisionError, VastAuthError, VastError, VastNotFound
from launcher.places.vast.lost_creates import answer_lost, find_created
from launcher.places.vast.models import HALTED_STATES, HOURS_PER_MONTH, InstanceState, Offer, RentedInstance
from launcher.places.vast.offers import OfferError
from launcher.places.vast.overlay import create_overlay, network_flag, overlay_name, wait_for_subnet
from launcher.places.vast.start_failures import (
    FAILED_STATES,
    TRANSIENT_STATES,
    StartFailure,
    classify_status_msg,
    image_error_line,
)
from launcher.places.vast.teardown import cost_so_far, destroy_verified, teardown

__all__ = ["provision", "teardown", "cost_so_far", "tcp_ssh_ready", "RUNTYPE", "ONSTART"]

log = logging.getLogger(__name__)

# The OpenAPI enum's value for direct SSH (vast-cli sends "ssh_direc ssh_proxy", which the enum lacks).
RUNTYPE = "ssh_direct"
# Vast's images attach tmux to every SSH login unless this file exists; our commands need plain sessions.
# The image's ENV (PATH to its python, PYTHONUNBUFFERED, LD_LIBRARY_PATH, ...) is not visible in Vast's SSH
# sessions: the onstart script, which runs with it, writes those variables to /etc/environment, which PAM reads
# for every SSH session (Vast's own advice). Chosen over an absolute interpreter path: ddpctl cannot know where
# an image keeps python (/opt/conda/bin, a venv, /usr/bin), and the trainer needs the other variables too. Only
# these names: the -e values (a user's secrets) stay out of the file. Rewritten, not appended, on every start.
EXPORTED_ENV = ("PATH|LD_LIBRARY_PATH|PYTHONPATH|PYTHONUNBUFFERED|PYTHONHOME|VIRTUAL_ENV|CONDA_PREFIX|CUDA_HOME|"
                "CUDA_VERSION|NVIDIA_[A-Z_]*|TORCH_[A-Z_]*|NCCL_[A-Z_]*|LANG|LC_ALL")
ONSTART = ("touch ~/.no_auto_tmux; { grep -vE '^(" + EXPORTED_ENV + ")=' /etc/environment 2>/dev/null; "
           "env | grep -E '^(" + EXPORTED_ENV + ")='; } > /etc/environment.ddpctl && "
           "cat /etc/environment.ddpctl > /etc/environment")
# A machine that fails to start is replaced by the next offer; after this many such failures in one run the
# market (or the offers' filters) is the problem, not the machine: stop and say so.
MAX_MACHINE_FAILURES = 3
# An instance not listed yet, or listed with no actual_status (being provisioned): wait this long before giving up.
TRANSIENT_GRACE_S = 180.0
Event = Callable[[dict[str, Any]], None]


def tcp_ssh_ready(host: str, port: int, timeout: float = 3.0) -> bool:
    """True when something at host:port speaks SSH (sends an `SSH-` banner); host keys are checked later."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class _Pending:
    """One node's instance being started."""

    node: int
    offer: Offer
    instance_id: int
    created_at: float
    answered_at: float  # when the create returned: the ready timeout counts from here (creates are paced)
    unsure_since: float | None = None  # when it was last seen with no state, or not listed


def provision(
    client: VastClient,
    offers: Sequence[Offer],
    *,
    nodes: int,
    image: str,
    disk: float,
    label: str,
    ssh_public_key: str,
    ready_timeout: float = 900.0,
    poll_interval: float = 5.0,
    on_event: Event | None = None,
    ssh_ready: Callable[[str, int], bool] = tcp_ssh_ready,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    image_login: str | None = None,
    max_machine_failures: int = MAX_MACHINE_FAILURES,
    transient_grace: float = TRANSIENT_GRACE_S,
    bid_for: Callable[[Offer], float] | None = None,
) -> list[RentedInstance]:
    """Rent `nodes` instances from `offers` (tried cheapest first, see offers.choose_offers) running `image`.

    Returns them in node order once each runs and answers SSH (as root on Vast). An instance that fails or is not
    ready within `ready_timeout` seconds is destroyed and the next offer tried (never the same machine
    again). `label` must be unique to this call (e.g. the run id): it tags the instances, and each poll
    round is one list request filtered by it (Vast limits requests per endpoint). An image that cannot be pulled
    fails the whole call after the first machine (see start_failures.py); at most `max_machine_failures`
    machines are replaced. `bid_for`: rent interruptible instances, bidding this $/hour on each offer.
    `image_login` (docker login arguments) is sent for a private registry and never
    logged. On any failure or interrupt every instance this call created is destroyed (verified) before the
    exception propagates.
    """
    emit = on_event or (lambda _e: None)
    if nodes < 1:
        raise OfferError(f"--nodes must be at least 1, not {nodes}")
    cluster_ids = {o.cluster_id for o in offers}
    if nodes > 1 and (len(cluster_ids) != 1 or None in cluster_ids):
        raise OfferError("multi-node on Vast.ai needs offers of one cluster (one shared cluster_id): NCCL/gloo "
                         "cannot cross the NATs between machines otherwise; pass offers.choose_offers' result")
    created: list[int] = []  # every instance this call created, in creation order
    overlay: str | None = None
    try:
        _register_account_key(client, ssh_public_key, emit)
        if nodes > 1:  # Vast's documented order: the overlay first, then the instances created into it
            overlay = overlay_name(label)
            create_overlay(client, int(offers[0].cluster_id or 0), overlay, emit)
        starter = _Starter(client, list(offers), image=image, disk=disk, label=label,
                           public_key=ssh_public_key, env=env or {}, created=created, emit=emit, clock=clock,
                           sleep=sleep, poll_interval=poll_interval, network=overlay, image_login=image_login,
                           transient_grace=transient_grace)
        starter.bid_for = bid_for
        pending = [starter.start_next(node) for node in range(nodes)]
        ready: dict[int, RentedInstance] = {}
        failures = 0
        while len(ready) < nodes:
            listed = {int(i["id"]): i for i in client.list_instances(label=label)}  # one request per round
            seen_at = clock()  # judged as of this listing: a replacement's paced create may take seconds
            for slot in list(pending):
                result = starter.check(slot, listed.get(slot.instance_id), ready_timeout, ssh_ready, seen_at)
                if isinstance(result, RentedInstance):
                    ready[slot.node] = result
                    pending.remove(slot)
                elif result is not None:  # failed: destroy, then the next offer (unless the image is at fault)
                    emit({"event": "vast.instance_failed", "node": slot.node, "instance_id": slot.instance_id,
                          "machine_id": slot.offer.machine_id, "reason": result.reason,
                          "image_error": result.image})
                    _destroy_or_raise(client, slot.instance_id, clock, sleep)
                    created.remove(slot.instance_id)
                    if result.image:
                        raise ProvisionError(image_error_line(image, result))
                    failures += 1
                    if failures >= max_machine_failures:
                        raise ProvisionError(f"{failures} Vast.ai machines failed to start the image (last: "
                                             f"{result.reason}); stopped trying: retry later or change the offers")
                    pending[pending.index(slot)] = starter.start_next(slot.node)
            if pending:
                sleep(poll_interval)
        rented = [ready[n] for n in range(nodes)]
        if overlay is not None:
            subnet = wait_for_subnet(client, overlay, clock=clock, sleep=sleep)
            emit({"event": "vast.overlay_ready", "overlay": overlay, "cluster_id": offers[0].cluster_id,
                  "subnet": subnet})
            rented = [replace(inst, overlay_name=overlay, overlay_subnet=subnet) for inst in rented]
        return rented
    except BaseException as exc:
        try:  # even an on_event that raises (a second Ctrl-C) must not skip the cleanup
            emit({"event": "vast.provision_failed", "error": str(exc) or type(exc).__name__,
                  "destroying": list(created)})
        finally:
            _cleanup(client, created, overlay, clock, sleep, emit)
        raise


class _Starter:
    """Creates instances from the next usable offer and judges how their start is going."""

    def __init__(self, client: VastClient, offers: list[Offer], *, image: str, disk: float, label: str,
                 public_key: str, env: Mapping[str, str], created: list[int], emit: Event,
                 clock: Callable[[], float], sleep: Callable[[float], None], poll_interval: float,
                 network: str | None = None, image_login: str | None = None,
                 transient_grace: float = TRANSIENT_GRACE_S) -> None:
        self.client, self.offers, self.label, self.transient_grace = client, offers, label, transient_grace
        self.sleep, self.poll_interval = sleep, poll_interval
        self.disk, self.public_key, self.created, self.emit, self.clock = disk, public_key, created, emit, clock
        self.used_machines: set[int] = set()
        self.bid_for: Callable[[Offer], float] | None = None  # interruptible: the `price` bid on each offer
        self.attached: set[int] = set()
        # `env` in vast-cli's object form (what Vast's guides document and the live service honours for `-n`;
        # the OpenAPI file's string form is accepted too): docker options as keys with "1", variables as
        # NAME: value (no quoting needed, and no 256-character limit on the whole string).
        env_object = {"-p 22:22": "1", **{str(k): str(v) for k, v in env.items()}}
        if network is not None:  # created inside the overlay network (multi-node)
            env_object[network_flag(network)] = "1"
        self.request = {"client_id": "me", "image": image, "disk": disk, "label": label, "runtype": RUNTYPE,
                        "env": env_object, "onstart": ONSTART, "target_state": "running",
                        "cancel_unavail": True}
        if image_login:
            self.request["image_login"] = image_login

    def start_next(self, node: int) -> _Pending:
        """Create an instance for `node` from the cheapest offer on a machine not tried yet."""
        while True:
            offer = next((o for o in self.offers if o.machine_id not in self.used_machines), None)
            if offer is None:
                raise ProvisionError(f"no usable Vast.ai offer left for node {node} (tried "
                                     f"{len(self.used_machines)} machines); relax the filters or retry later")
            self.used_machines.add(offer.machine_id)
            created_at = self.clock()
            # recorded (run.json, by the ledger) before the request goes out: a lost answer may still have rented
            self.emit({"event": "vast.create_sending", "node": node, "offer_id": offer.id,
                       "machine_id": offer.machine_id, "label": self.label})
            bid = self.bid_for(offer) if self.bid_for is not None else None
            request = self.request if bid is None else {**self.request, "price": bid}
            try:
                iid = self.client.create_instance(offer.id, request)
            except VastNotFound as exc:  # 404/410: rented by someone else since the search
                self.emit({"event": "vast.offer_gone", "offer_id": offer.id, "status": exc.status})
                continue
            except VastError as exc:
                if not answer_lost(exc):  # the API answered no: nothing was rented
                    self.emit({"event": "vast.create_refused", "offer_id": offer.id, "status": exc.status})
                    raise
                iid = self._found_by_label(offer, node, exc)
            self.created.append(iid)
            self.emit({"event": "vast.instance_created", "node": node, "instance_id": iid,
                       "offer_id": offer.id, "machine_id": offer.machine_id,
                       "dph": offer.hourly_price(self.disk) if bid is None
                       else bid + offer.storage_cost * self.disk / HOURS_PER_MONTH, "bid": bid,
                       "inet_down_cost": offer.inet_down_cost,
                       "inet_up_cost": offer.inet_up_cost,
                       "storage_dph": offer.storage_cost * self.disk / HOURS_PER_MONTH})
            return _Pending(node, offer, iid, created_at, self.clock())

    def _found_by_label(self, offer: Offer, node: int, exc: VastError) -> int:
        """The instance a create without an answer made, looked up by our label until the grace has passed (the
        instance list lags behind creates); ProvisionError when it is not found (the intent stays open in run.json
        for `status --rented` and `down`)."""
        self.emit({"event": "vast.create_answer_lost", "node": node, "offer_id": offer.id, "error": str(exc)})
        found = find_created(self.client, self.label, offer.machine_id, set(self.created), grace=self.transient_grace,
                             poll_interval=self.poll_interval, clock=self.clock, sleep=self.sleep)
        if found is None:
            self.emit({"event": "vast.create_unresolved", "node": node, "offer_id": offer.id,
                       "machine_id": offer.machine_id})
            raise ProvisionError(f"the create of Vast.ai offer {offer.id} got no answer ({exc}) and no instance "
                                 f"labelled {self.label} showed up within {self.transient_grace:.0f}s; it may still "
                                 f"appear: `ddpctl status --rented` and `ddpctl down {self.label}` look for it")
        return int(found["id"])

    def check(self, slot: _Pending, obj: dict[str, Any] | None, ready_timeout: float,
              ssh_ready: Callable[[str, int], bool], seen_at: float) -> RentedInstance | StartFailure | None:
        """The ready instance, why it failed, or None while it is still starting. `obj` is the instance as this
        round's list request showed it at `seen_at` (None: not listed)."""
        now = seen_at
        if slot.answered_at > seen_at:  # created after this listing: judged next round
            return None
        state = InstanceState.from_json(obj) if obj is not None else None
        if state is None or state.actual_status in TRANSIENT_STATES:
            # not listed yet, or no state: the list lags behind a create, hosts go quiet for a while
            slot.unsure_since = slot.unsure_since or now
            if now - slot.unsure_since > self.transient_grace:
                return StartFailure("the instance disappeared" if state is None else
                                    f"actual_status {state.actual_status} for {self.transient_grace:.0f}s")
        else:
            slot.unsure_since = None
        if state is None:
            return self._timed_out(slot, None, ready_timeout, now)
        failure = classify_status_msg(state.status_msg)
        if failure is not None:
            return failure
        if state.actual_status in FAILED_STATES:
            why = " (no heartbeat from its host: Vast says such an instance never starts)" \
                if state.actual_status == "unknown" else ""
            return StartFailure(f"actual_status {state.actual_status}{why}")
        if state.intended_status in HALTED_STATES | FAILED_STATES:
            return StartFailure(f"intended_status {state.intended_status}")
        if state.running and state.ssh_address is not None:
            if slot.instance_id not in self.attached:
                # account keys may reach only instances created after them: attach to this one too
                self.client.attach_ssh_key(slot.instance_id, self.public_key)
                self.attached.add(slot.instance_id)
            host, port = state.ssh_address
            if ssh_ready(host, port):
                dph = state.dph_total or slot.offer.hourly_price(self.disk)
                self.emit({"event": "vast.instance_ready", "node": slot.node, "instance_id": slot.instance_id,
                           "ssh_host": host, "ssh_port": port})
                return RentedInstance(slot.instance_id, slot.offer, host, port, state.ssh_user, state.public_ipaddr,
                                      dph, slot.created_at)
        return self._timed_out(slot, state.actual_status, ready_timeout, now)

    def _timed_out(self, slot: _Pending, status: str | None, ready_timeout: float,
                   now: float) -> StartFailure | None:
        if now - slot.answered_at > ready_timeout:
            return StartFailure(f"not running and answering SSH after {ready_timeout:.0f}s (status {status})")
        return None


def _register_account_key(client: VastClient, public_key: str, emit: Event) -> None:
    try:
        client.create_ssh_key(public_key)
    except VastAuthError:
        raise
    except VastError as exc:  # e.g. the key is already on the account; the per-instance attach suffices
        emit({"event": "vast.account_key_not_added", "error": str(exc)})


def _destroy_or_raise(client: VastClient, instance_id: int, clock: Callable[[], float],
                      sleep: Callable[[float], None]) -> None:
    result = destroy_verified(client, instance_id, clock=clock, sleep=sleep)
    if not result.destroyed:
        raise ProvisionError(f"could not destroy failed instance {instance_id}: {result.error}")


def _cleanup(client: VastClient, created: list[int], overlay: str | None, clock: Callable[[], float],
             sleep: Callable[[float], None], emit: Event) -> None:
    """Destroy what this call created; a second Ctrl-C must not leave machines billing, so finish first."""
    interrupted = False
    while True:
        try:
            results = teardown(client, list(created), overlay_name=overlay, clock=clock, sleep=sleep)
            break
        except KeyboardInterrupt:
            interrupted = True
    for res in results:
        emit({"event": "vast.instance_destroyed" if res.destroyed else "vast.destroy_failed",
              "instance_id": res.instance_id, "error": res.error})
        if not res.destroyed:
            log.error("instance %s may still be billing: %s", res.instance_id, res.error)
    if interrupted:
        raise KeyboardInterrupt
