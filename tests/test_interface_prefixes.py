"""A host's addresses with their prefixes where it has no `ip` (Vast's images, the PyTorch base image):
launcher/remote/interface_addresses.py reads them from the kernel, and the host probe (launcher/remote/host_probe.py)
lists them so. Without the prefix each address would count alone (/32) in `--launcher mpirun`'s interface
selection. The test bed's case, a host whose PATH has no `ip`, is in tests/test_varied_hosts.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.remote import host_probe, interface_addresses

# A line of /proc/net/if_inet6 as the kernel writes it (fd00::2/64 on eth0; fe80::1/64 on lo).
IF_INET6 = ("fd000000000000000000000000000002 04 40 00 80     eth0\n"
            "fe800000000000000000000000000001 01 40 20 80       lo\n"
            "short 01 40 20 80 lo\n")


def test_a_netmask_is_its_prefix_length() -> None:
    assert [interface_addresses.prefix_length(m) for m in ("255.255.255.0", "255.255.0.0", "255.255.255.255",
                                                            "0.0.0.0", "255.255.240.0")] == [24, 16, 32, 0, 20]
    assert interface_addresses.prefix_length("255.0.255.0") is None  # not contiguous


def test_ipv6_addresses_are_read_as_ip_writes_them_with_their_prefix() -> None:
    assert interface_addresses.ipv6_addresses(IF_INET6) == [{"iface": "eth0", "addr": "fd00::2", "prefix": 64},
                                                            {"iface": "lo", "addr": "fe80::1", "prefix": 64}]


def test_loopback_is_listed_with_its_prefix() -> None:
    assert {"iface": "lo", "addr": "127.0.0.1", "prefix": 8} in interface_addresses.addresses_with_prefixes()


def ip_listing() -> list[dict[str, object]]:
    """This machine's IPv4 addresses as `ip -o -4 addr show` gives them."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        f = line.split()
        addr, _, prefix = f[3].partition("/")
        found.append({"iface": f[1], "addr": addr, "prefix": int(prefix)})
    return found


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip to compare with")
def test_without_ip_the_probe_lists_each_interfaces_address_and_prefix_as_ip_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's answer equals `ip`'s for each interface's first IPv4 address (the ioctl does not see an
    interface's secondary addresses), and the probe takes it when `ip` is not on PATH."""
    listed = ip_listing()
    first_per_iface = [a for i, a in enumerate(listed) if a["iface"] not in {b["iface"] for b in listed[:i]}]
    without_ip = tmp_path / "bin"
    without_ip.mkdir()
    monkeypatch.setenv("PATH", str(without_ip))
    assert shutil.which("ip") is None
    probed = host_probe.addresses()
    assert [a for a in probed if ":" not in str(a["addr"])] == first_per_iface
    if os.path.exists(interface_addresses.IF_INET6):
        assert {"iface": "lo", "addr": "::1", "prefix": 128} in probed
