"""A rented run's provider after `up`, rebuilt from its run.json: `status`, `logs`, `pull` and `down` of a Vast.ai
run (down: stop its nodes, pull and verify what they wrote, then destroy its machines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.execute.reattach import host_status_rows, print_host_log, pull_hosts, stop_and_pull_hosts
from launcher.providers.vast.ledger import Ledger, destroy_all, live, say
from launcher.providers.vast.rented_list import is_released, offline_rows
from launcher.results.rundir import RunDir

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions
    from launcher.providers.vast.client import VastClient


def vast_client() -> VastClient:
    """An API client with the saved (or $VAST_API_KEY) key."""
    from launcher.providers.vast.apikey import load_api_key
    from launcher.providers.vast.client import VastClient

    return VastClient(load_api_key())


class RentedRun:
    """A Vast.ai run's machines, as its run.json records them (see launcher.providers.base.RunProvider)."""

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Asked of the machines while they are rented and reached; else from what was recorded and pulled (a
        destroyed machine's address may be someone else's now)."""
        record = run_dir.record()
        if record.get("hosts") and not is_released(record):
            return host_status_rows(run_dir, options)
        return offline_rows(run_dir)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """A node's torchrun output, read on its machine."""
        if not run_dir.record().get("hosts"):
            raise DdpctlError(f"run {run_dir.run_id} has no machines to read logs from (none was rented and "
                              f"reached): see `ddpctl status {run_dir.run_id}`")
        print_host_log(run_dir, node, lines, follow, options)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Every node's outputs, fetched and verified (refused once the machines are destroyed)."""
        return pull_hosts(run_dir, options)

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Pull and verify, then destroy the machines (kept when unverified, unless `force`)."""
        return release_run(run_dir, options, force)


def release_run(run_dir: RunDir, options: UpOptions, force: bool = False) -> str:
    """`ddpctl down` of a rented run: stop the nodes, pull and verify everything, then destroy the machines.

    When the results cannot be pulled and verified the machines are kept (they hold the only copy) unless
    `force`. A run whose training never started has nothing to pull. Returns what to tell the user."""
    ledger = Ledger(run_dir)
    if not live(ledger.instances):
        return f"run {run_dir.run_id} holds no rented machine any more (cost ${ledger.cost():.4f})"
    problem = None
    if run_dir.record().get("nodes"):
        problem = _stop_and_pull(run_dir, options)
    if problem and not force:
        raise DdpctlError(f"the results of run {run_dir.run_id} could not be pulled and verified ({problem}); "
                          f"its {len(live(ledger.instances))} machine(s) are kept and keep billing: fix that and run "
                          f"`ddpctl down {run_dir.run_id}` again, or add --force to destroy them anyway")
    if problem:
        run_dir.event("vast.forced_teardown", error=problem)
        say(f"destroying the machines without verified results (--force): {problem}", style="yellow")
    with vast_client() as client:
        cost = destroy_all(client, ledger, "down --force" if problem else "down")
    return f"run {run_dir.run_id}: machines destroyed (verified); it cost ${cost:.4f}; results in {run_dir.path}"


def _stop_and_pull(run_dir: RunDir, options: UpOptions) -> str | None:
    """Stop every node and pull; None when every file came back verified, else what went wrong."""
    try:
        stop_and_pull_hosts(run_dir, options)
    except DdpctlError as exc:
        return str(exc).splitlines()[0]
    return None
