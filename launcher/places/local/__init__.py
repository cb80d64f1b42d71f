"""This machine as a place: machine.py gives this machine to `up`, torchrun runs here
(launcher/execute/this_machine/run.py), its state, logs and stop are measured here
(launcher/execute/this_machine/state.py); nothing to pull."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import SpecError
from launcher.places.on_provider import ProvidedPlace
from launcher.places.option_words import it, listed, they_are

if TYPE_CHECKING:
    from launcher.execute.day2.recorded import RecordedRun
    from launcher.places.option_words import Flags
    from launcher.planning.request import UpOptions
    from launcher.providers.base import HostProvider

# The options a run on this machine has no use for.
NOT_LOCAL = ("identity_file", "accept_new_host_keys", "connect_timeout", "rdzv_addr", "rdzv_port",
             "allow_public_rendezvous", "no_probe", "outputs")


class LocalPlace(ProvidedPlace):
    """--provider local (the default without --host)."""

    name = "local"
    unused_options: tuple[str, ...] = NOT_LOCAL
    runs_here = True

    def __init__(self, slurm_unused: tuple[str, ...] = ()) -> None:
        """`slurm_unused`: the options a Slurm job has no use for (the registry lends them): where it takes every
        option refused here, the refusal names it too."""
        self.slurm_unused = slurm_unused

    def check_hosts(self, hosts: tuple[object, ...]) -> None:
        if hosts:
            raise SpecError(f"--host is for --provider ssh, not {self.name}")

    def check_options(self, runtime: str, given: list[str], flags: Flags) -> None:
        not_local = [flag for flag in given if flag in flags(NOT_LOCAL)] + [
            flag for flag in given if flag in ("--image", "--registry")]
        if not_local:
            # Where Slurm takes every one of them too, it is named as well.
            also_slurm = " or slurm" if not set(not_local) & flags(self.slurm_unused) else ""
            raise SpecError(f"{listed(not_local, 'has', 'have')} no effect on a run on this machine: "
                            f"{they_are(not_local)} for runs on --host or --provider vast{also_slurm}; drop "
                            f"{it(not_local)}")

    def host_provider(self, options: UpOptions) -> HostProvider:
        from launcher.places.local.machine import LocalMachine

        return LocalMachine()

    def recorded(self) -> RecordedRun:
        from launcher.execute.day2.recorded import LocalRun

        return LocalRun()
