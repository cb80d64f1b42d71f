"""Renting the machines for a run: create one instance per node, wait until each runs and answers SSH,
replace the ones that fail, join them to an overlay network for multi-node, and on any failure destroy
exactly what this call created."""

from __future__ import annotations

import logging
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from launcher.providers.vast.client import VastClient
from launcher.providers.vast.errors import ProvisionError, VastAuthError, VastError, VastNotFound, VastUnavailable
from launcher.providers.vast.models import InstanceState, Offer, RentedInstance
from launcher.providers.vast.offers import OfferError
from launcher.providers.vast.overlay import create_overlay, network_flag, overlay_name, wait_for_subnet
from launcher.providers.vast.teardown import cost_so_far, destroy_verified, teardown

__all__ = ["provision", "teardown", "cost_so_far", "tcp_ssh_ready", "RUNTYPE", "ONSTART"]

log = logging.getLogger(__name__)

# The OpenAPI enum's value for direct SSH (vast-cli sends "ssh_direc ssh_proxy", which the enum lacks).
RUNTYPE = "ssh_direct"
# Vast's images attach tmux to every SSH login unless this file exists; our commands need plain sessions.
ONSTART = "touch ~/.no_auto_tmux"
_FAILED_STATES = frozenset({"exited", "offline", "unknown"})
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
) -> list[RentedInstance]:
    """Rent `nodes` instances from `offers` (tried cheapest first, see offers.choose_offers) running `image`.

    Returns them in node order once each runs and answers SSH (as root on Vast). An instance that fails or is not
    ready within `ready_timeout` seconds is destroyed and the next offer tried (never the same machine
    again). `label` must be unique to this call (e.g. the run id): it tags the instances. On any failure or
    interrupt every instance this call created is destroyed (verified) before the exception propagates.
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
                           network=overlay)
        pending = [starter.start_next(node) for node in range(nodes)]
        ready: dict[int, RentedInstance] = {}
        while len(ready) < nodes:
            for slot in list(pending):
                result = starter.check(slot, ready_timeout, ssh_ready)
                if isinstance(result, RentedInstance):
                    ready[slot.node] = result
                    pending.remove(slot)
                elif result is not None:  # failed: destroy, then the next offer
                    emit({"event": "vast.instance_failed", "node": slot.node, "instance_id": slot.instance_id,
                          "machine_id": slot.offer.machine_id, "reason": result})
                    _destroy_or_raise(client, slot.instance_id, clock, sleep)
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
                 clock: Callable[[], float], network: str | None = None) -> None:
        self.client, self.offers, self.label = client, offers, label
        self.disk, self.public_key, self.created, self.emit, self.clock = disk, public_key, created, emit, clock
        self.used_machines: set[int] = set()
        self.attached: set[int] = set()
        # Vast.ai reads `env` as docker run options: each value quoted, so spaces or quotes stay in it.
        env_flags = ["-p 22:22"] + [f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items()]
        if network is not None:  # created inside the overlay network (multi-node)
            env_flags.append(network_flag(network))
        self.request = {"client_id": "me", "image": image, "disk": disk, "label": label, "runtype": RUNTYPE,
                        "env": " ".join(env_flags), "onstart": ONSTART, "target_state": "running",
                        "cancel_unavail": True}

    def start_next(self, node: int) -> _Pending:
        """Create an instance for `node` from the cheapest offer on a machine not tried yet."""
        while True:
            offer = next((o for o in self.offers if o.machine_id not in self.used_machines), None)
            if offer is None:
                raise ProvisionError(f"no usable Vast.ai offer left for node {node} (tried "
                                     f"{len(self.used_machines)} machines); relax the filters or retry later")
            self.used_machines.add(offer.machine_id)
            created_at = self.clock()
            try:
                iid = self.client.create_instance(offer.id, self.request)
            except VastNotFound as exc:  # 404/410: rented by someone else since the search
                self.emit({"event": "vast.offer_gone", "offer_id": offer.id, "status": exc.status})
                continue
            except VastUnavailable:
                self._adopt_orphans()  # the create may have happened: never leave one billing unseen
                raise
            self.created.append(iid)
            self.emit({"event": "vast.instance_created", "node": node, "instance_id": iid,
                       "offer_id": offer.id, "machine_id": offer.machine_id,
                       "dph": offer.hourly_price(self.disk), "inet_down_cost": offer.inet_down_cost,
                       "inet_up_cost": offer.inet_up_cost})
            return _Pending(node, offer, iid, created_at)

    def _adopt_orphans(self) -> None:
        for inst in self.client.list_instances(label=self.label):
            if int(inst["id"]) not in self.created:
                self.created.append(int(inst["id"]))

    def check(self, slot: _Pending, ready_timeout: float,
              ssh_ready: Callable[[str, int], bool]) -> RentedInstance | str | None:
        """The ready instance, a reason it failed, or None while it is still starting."""
        obj = self.client.show_instance(slot.instance_id)
        if obj is None:
            return "the instance disappeared"
        state = InstanceState.from_json(obj)
        if "OCI runtime" in state.status_msg:
            return f"container failed to start: {state.status_msg[:200]}"
        if state.actual_status in _FAILED_STATES:
            return f"actual_status {state.actual_status}"
        if state.intended_status in {"stopped"} | _FAILED_STATES:
            return f"intended_status {state.intended_status}"
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
        if self.clock() - slot.created_at > ready_timeout:
            return f"not running and answering SSH after {ready_timeout:.0f}s (status {state.actual_status})"
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
