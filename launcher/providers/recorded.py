"""A recorded run's provider, rebuilt from its typed run.json: what `status`, `logs`, `pull` and `down` ask instead
of branching on the record's fields (its runtime: launcher.runtimes.start.runtime_of)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.providers.base import RunProvider
    from launcher.results.record import RunRecord


def provider_of(record: RunRecord) -> RunProvider:
    """The provider whose methods answer for the run: Vast.ai when it rented machines, SSH hosts when it ran on
    hosts, else this machine (records written before `provider` was recorded read the same)."""
    provider = record.extra.get("provider", "local")
    if provider == "slurm":  # a job on a cluster, reached through its login node
        from launcher.execute.scheduled_reattach import SlurmRun

        return SlurmRun()
    if provider == "vast":
        from launcher.providers.vast.release import RentedRun

        return RentedRun()
    if record.extra.get("hosts"):
        from launcher.providers.ssh_hosts import SshHosts

        return SshHosts()
    from launcher.providers.local import LocalMachine

    return LocalMachine()

