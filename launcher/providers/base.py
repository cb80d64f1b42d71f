"""What a provider is to the rest of the launcher: it acquires hosts for a run and releases them afterwards.

`up` on hosts is: provider.acquire -> the executor runs the plan on what was acquired -> provider.release (after
the verified pull), or provider.release_after_failure; provider.close in every case (launcher.execute.up).
A provider never imports the executor: it hands it hosts, and what it needs of the executor (a final pull, the
signal that interrupted `up`) it is lent as `ExecutorCalls` when the executor makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from launcher.planning.plan import NodeHost
    from launcher.planning.request import UpOptions, UpResult
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec
    from launcher.transport.hostsession import HostSession


@dataclass
class AcquiredHosts:
    """Hosts ready for the executor: connections to them and what the provider knows about them."""

    spec: RunSpec  # the spec with the provider's layout (e.g. one node per rented machine)
    options: UpOptions  # the options the executor runs with (a provider may pin the runtime or host keys)
    session: HostSession | None  # None: this machine (launcher.places.local.machine), started here without SSH
    hosts: list[NodeHost] | None = None  # addresses the provider knows better than the hosts (overlay networks)
    record: dict[str, Any] = field(default_factory=dict)  # the provider's fields for run.json
    run_dir: RunDir | None = None  # made by the provider when it must record what it acquired before the run
    watch: Callable[[], str] | None = None  # called on every poll of the run (a cost display, a budget stop)


@dataclass(frozen=True)
class ExecutorCalls:
    """What the executor lends a provider (launcher.execute.up.executor_calls)."""

    pull_run: Callable[[HostSession, RunDir], object]  # every node's outputs into the run directory, verified
    stop_cause: Callable[[], str]  # what interrupted `up`, as the user knows it: Ctrl-C, SIGTERM or SIGHUP
    # Around work before anything starts on a host: an interruption becomes one line saying nothing was started.
    nothing_started_if_interrupted: Callable[[str], AbstractContextManager[None]]


class HostProvider(Protocol):
    """Where a run's hosts come from."""

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan that would run, acquiring nothing."""
        ...

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """Get hosts for the run and connect to them; on failure, give back whatever was taken, then raise."""
        ...

    def release(self, result: UpResult) -> UpResult:
        """The run ended and its results were pulled and verified: give the hosts back (or say why not)."""
        ...

    def release_after_failure(self, error: BaseException) -> None:
        """The run failed: give back what was acquired, and raise a message saying what happened (or return)."""
        ...

    def close(self) -> None:
        """Close connections; called last, whatever happened."""
        ...
