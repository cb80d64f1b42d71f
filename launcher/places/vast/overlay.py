"""Multi-node on Vast.ai: the overlay network that joins a cluster's machines, in Vast's documented order
(create the overlay on the cluster, then create the instances into it with `-n NAME` in their docker options,
docs.vast.ai "Multi-Node training using Torch + NCCL"), its subnet (null for a while after the instances start:
polled for a bounded time) and each node's address in it, read with the node's own python (socket + ioctl),
since neither Vast's images nor the PyTorch base image have iproute2's `ip`."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from launcher.errors import HostError
from launcher.places.vast.errors import ProvisionError
from launcher.planning.plan import NodeHost
from launcher.remote import interface_addresses, source_of
from launcher.transport.parallel import raise_for_errors, run_on_hosts

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient
    from launcher.places.vast.models import RentedInstance
    from launcher.transport.hostsession import HostSession

SUBNET_WAIT_S = 180.0  # Vast reports internal_subnet as null for a while after the instances start
ADDRESS_WAIT_S = 120.0  # the overlay interface appears inside the container a little after it runs
Event = Callable[[dict[str, Any]], None]

# Every IPv4 interface address, without `ip` (launcher/remote/interface_addresses.py).
ADDRESSES_PY = source_of(interface_addresses)


OVERLAY_NAME = re.compile(r"[a-z0-9-]+")  # what vast-cli accepts for `-n NAME` (github.com/vast-ai/vast-cli)
_SLUG_MAX = 40


def overlay_name(label: str) -> str:
    """The overlay network's name for the run labelled `label`: only lower-case letters, digits and `-`, at most
    53 characters, and one per label. A label already of that form becomes LABEL-net; any other (capitals, `_`,
    `.`, or too long) is folded to that form and given 8 hex digits of its sha256, so that `My_Run` and `my-run`
    (two runs) get two networks."""
    if OVERLAY_NAME.fullmatch(label) and len(label) <= _SLUG_MAX + 9:
        return f"{label}-net"
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:_SLUG_MAX].strip("-") or "run"
    return f"{slug}-{hashlib.sha256(label.encode()).hexdigest()[:8]}-net"


def network_flag(name: str) -> str:
    """The docker option that creates an instance inside overlay `name` (sent in the create request's env)."""
    return f"-n {name}"


def create_overlay(client: VastClient, cluster_id: int, name: str, emit: Event) -> None:
    """Create the overlay on the cluster, before any instance (the instances are created into it)."""
    client.create_overlay(cluster_id, name)
    emit({"event": "vast.overlay_created", "overlay": name, "cluster_id": cluster_id})


def wait_for_subnet(client: VastClient, name: str, *, timeout: float = SUBNET_WAIT_S, interval: float = 3.0,
                    clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> str:
    """The overlay's internal_subnet, polled until Vast reports one (it is null at first), at most `timeout` s."""
    deadline = clock() + timeout
    while True:
        subnet = next((o.get("internal_subnet") for o in client.list_overlays() if o.get("name") == name), None)
        if subnet:
            return str(subnet)
        if clock() >= deadline:
            raise ProvisionError(f"Vast.ai reported no subnet for overlay network {name} within {timeout:.0f} s; "
                                 "multi-node needs it: retry later or use --nodes 1")
        sleep(interval)


def overlay_address(listed: Sequence[Sequence[str]], subnet: str) -> tuple[str, str] | None:
    """(interface, address) of the first listed interface address inside `subnet`, or None."""
    network = ipaddress.ip_network(subnet, strict=False)
    for iface, addr in listed:
        if ipaddress.ip_address(addr) in network:
            return iface, addr
    return None


def overlay_hosts(session: HostSession, rented: list[RentedInstance], python: str, *,
                  timeout: float = ADDRESS_WAIT_S, interval: float = 3.0) -> list[NodeHost]:
    """Each node's address and interface inside the overlay (the API reports only the subnet), read by the
    node's own `python`; retried until the interface shows up, at most `timeout` s."""

    def find(index: int) -> NodeHost:
        inst, label = rented[index], session.label_of(index)
        if not inst.overlay_subnet:
            raise HostError(label, f"Vast.ai reported no subnet for overlay network {inst.overlay_name}")
        deadline = time.monotonic() + timeout
        while True:
            out = session.conn(index).check([python, "-c", ADDRESSES_PY], "list network addresses", timeout=30)
            try:
                listed = json.loads(out.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise HostError(label, f"could not read the node's addresses: {out.stdout[:200]!r}") from None
            found = overlay_address(listed, inst.overlay_subnet)
            if found is not None:
                return NodeHost(label, found[1], found[0])
            if time.monotonic() >= deadline:
                raise HostError(label, f"no interface with an address in overlay network {inst.overlay_name} "
                                       f"({inst.overlay_subnet}) after {timeout:.0f} s; it has {listed}")
            time.sleep(interval)

    outcomes = run_on_hosts(list(range(len(rented))), find, timeout=timeout + 60, label=session.label_of)
    return raise_for_errors(outcomes, "overlay address")
