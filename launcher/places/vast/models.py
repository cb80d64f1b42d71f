"""What the Vast.ai API tells us, as typed values: offers, instance states, rented instances."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HOURS_PER_MONTH = 30 * 24  # Vast prices storage per GB-month; storage_total_cost = storage_cost * GB / 720

# Vast's instance states, as its docs list them ("show instance", https://docs.vast.ai/cli/reference/show-instance):
# actual_status null "being provisioned", loading, running, stopped ("disk charges continue; no GPU charges"),
# frozen ("paused with memory preserved. GPU charges apply"), exited, rebooting "(transient)", unknown ("no recent
# heartbeat from the host"), offline ("host machine disconnected"); cur_state running, stopped or unloaded
# ("released on destroy").
HALTED_STATES = frozenset({"stopped", "frozen"})  # not running, and SSH cannot reach it: started again to pull
# What counts as gone once Vast has accepted our destroy: only the docs' `cur_state` "unloaded" ("released on
# destroy"). `offline` is a host that disconnected, whose instance may come back and bill: not gone.
GONE_STATES = frozenset({"unloaded"})


def is_halted(obj: Mapping[str, Any]) -> bool:
    """Whether a shown instance is stopped or frozen (or asked to be): it does not answer SSH until started."""
    return obj.get("actual_status") in HALTED_STATES or obj.get("intended_status") in HALTED_STATES


def is_frozen(obj: Mapping[str, Any]) -> bool:
    """Whether a shown instance is frozen: halted, but its GPU still bills."""
    return obj.get("actual_status") == "frozen" or obj.get("intended_status") == "frozen"


def gone_after_destroy(obj: Mapping[str, Any]) -> bool:
    """Whether an instance shown after an accepted destroy is already released (see GONE_STATES)."""
    return obj.get("cur_state") in GONE_STATES


def _num(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Offer:
    """One machine offer from search (a `bundle`); `raw` is the whole JSON object."""

    id: int
    machine_id: int
    gpu_name: str
    num_gpus: int
    gpu_ram_mb: float
    dph_total: float
    dph_base: float
    storage_cost: float  # $/GB/month
    storage_total_cost: float  # $/hour for the storage the search was priced with (allocated_storage)
    reliability: float
    inet_down: float
    disk_space: float
    cuda_max_good: float
    direct_port_count: int
    public_ipaddr: str | None
    cluster_id: int | None
    geolocation: str | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    compute_cap: int = 0  # CUDA compute capability x 100 (860 for sm_86), as Vast reports it; 0: not reported
    inet_up_cost: float = 0.0  # $/GB sent from the machine, set by its host
    inet_down_cost: float = 0.0  # $/GB received by the machine (the image pull, data shipped to it)
    end_date: float | None = None  # unix time the host's contract for this offer ends
    duration: float | None = None  # seconds the offer can still be rented for
    min_bid: float | None = None  # $/hour the lowest bid an interruptible rental of this machine must beat

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Offer:
        """Build from a search result object (missing numbers read as 0)."""
        cluster = obj.get("cluster_id")
        return cls(
            id=int(obj["id"]),
            machine_id=int(obj.get("machine_id") or 0),
            gpu_name=str(obj.get("gpu_name") or "?"),
            num_gpus=int(obj.get("num_gpus") or 0),
            gpu_ram_mb=_num(obj.get("gpu_ram")),
            dph_total=_num(obj.get("dph_total")),
            dph_base=_num(obj.get("dph_base")),
            storage_cost=_num(obj.get("storage_cost")),
            storage_total_cost=_num(obj.get("storage_total_cost")),
            reliability=_num(obj.get("reliability2", obj.get("reliability"))),
            inet_down=_num(obj.get("inet_down")),
            disk_space=_num(obj.get("disk_space")),
            cuda_max_good=_num(obj.get("cuda_max_good")),
            direct_port_count=int(obj.get("direct_port_count") or 0),
            public_ipaddr=obj.get("public_ipaddr"),
            cluster_id=int(cluster) if cluster is not None else None,
            geolocation=obj.get("geolocation"),
            raw=dict(obj),
            compute_cap=int(_num(obj.get("compute_cap"))),
            inet_up_cost=_num(obj.get("inet_up_cost")),
            inet_down_cost=_num(obj.get("inet_down_cost")),
            end_date=_num(obj["end_date"]) if obj.get("end_date") is not None else None,
            duration=_num(obj["duration"]) if obj.get("duration") is not None else None,
            min_bid=_num(obj["min_bid"]) if obj.get("min_bid") is not None else None,
        )

    def contract_left_s(self, now: float) -> float | None:
        """Seconds this offer's contract still lasts (the sooner of end_date and duration), None if unknown."""
        left = [t for t in (self.end_date - now if self.end_date else None, self.duration) if t is not None]
        return min(left) if left else None

    def bandwidth_cost(self, gb_up: float, gb_down: float) -> float:
        """Dollars for moving `gb_up` GB out of and `gb_down` GB into this machine at its host's prices."""
        return gb_up * self.inet_up_cost + gb_down * self.inet_down_cost

    def hourly_price(self, disk_gb: float) -> float:
        """Real $/hour with `disk_gb` of storage.

        dph_total already holds storage_total_cost, the storage the search was priced for (allocated_storage,
        8 GB by default): swap that for the disk we ask for, so the price is right whatever the search said.
        """
        return self.dph_total - self.storage_total_cost + self.storage_cost * disk_gb / HOURS_PER_MONTH


