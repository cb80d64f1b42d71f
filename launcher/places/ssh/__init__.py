"""The user's SSH hosts as a place (natively or in Docker): hosts.py connects to them, launcher/execute/hosts/run.py
runs the plan there, launcher/execute/day2/reattach.py answers the day-2 commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import SpecError
from launcher.places.on_provider import ProvidedPlace
from launcher.places.option_words import it, listed

if TYPE_CHECKING:
    from launcher.execute.day2.recorded import RecordedRun
    from launcher.places.option_words import Flags
    from launcher.planning.request import UpOptions
    from launcher.providers.base import HostProvider


class SshPlace(ProvidedPlace):
    """--provider ssh (the default with --host): one --host per node."""

    name = "ssh"
    hosts_per_node = True

    def check_hosts(self, hosts: tuple[object, ...]) -> None:
        if not hosts:
            raise SpecError("--provider ssh needs --host (one per node)")

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        image_flags = [flag for flag in given if flag in ("--image", "--registry")]
        if runtime == "native" and image_flags:
            raise SpecError(f"{listed(image_flags, 'names', 'name')} the image of --runtime docker: add --runtime "
                            f"docker (or auto), or drop {it(image_flags)} for a native run")

    def host_provider(self, options: UpOptions) -> HostProvider:
        from launcher.execute.up import executor_calls
        from launcher.places.ssh.hosts import SshHosts

        return SshHosts(executor_calls())

    def recorded(self) -> RecordedRun:
        from launcher.execute.day2.recorded import HostsRun

        return HostsRun()
