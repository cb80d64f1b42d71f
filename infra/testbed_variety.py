"""Test bed hosts that differ as real machines do (`Testbed(..., varied=True)`; infra/testbed.py).

A uniform bed hides the defects that differences cause (a plan that names one host's interface on another, a path
taken from node 0 and used on node 1). Host k of a varied bed gets, in turn:
- its interface between the nodes named eth0, ens5 or enp1s0 (a cloud VM, an EC2 instance, a PCI workstation);
- a second interface that is NOT the route between the nodes: `docker0`, a bridge with the same address on every
  host (as Docker's bridge is on real machines), which a launcher must not pick;
- its home under /home, /srv or /opt (its own login user and SSH port come from the bed as before);
- `python3` on its PATH at a path of its own (a wrapper in the bed's directory running this machine's python with
  torch, when the bed has host_python).
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.testbed_host import sh

IFACES = ("eth0", "ens5", "enp1s0")
HOME_PARENTS = ("/home", "/srv", "/opt")
DECOY_IFACE = "docker0"
DECOY_SUBNET = "10.232.{idx}"  # never routed: each host's decoy is alone in its namespace, as docker0 is


def host_iface(k: int) -> str:
    """Host k's interface to the other nodes."""
    return IFACES[k % len(IFACES)]


def host_home(k: int, name: str) -> str:
    """Host k's login user's home (its parent exists on every Debian system)."""
    return f"{HOME_PARENTS[k % len(HOME_PARENTS)]}/{name}"


def add_decoy_interface(netns: str, idx: int) -> None:
    """The second interface: up, with an address, on every host alike, and leading nowhere."""
    sh("ip", "-n", netns, "link", "add", DECOY_IFACE, "type", "bridge")
    sh("ip", "-n", netns, "addr", "add", f"{DECOY_SUBNET.format(idx=idx)}.1/24", "dev", DECOY_IFACE)
    sh("ip", "-n", netns, "link", "set", DECOY_IFACE, "up")


def host_python_env(bed_dir: Path, name: str, env: dict[str, str]) -> dict[str, str]:
    """`env` (the bed's host_python environment, or {}) with a python3 of the host's own path first on PATH: a
    wrapper under the bed's directory (removed with it), running the interpreter that `env`'s PATH gives."""
    if "PATH" not in env:
        return env
    real = Path(env["PATH"].split(":")[0], "python3")
    bin_dir = bed_dir / f"{name}-python" / "bin"
    bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(bin_dir.parent, 0o755)
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}
