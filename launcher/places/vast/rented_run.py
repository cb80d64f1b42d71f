"""A rented run after `up`, rebuilt from its run.json (launcher/execute/day2/recorded.py): `status`, `logs`, `pull` and
`down` of a Vast.ai run (down: stop its nodes, pull and verify what they wrote, then destroy its machines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.execute.day2.reattach import host_status_rows, print_host_log, pull_hosts, stop_and_pull_hosts
from launcher.places.vast.apikey import vast_client
from launcher.places.vast.autostop import mark_pulled_command, stopped_at_command
from launcher.places.vast.ledger import Ledger, destroy_all, hourly, live, open_intents, say
from launcher.places.vast.lost_creates import reconcile_run
from launcher.places.vast.rented_list import is_released, offline_rows
from launcher.places.vast.watchdog_state import add_watchdog_states, parse_watchdog, watchdog_command
from launcher.results.rundir import RunDir

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions


# What Vast's states that never become running again by themselves mean (models.py lists its docs' states).
TROUBLE = {"exited": "its container exited", "unknown": "no recent heartbeat from its host",
           "offline": "its host is disconnected"}


class RentedRun:
    """A Vast.ai run's machines, as its run.json records them (see launcher.execute.day2.recorded.RecordedRun)."""

    def status_rows(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Asked of the machines while they are rented and reached; else from what was recorded and pulled (a
        destroyed machine's address may be someone else's now)."""
        record = run_dir.record()
        if record.get("hosts") and not is_released(record):
            stopped = _stopped_rows(run_dir)
            if stopped is not None:
                return stopped
            rows = host_status_rows(run_dir, options)
            if record.get("autostop"):  # each node's watchdog, and a warning for one that will not stop its machine
                add_watchdog_states(rows, _on_nodes(run_dir, options, watchdog_command), run_dir.run_id,
                                    record["autostop"].get("keys"))
            return rows
        return offline_rows(run_dir)

    def print_log(self, run_dir: RunDir, node: int, lines: int, follow: bool, options: UpOptions) -> None:
        """A node's torchrun output, read on its machine."""
        if not run_dir.record().get("hosts"):
            raise DdpctlError(f"run {run_dir.run_id} has no machines to read logs from (none was rented and "
                              f"reached): see `ddpctl status {run_dir.run_id}`")
        print_host_log(run_dir, node, lines, follow, options)

    def pull(self, run_dir: RunDir, options: UpOptions) -> list[dict[str, Any]]:
        """Every node's outputs, fetched and verified (refused once the machines are destroyed); stopped machines
        are started first, and each node's autostop counts its idle time from this pull."""
        problem = _start_stopped(run_dir, options)
        if problem:
            raise DdpctlError(f"cannot pull run {run_dir.run_id}: {problem}")
        pulled = pull_hosts(run_dir, options)
        _on_nodes(run_dir, options, mark_pulled_command)
        _rearm(run_dir, options)
        return pulled

    def down(self, run_dir: RunDir, options: UpOptions, force: bool) -> str:
        """Pull and verify, then destroy the machines (kept when unverified, unless `force`)."""
        return release_run(run_dir, options, force)


def release_run(run_dir: RunDir, options: UpOptions, force: bool = False) -> str:
    """`ddpctl down` of a rented run: stop the nodes, pull and verify everything, then destroy the machines.

    When the results cannot be pulled and verified the machines are kept (they hold the only copy) unless
    `force`. A run whose training never started has nothing to pull. Returns what to tell the user."""
    ledger = Ledger(run_dir)
    if open_intents(ledger.intents):  # a create whose answer was lost: look for its machine by label first
        with vast_client() as client:
            reconcile_run(client, ledger)
    if not live(ledger.instances):
        return f"run {run_dir.run_id} holds no rented machine any more (cost ${ledger.cost():.4f})" + _unsure(ledger)
    problem = None
    if run_dir.record().get("nodes"):
        problem = _start_stopped(run_dir, options, ledger) or _stop_and_pull(run_dir, options)
        ledger = Ledger(run_dir)  # the start may have updated it
    if problem and not force:
        raise DdpctlError(f"the results of run {run_dir.run_id} could not be pulled and verified ({problem}); "
                          f"its {len(live(ledger.instances))} machine(s) are kept and keep billing: fix that and run "
                          f"`ddpctl down {run_dir.run_id}` again, or add --force to destroy them anyway")
    if problem:
        run_dir.event("vast.forced_teardown", error=problem)
        say(f"destroying the machines without verified results (--force): {problem}", style="yellow")
    with vast_client() as client:
        cost = destroy_all(client, ledger, "down --force" if problem else "down")
    return (f"run {run_dir.run_id}: machines destroyed (verified); it cost ${cost:.4f}; results in {run_dir.path}"
            + _unsure(ledger))


def _unsure(ledger: Ledger) -> str:
    """What `down` must add while a create without an answer may still show up by the run's label."""
    unsure = open_intents(ledger.intents)
    if not unsure:
        return ""
    return (f"; but the create(s) of offer(s) {', '.join(str(i.get('offer_id')) for i in unsure)} got no answer and "
            f"no machine labelled for this run is listed yet: run `ddpctl down {ledger.run_dir.run_id}` again in a "
            "few minutes")


def _stopped_rows(run_dir: RunDir) -> list[dict[str, Any]] | None:
    """Status rows from the API when any machine of the run is stopped, or shown exited, unknown or offline (SSH
    cannot reach it), else None."""
    from launcher.places.vast.machine_states import refresh

    ledger = Ledger(run_dir)
    try:
        with vast_client() as client:
            refresh(client, ledger)
    except DdpctlError:
        return None  # no key or no API: ask the machines themselves
    ledger.save()  # the cost as of now, for `status --json` (and every later reader of run.json)
    if not any(i["state"] == "stopped" or i.get("api_state") for i in live(ledger.instances)):
        return None
    rows = []
    for inst in sorted(live(ledger.instances), key=lambda i: i.get("node") or 0):
        state = (f"machine frozen (its GPU bills: ${hourly(inst):.4f}/hour)" if inst.get("frozen")
                 else f"machine stopped (storage ${hourly(inst):.4f}/hour)" if inst["state"] == "stopped"
                 else f"machine {inst['api_state']} ({TROUBLE[inst['api_state']]}); it may bill until `ddpctl down "
                      f"{run_dir.run_id}`" if inst.get("api_state") in TROUBLE
                 else f"machine {inst['state']}")
        rows.append({"node": inst.get("node"), "host": f"vast:{inst['instance_id']}", "state": state,
                     "exit_code": None, "epoch": None, "epochs": None, "dph": hourly(inst)})
    return rows


def _start_stopped(run_dir: RunDir, options: UpOptions, ledger: Ledger | None = None) -> str | None:
    """Start the run's stopped machines (autostop) and record when each stopped; None when all run, else why not."""
    from launcher.places.vast.machine_states import exact_stop_times, start_stopped

    ledger = ledger or Ledger(run_dir)
    if not live(ledger.instances):
        return None
    with vast_client() as client:
        try:
            started = start_stopped(client, ledger)
        except DdpctlError as exc:
            return str(exc).splitlines()[0]
    if started:
        frozen = sum(1 for i in ledger.instances if i["instance_id"] in started and not i.get("stops"))
        say(f"started the {len(started)} stopped machine(s) of run {run_dir.run_id} again "
            f"({start_reason(bool(run_dir.record().get('autostop')), frozen, len(started))})")
        exact_stop_times(ledger, _on_nodes(run_dir, options, stopped_at_command))
    return None


def start_reason(autostop: bool, frozen: int, started: int) -> str:
    """Why the machines `pull` or `down` started were halted: autostop stops (never freezes) them, and only when on."""
    if not autostop:
        return "they were stopped or frozen outside ddpctl: autostop was off"
    if frozen == started:
        return "they were frozen outside ddpctl; autostop stops, it does not freeze"
    return "autostop had stopped them" if not frozen else "autostop had stopped some; others were frozen outside ddpctl"


def _rearm(run_dir: RunDir, options: UpOptions) -> None:
    """After `pull`, every node's watchdog watches again (one that stopped its machine ended with the stop)."""
    from launcher.execute.hosts.run import reattach
    from launcher.places.vast.autostop import start_watchdogs

    if not run_dir.record().get("autostop"):
        return
    # every watchdog that does not watch: stopped with its machine, failed (its error may have passed), or died
    states = _on_nodes(run_dir, options, watchdog_command)
    again = sorted(node for node, text in states.items() if parse_watchdog(text).problem)
    if not again:
        return
    try:
        with reattach(run_dir, options) as session:
            start_watchdogs(session, run_dir, again)
    except DdpctlError as exc:
        say(f"autostop could not be started again ({str(exc).splitlines()[0]}): the machines bill in full "
            f"until `ddpctl down {run_dir.run_id}`", style="bold yellow")
        return
    run_dir.event("vast.autostop_armed", nodes=again, again=True)
    say(f"autostop watches node(s) {again} again")


def _on_nodes(run_dir: RunDir, options: UpOptions, command: Callable[[str], list[str]]) -> dict[int, str]:
    """Run a small command on every node (in its workspace); each node's output, empty where it failed."""
    from launcher.execute.hosts.run import node_workspaces, reattach

    outputs: dict[int, str] = {}
    with reattach(run_dir, options) as session:
        for index, workspace in enumerate(node_workspaces(run_dir)):
            try:
                result = session.conn(index).run(command(workspace), timeout=30)
            except DdpctlError:
                continue
            outputs[index] = result.stdout if result.exit_code == 0 else ""
    return outputs


def _stop_and_pull(run_dir: RunDir, options: UpOptions) -> str | None:
    """Stop every node and pull; None when every file came back verified, else what went wrong."""
    try:
        stop_and_pull_hosts(run_dir, options)
    except DdpctlError as exc:
        return str(exc).splitlines()[0]
    return None
