"""Where to run: host specifications as the user types them (`[user@]host[:port]` or an ssh-config alias)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from launcher.errors import SpecError

# Neither part may start with '-': ssh would read such a word as an option (`-oProxyCommand=...`).
_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._][A-Za-z0-9._-]*)"
    r"(?::(?P<port>\d+))?$"
)


@dataclass(frozen=True)
class HostSpec:
    """One `--host` value. `user`/`port` are None when not given (the ssh config or defaults decide)."""

    text: str
    hostname: str
    user: str | None = None
    port: int | None = None

    @property
    def label(self) -> str:
        return self.text

    @property
    def key(self) -> tuple[str | None, str, int | None]:
        """What tells two hosts apart: user, host name (case-insensitive, as ssh treats it) and port."""
        return self.user, self.hostname.lower(), self.port


def parse_host(text: str) -> HostSpec:
    """Parse `[user@]host[:port]`; raise SpecError with the expected form otherwise."""
    if text != text.strip():
        raise SpecError(f"--host {text!r} has spaces around it: give it as [user@]host[:port], without spaces")
    m = _HOST_RE.fullmatch(text)
    if not m:
        raise SpecError(_bare_ipv6_hint(text) or
                        f"--host {text!r} is not of the form [user@]host[:port] or an ssh config alias")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise SpecError(f"--host {text!r}: port {port} is out of range 1-65535")
    problem = host_name_problem(m["host"])
    if problem:
        raise SpecError(f"--host {text!r}: {problem}; give it as [user@]host[:port] or an ssh config alias")
    return HostSpec(text=text, hostname=m["host"].strip("[]"), user=m["user"], port=port)


def host_name_problem(name: str) -> str | None:
    """What makes `name` neither a host name (RFC 1123 labels; `_` allowed, as ssh config aliases use it), an IPv4
    address nor a bracketed IPv6 address, in a few words; None when it is one. One place for every host a user
    names, so that `..` or `10.0.0.300` is named here, not as a resolver's codec error later."""
    if name.startswith("["):
        return None if _is_ipv6(name.strip("[]")) else f"{name} is not an IPv6 address"
    if re.fullmatch(r"[0-9.]+", name) and re.search(r"[0-9]", name):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return f"{name} is not an IPv4 address (four numbers 0-255, e.g. 10.0.0.2)"
        return None
    labels = name[:-1].split(".") if name.endswith(".") and len(name) > 1 else name.split(".")
    if len(name) > 253:
        return f"the host name is {len(name)} characters long, more than DNS allows (253)"
    for label in labels:
        if not label:
            return f"{name} has an empty part between dots"
        if len(label) > 63:
            return f"{name}: its part {label[:20]}... is longer than 63 characters"
        if label.startswith("-") or label.endswith("-"):
            return f"{name}: its part {label} starts or ends with '-'"
    return None


def _bare_ipv6_hint(text: str) -> str | None:
    """For an IPv6 address typed without brackets (`2001:db8::1:22`): how to write it, with a port or without."""
    user, at, address = text.rpartition("@")
    head, _, last = address.rpartition(":")
    forms = []
    if _is_ipv6(head) and last.isdigit() and 1 <= int(last) <= 65535:
        forms.append(f"{user}{at}[{head}]:{last} (port {last})")
    if _is_ipv6(address):
        forms.append(f"{user}{at}[{address}]" + (" (no port)" if forms else ""))
    if not forms:
        return None
    return f"--host {text!r} looks like an IPv6 address: put it in brackets, {' or '.join(forms)}"


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def parse_hosts(texts: Iterable[str]) -> tuple[HostSpec, ...]:
    """Parse every `--host`; refuse the same host twice (both nodes would share one workspace on it)."""
    hosts: list[HostSpec] = []
    for text in texts:
        host = parse_host(text)
        twin = next((h for h in hosts if h.key == host.key), None)
        if twin is not None:
            which = (f"--host {text!r} is given twice" if twin.text == text
                     else f"--host {twin.text!r} and --host {text!r} are the same host")
            raise SpecError(f"{which}: each node needs a host of its own (two nodes would share one run workspace "
                            "there); for more processes on one host, raise --gpus")
        hosts.append(host)
    return tuple(hosts)
