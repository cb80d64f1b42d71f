"""`ddpctl down` of a rented run: stop its nodes, pull and verify what they wrote, then destroy its machines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import DdpctlError
from launcher.providers.vast.ledger import Ledger, destroy_all, live, say
from launcher.results.rundir import RunDir

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions
    from launcher.providers.vast.client import VastClient


def vast_client() -> VastClient:
    """An API client with the saved (or $VAST_API_KEY) key."""
    from launcher.providers.vast.apikey import load_api_key
    from launcher.providers.vast.client import VastClient

    return VastClient(load_api_key())


def release_run(run_dir: RunDir, options: UpOptions, force: bool = False) -> None:
    """`ddpctl down` of a rented run: stop the nodes, pull and verify everything, then destroy the machines.

    When the results cannot be pulled and verified the machines are kept (they hold the only copy) unless
    `force`. A run whose training never started has nothing to pull."""
    ledger = Ledger(run_dir)
    if not live(ledger.instances):
        say(f"run {run_dir.run_id} holds no rented machine any more (cost ${ledger.cost():.4f})")
        return
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
    say(f"run {run_dir.run_id}: machines destroyed (verified); it cost ${cost:.4f}; results in "
        f"{run_dir.path}")


def _stop_and_pull(run_dir: RunDir, options: UpOptions) -> str | None:
    """Stop every node and pull; None when every file came back verified, else what went wrong."""
    from launcher.execute.on_hosts import pull_run, reattach, stop_all

    try:
        with reattach(run_dir, options) as session:
            stop_all(session, run_dir)
            pull_run(session, run_dir)
    except DdpctlError as exc:
        return str(exc).splitlines()[0]
    return None
