"""Runs on a host under the run's python (standard library only; sent as source within the probe's program,
launcher/remote/probe_round.py): what the host is, as one JSON-ready object. It never fails on a missing piece:
what it cannot learn is left out or null. torch's version comes from its metadata and the GPUs from nvidia-smi, because
importing torch would cost seconds per host."""

import contextlib
import ipaddress
import os
import shutil
import subprocess
import sys
from typing import Any

from launcher.remote import interface_addresses


def host_facts() -> "dict[str, Any]":
    """Python, cores, home, torch (or why not), GPUs and driver, free disk for the runs, addresses, docker."""
    info: dict[str, Any] = {"python": ".".join(str(n) for n in sys.version_info[:3]), "executable": sys.executable,
                            "cpus": os.cpu_count(), "home": os.path.expanduser("~"), "torch": None, "gpus": 0,
                            "gpu_names": []}
    try:
        from importlib import metadata

        info["torch"] = metadata.version("torch")  # with its local part (+cu121): the CUDA build
    except Exception as e:
        info["torch_error"] = (type(e).__name__ + ": " + str(e))[:200]
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(Exception):
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
            rows = [line.rsplit(",", 1) for line in out.splitlines() if line.strip()]
            info["gpu_names"] = [row[0].strip() for row in rows]
            info["gpus"] = len(rows)
            info["driver"] = rows[0][-1].strip() if rows else None
    # Free space where the runs' workspaces go (~/.ddpctl/runs, or the nearest folder of it that exists).
    runs = os.path.join(info["home"], ".ddpctl", "runs")
    while not os.path.isdir(runs) and os.path.dirname(runs) != runs:
        runs = os.path.dirname(runs)
    info["disk_free"] = shutil.disk_usage(runs).free
    conn = os.environ.get("SSH_CONNECTION", "").split()
    info["ssh_server_addr"] = conn[2] if len(conn) >= 3 else None
    info["addrs"] = addresses()
    info["docker"] = shutil.which("docker") is not None
    return info


def addresses() -> "list[dict]":
    """Every interface address as {iface, addr, prefix}: from `ip -o addr show`, or where a host has no `ip` (Vast's
    images, the PyTorch base image) or it fails, from the kernel itself (interface_addresses.py). The prefix length
    too: the subnet (10.79.0.0/24) names the nodes' network on every host alike, whatever the interface is called
    there (--launcher mpirun's btl_tcp_if_include)."""
    if shutil.which("ip"):
        with contextlib.suppress(Exception):
            out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
            found = []
            for line in out.splitlines():
                f = line.split()
                if len(f) >= 4 and f[2] in ("inet", "inet6"):
                    addr, _, prefix = f[3].partition("/")
                    found.append({"iface": f[1], "addr": addr, "prefix": int(prefix) if prefix.isdigit() else None})
            if found:
                return found
    with contextlib.suppress(Exception):
        return interface_addresses.addresses_with_prefixes()
    return []


def own_address(ssh_server_addr: "str | None", addrs: "list[dict]") -> "str | None":
    """The address the other nodes reach this host at: the one it was reached at over SSH when that is one of
    its own, else its first IPv4 address that is not loopback (launcher/planning/facts.py's HostFacts.address
    and node 0's rendezvous listener both use this rule)."""
    own = [str(a["addr"]) for a in addrs]
    if ssh_server_addr in own:
        return ssh_server_addr
    for addr in own:
        with contextlib.suppress(ValueError):
            if not ipaddress.ip_address(addr).is_loopback and ":" not in addr:
                return addr
    return ssh_server_addr
