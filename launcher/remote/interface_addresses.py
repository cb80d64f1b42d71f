"""Runs on a Vast.ai node under the run's python (standard library only; sent as this file's text by
launcher/providers/vast/overlay.py): every IPv4 interface address as a JSON list of [interface, address], read
without iproute2's `ip` (neither Vast's images nor the PyTorch base image have it): SIOCGIFADDR on each interface
socket.if_nameindex() lists. An interface without an IPv4 address is left out."""

import fcntl
import json
import socket
import struct

SIOCGIFADDR = 0x8915  # linux/sockios.h: get an interface's address


def ipv4_addresses() -> "list[list[str]]":
    """[[interface, address], ...] in the kernel's interface order."""
    found = []
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            found.append([name, socket.inet_ntoa(raw[20:24])])
        except OSError:
            pass
        finally:
            s.close()
    return found


if __name__ == "__main__":  # `python -c SOURCE` on the node
    print(json.dumps(ipv4_addresses()))
