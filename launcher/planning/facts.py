"""What the read-only probe learned about one host, as a typed, versioned record (run.json's `node_facts`).

Plain data (the address rule is the host probe's own): planning decides from it, run.json keeps it, doctor prints it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.remote.host_probe import own_address

FACTS_VERSION = 1


@dataclass(frozen=True)
class HostAddress:
    """One address of one of the host's interfaces."""

    iface: str
    addr: str
    prefix: int | None = None  # the network's prefix length (24 for 10.79.0.5/24); None where the probe had none


@dataclass(frozen=True)
class HostFacts:
    """One host as the probe saw it: its python and torch, GPUs (CUDA build, driver), cores, disk, addresses."""

    label: str
    python: str | None = None
    executable: str | None = None
    cpus: int = 1
    home: str | None = None
    torch: str | None = None
    torch_error: str | None = None
    torch_cuda: str | None = None  # the CUDA build of the host's torch (its `+cu121` suffix), None for CPU builds
    driver: str | None = None  # the NVIDIA driver version nvidia-smi reports, None without one
    gpu_names: tuple[str, ...] = ()
    disk_free: int = 0
    ssh_server_addr: str | None = None
    addrs: tuple[HostAddress, ...] = ()
    docker: bool = False
    version: int = field(default=FACTS_VERSION)

    @property
    def gpus(self) -> int:
        """How many GPUs nvidia-smi lists."""
        return len(self.gpu_names)

    @classmethod
    def from_probe(cls, label: str, info: dict[str, Any]) -> HostFacts:
        """The facts from the probe script's JSON answer (missing pieces stay unknown)."""
        torch_full = info.get("torch") or None
        torch, _, local = str(torch_full).partition("+") if torch_full else (None, "", "")
        return cls(
            label=label, python=info.get("python"), executable=info.get("executable"),
            cpus=int(info.get("cpus") or 1), home=info.get("home"), torch=torch,
            torch_error=info.get("torch_error"), torch_cuda=local if local.startswith("cu") else None,
            driver=info.get("driver") or None, gpu_names=tuple(str(n) for n in info.get("gpu_names") or ()),
            disk_free=int(info.get("disk_free") or 0), ssh_server_addr=info.get("ssh_server_addr"),
            addrs=tuple(HostAddress(str(a["iface"]), str(a["addr"]), _prefix(a)) for a in info.get("addrs") or ()),
            docker=bool(info.get("docker")),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The record as run.json keeps it (one per node, in node order)."""
        data = asdict(self)
        data["gpu_names"] = list(self.gpu_names)
        data["addrs"] = [asdict(a) for a in self.addrs]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostFacts:
        """Read back what to_json wrote; a record of another version or shape is a ValueError."""
        if not isinstance(data, dict) or data.get("version") != FACTS_VERSION:
            raise ValueError(f"host facts of version {data.get('version') if isinstance(data, dict) else None!r}; "
                             f"this ddpctl reads version {FACTS_VERSION}")
        try:
            fields = {**data, "gpu_names": tuple(data.get("gpu_names", ())),
                      "addrs": tuple(HostAddress(a["iface"], a["addr"], _prefix(a)) for a in data.get("addrs", ()))}
            return cls(**fields)
        except (TypeError, KeyError) as e:
            raise ValueError(f"host facts are malformed: {e}") from e

    @property
    def address(self) -> str | None:
        """The address the host was reached at, when it is one of its own; else its first non-loopback IPv4 one
        (the rule node 0's probe listens by: launcher/remote/host_probe.py's own_address)."""
        return own_address(self.ssh_server_addr, [{"iface": a.iface, "addr": a.addr} for a in self.addrs])

    def iface_of(self, addr: str | None) -> str | None:
        """The interface holding `addr`, if it is one of the host's."""
        return next((a.iface for a in self.addrs if a.addr == addr), None)

    @property
    def slots(self) -> int:
        """Processes this host can run: its GPUs, or its cores on a CPU-only host."""
        return self.gpus or self.cpus


def _prefix(addr: dict[str, Any]) -> int | None:
    """An address's prefix length as the probe (or an older record, without one) gave it."""
    value = addr.get("prefix")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
