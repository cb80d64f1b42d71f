"""This machine, as `up`'s provider: acquiring it gives this machine (no SSH session, so the executor starts the run
here itself), releasing it does nothing; a run here has one node. `status`/`logs`/`down` of a recorded local run,
and the refusal of `pull`, are launcher/execute/day2/recorded.py (with launcher/execute/this_machine/state.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.providers.base import AcquiredHosts

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions, UpResult
    from launcher.spec.run_spec import RunSpec


class LocalMachine:
    """This machine as a run's provider (see launcher.providers.base.HostProvider)."""

    def dry_run(self, spec: RunSpec, options: UpOptions) -> UpResult:
        """The plan a run here would carry out, after the checks it would pass; nothing written."""
        from launcher.execute.this_machine.run import check_local_run
        from launcher.planning.request import UpResult

        _one_node(spec)
        return UpResult(None, 0, None, check_local_run(spec, (options.runs_dir / spec.run_id).resolve()))

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        """This machine: no session (the executor starts the run here), and the fields run.json records for it."""
        _one_node(spec)
        return AcquiredHosts(spec, options, None, record={"hosts": [], "runtime": "native", "provider": "local"})

    def release(self, result: UpResult) -> UpResult:
        """Nothing to give back."""
        return result

    def release_after_failure(self, error: BaseException) -> None:
        """Nothing to give back; the error propagates as it is."""

    def close(self) -> None:
        """Nothing to close."""


def _one_node(spec: RunSpec) -> None:
    if spec.nnodes != 1:
        raise ValueError("a local run has one node")
