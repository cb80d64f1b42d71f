"""Runs on a node under the run's python (standard library only): the node's interface addresses read without
iproute2's `ip` (neither Vast's images nor the PyTorch base image have it).

- `ipv4_addresses()`: every IPv4 interface address as [interface, address]; sent as this file's text by
  launcher/places/vast/overlay.py, whose `python -c SOURCE` prints it as JSON. SIOCGIFADDR on each interface
  socket.if_nameindex() lists; an interface without an IPv4 address is left out.
- `addresses_with_prefixes()`: what the host probe (launcher/remote/host_probe.py) lists where `ip` is missing:
  {iface, addr, prefix} for each IPv4 address (SIOCGIFNETMASK gives its netmask) and each IPv6 one
  (/proc/net/if_inet6 gives its prefix length). Without the prefix an address would count alone (/32), and
  `--launcher mpirun` would name each node's address rather than the network between the nodes.
"""

import fcntl
import json
import socket
import struct

SIOCGIFADDR = 0x8915  # linux/sockios.h: get an interface's address
SIOCGIFNETMASK = 0x891B  # linux/sockios.h: get an interface's network mask
IF_INET6 = "/proc/net/if_inet6"  # one IPv6 address a line: hex address, index, prefix length (hex), scope, flags, name


def _ioctl_ipv4(name: str, request: int) -> "str | None":
    """The IPv4 address an interface ioctl answers (its address or its netmask), None when it has none."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = fcntl.ioctl(s.fileno(), request, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(raw[20:24])
    except OSError:
        return None
    finally:
        s.close()


def ipv4_addresses() -> "list[list[str]]":
    """[[interface, address], ...] in the kernel's interface order."""
    found = []
    for _, name in socket.if_nameindex():
        addr = _ioctl_ipv4(name, SIOCGIFADDR)
        if addr is not None:
            found.append([name, addr])
    return found


def prefix_length(netmask: str) -> "int | None":
    """255.255.255.0 -> 24; None for a mask whose ones are not contiguous (no kernel gives one)."""
    bits = int.from_bytes(socket.inet_aton(netmask), "big")
    ones = bin(bits).count("1")
    return ones if bits == ((1 << 32) - 1) ^ ((1 << (32 - ones)) - 1) else None


def ipv6_addresses(text: str) -> "list[dict]":
    """/proc/net/if_inet6's lines as {iface, addr, prefix} (the address written as `ip` writes it)."""
    found = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 6 or len(f[0]) != 32:
            continue
        try:
            addr = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0]))
            found.append({"iface": f[5], "addr": addr, "prefix": int(f[2], 16)})
        except ValueError:
            continue
    return found


def addresses_with_prefixes() -> "list[dict]":
    """Each interface's IPv4 address with its prefix length, then the IPv6 ones (as `ip -o addr show` lists them:
    {iface, addr, prefix}). IPv4: the interface's primary address only (the ioctl does not see secondary ones)."""
    found = []
    for _, name in socket.if_nameindex():
        addr = _ioctl_ipv4(name, SIOCGIFADDR)
        if addr is not None:
            mask = _ioctl_ipv4(name, SIOCGIFNETMASK)
            found.append({"iface": name, "addr": addr, "prefix": prefix_length(mask) if mask else None})
    try:
        with open(IF_INET6) as f:
            found.extend(ipv6_addresses(f.read()))
    except OSError:
        pass  # a kernel without IPv6
    return found


if __name__ == "__main__":  # `python -c SOURCE` on the node
    print(json.dumps(ipv4_addresses()))