@dataclass(frozen=True)
class InstanceState:
    """One `show instance` answer, reduced to what provisioning decides on."""

    id: int
    actual_status: str | None
    intended_status: str | None
    status_msg: str
    machine_id: int | None
    public_ipaddr: str | None
    ssh_address: tuple[str, int] | None
    dph_total: float
    start_date: float | None
    ssh_user: str = "root"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> InstanceState:
        """Parse the object under `instances` of GET /api/v0/instances/{id}/."""
        public_ip = (obj.get("public_ipaddr") or "").strip() or None
        return cls(
            id=int(obj["id"]),
            actual_status=obj.get("actual_status"),
            intended_status=obj.get("intended_status"),
            status_msg=str(obj.get("status_msg") or ""),
            machine_id=int(obj["machine_id"]) if obj.get("machine_id") is not None else None,
            public_ipaddr=public_ip,
            ssh_address=_ssh_address(obj, public_ip),
            dph_total=_num(obj.get("dph_total")),
            start_date=_num(obj["start_date"]) if obj.get("start_date") is not None else None,
            # Vast logs in as root and reports no user; the test stand-in's hosts have their own users
            ssh_user=str(obj.get("ssh_user") or "root"),
        )

    @property
    def running(self) -> bool:
        return self.actual_status == "running" and self.intended_status == "running"


def _ssh_address(obj: Mapping[str, Any], public_ip: str | None) -> tuple[str, int] | None:
    """Direct SSH (public IP + the host port mapped to 22/tcp) when offered, else Vast's SSH proxy."""
    ports = obj.get("ports")
    if public_ip and isinstance(ports, Mapping):
        mapped = ports.get("22/tcp") or []
        if mapped and isinstance(mapped[0], Mapping) and mapped[0].get("HostPort"):
            return public_ip, int(mapped[0]["HostPort"])
    if obj.get("ssh_host") and obj.get("ssh_port"):
        return str(obj["ssh_host"]), int(obj["ssh_port"])
    return None


@dataclass(frozen=True)
class RentedInstance:
    """A rented, running instance that answers SSH.

    `overlay_subnet` is the overlay network's subnet when the instance joined one; the API does not report the
    instance's own overlay address, so `overlay_ip` stays None until found over SSH (the address of the
    interface inside `overlay_subnet`).
    """

    instance_id: int
    offer: Offer
    ssh_host: str
    ssh_port: int
    ssh_user: str
    public_ip: str | None
    dph: float  # $/hour, disk included
    created_at: float  # unix time of the create request
    overlay_name: str | None = None
    overlay_subnet: str | None = None
    overlay_ip: str | None = None

    def to_json(self) -> dict[str, Any]:
        """What a run directory records about this instance (no secrets in here)."""
        return {
            "instance_id": self.instance_id,
            "offer_id": self.offer.id,
            "machine_id": self.offer.machine_id,
            "gpu_name": self.offer.gpu_name,
            "num_gpus": self.offer.num_gpus,
            "cluster_id": self.offer.cluster_id,
            "ssh_host": self.ssh_host,
            "ssh_port": self.ssh_port,
            "ssh_user": self.ssh_user,
            "public_ip": self.public_ip,
            "dph": self.dph,
            "created_at": self.created_at,
            "overlay_name": self.overlay_name,
            "overlay_subnet": self.overlay_subnet,
            "overlay_ip": self.overlay_ip,
            # what the bill splits into (launcher.places.vast.billing): storage bills while the instance
            # exists, bandwidth per GB at the host's prices
            "storage_dph": max(0.0, self.dph - self.offer.dph_base),
            "inet_up_cost": self.offer.inet_up_cost,
            "inet_down_cost": self.offer.inet_down_cost,
        }


@dataclass(frozen=True)
class TeardownResult:
    """The outcome of destroying one instance: verified gone, or the error that stopped us."""

    instance_id: int
    destroyed: bool
    destroyed_at: float | None
    error: str | None = None
