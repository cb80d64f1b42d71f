"""The bill of a rented run: which instances it created (kept in run.json from the moment each exists), what
they cost, destroying them (verified), `ddpctl down` for rented runs, and the list of what is still rented.

run.json `instances`: one object per instance the run ever created, in creation order: `instance_id`, `node`,
`dph` ($/hour, disk included), `created_at`, `state` (starting | failed | rented | destroyed | destroy_failed),
`destroyed_at`, plus RentedInstance.to_json() once it ran. `cost_usd` at the top is the spend so far (final once
`released_at` is set).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.providers.vast.models import RentedInstance, TeardownResult
from launcher.results.progress import console
from launcher.results.rundir import RUN_FILE, RunDir, write_json_atomic

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions
    from launcher.providers.vast.client import VastClient

LIVE_STATES = frozenset({"starting", "failed", "rented", "destroy_failed"})  # may be billing


def say(text: str, style: str | None = None) -> None:
    """One message on stderr, taken literally (ids and paths hold brackets) and never wrapped mid-command."""
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def instance_cost(inst: dict[str, Any], now: float) -> float:
    """Dollars one recorded instance cost: its hourly price from creation to destruction (or to `now`)."""
    end = inst.get("destroyed_at") or now
    return float(inst.get("dph") or 0.0) * max(0.0, end - float(inst.get("created_at") or end)) / 3600.0


def run_cost(instances: Iterable[dict[str, Any]], now: float | None = None) -> float:
    """Dollars spent by every instance a run created."""
    now = time.time() if now is None else now
    return sum(instance_cost(i, now) for i in instances)


def live(instances: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instances that may still be billing."""
    return [i for i in instances if i.get("state") in LIVE_STATES]


class Ledger:
    """A run's instances, written to run.json and events.jsonl as they are created, become ready, or go."""

    def __init__(self, run_dir: RunDir, clock: Callable[[], float] = time.time) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self.instances: list[dict[str, Any]] = list(run_dir.record().get("instances") or [])

    def _find(self, instance_id: int) -> dict[str, Any]:
        """The record of an instance; made on the spot if its creation was not recorded (a Ctrl-C landed between
        the create and our write), so that what became of it is never lost."""
        found = next((i for i in self.instances if i["instance_id"] == instance_id), None)
        if found is None:
            found = {"instance_id": instance_id, "dph": None, "created_at": self.clock(), "state": "starting",
                     "destroyed_at": None}
            self.instances.append(found)
        return found

    def save(self) -> None:
        self.run_dir.update_record(instances=self.instances, cost_usd=round(self.cost(), 6))

    def cost(self) -> float:
        return run_cost(self.instances, self.clock())

    def hourly_rate(self) -> float:
        """$/hour of everything still rented."""
        return sum(float(i.get("dph") or 0.0) for i in live(self.instances))

    def on_provision_event(self, event: dict[str, Any]) -> None:
        """provision()'s on_event: record each instance id the moment it exists, and what became of it."""
        now = self.clock()
        fields = {k: v for k, v in event.items() if k != "event"}
        self.run_dir.event(str(event["event"]), **fields)
        # provision destroys a failed instance before its next call; any event after the failure marks it gone
        for inst in self.instances:
            if inst["state"] == "failed":
                inst.update(state="destroyed", destroyed_at=now)
        kind, iid = event["event"], event.get("instance_id")
        if kind == "vast.instance_created":
            self.instances.append({"instance_id": iid, "node": event.get("node"), "offer_id": event.get("offer_id"),
                                   "machine_id": event.get("machine_id"), "dph": event.get("dph"),
                                   "created_at": now, "state": "starting", "destroyed_at": None})
        elif kind == "vast.instance_failed":
            self._find(int(str(iid))).update(state="failed")
        elif kind in ("vast.instance_destroyed", "vast.destroy_failed"):
            destroyed = kind == "vast.instance_destroyed"
            self._find(int(str(iid))).update(state="destroyed" if destroyed else "destroy_failed",
                                             destroyed_at=now if destroyed else None)
        self.save()

    def rented(self, rented: list[RentedInstance]) -> None:
        """Provisioning succeeded: every instance it created but did not return was destroyed by it."""
        ready = {r.instance_id: r for r in rented}
        for inst in self.instances:
            if inst["instance_id"] in ready:
                r = ready[inst["instance_id"]]
                inst.update(r.to_json(), state="rented", created_at=min(inst["created_at"], r.created_at))
            elif inst["state"] in ("starting", "failed"):
                inst.update(state="destroyed", destroyed_at=inst.get("destroyed_at") or self.clock())
        self.save()

    def set_overlay_ips(self, ips: dict[int, str]) -> None:
        for iid, ip in ips.items():
            self._find(iid)["overlay_ip"] = ip
        self.save()

    def record_teardown(self, results: list[TeardownResult], reason: str) -> None:
        for res in results:
            inst = self._find(res.instance_id)
            inst.update(state="destroyed" if res.destroyed else "destroy_failed", destroyed_at=res.destroyed_at)
            self.run_dir.event("vast.instance_destroyed" if res.destroyed else "vast.destroy_failed",
                               instance_id=res.instance_id, reason=reason, error=res.error)
        if not live(self.instances):
            self.run_dir.update_record(released_at=self.clock())
        self.save()


def destroy_all(client: VastClient, ledger: Ledger, reason: str) -> float:
    """Destroy every instance of the run that may still bill (each verified gone) and return the run's cost.

    A Ctrl-C during this is held back until it is done: stopping halfway would leave machines billing.
    Raises a one-line DdpctlError naming any instance that could not be verified destroyed."""
    from launcher.providers.vast.teardown import teardown

    ids = [int(i["instance_id"]) for i in live(ledger.instances)]
    overlay = next((i.get("overlay_name") for i in ledger.instances if i.get("overlay_name")), None)
    ledger.run_dir.event("vast.teardown", reason=reason, instances=ids)
    interrupted = False
    while True:
        try:
            results = teardown(client, ids, overlay_name=overlay)
            break
        except KeyboardInterrupt:
            interrupted = True
    ledger.record_teardown(results, reason)
    cost = ledger.cost()
    write_summary_cost(ledger.run_dir, cost)
    failed = [r for r in results if not r.destroyed]
    if failed:
        raise DdpctlError("could not verify that Vast.ai instance(s) " + ", ".join(str(r.instance_id) for r in failed)
                          + f" are destroyed ({failed[0].error}); they may still be billing: check "
                          "https://console.vast.ai and run `ddpctl down` again")
    if interrupted:
        raise KeyboardInterrupt
    return cost


def write_summary_cost(run_dir: RunDir, cost: float) -> None:
    """Put the cost into summary.json, when the trainer wrote one (run.json always holds it)."""
    path = run_dir.path / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(summary, dict):
        summary["cost_usd"] = round(cost, 6)
        write_json_atomic(path, summary)


def vast_client() -> VastClient:
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


def is_released(record: dict[str, Any]) -> bool:
    """A rented run whose machines are all destroyed (nothing to reach over SSH any more)."""
    return bool(record.get("instances")) and not live(record["instances"])


def offline_rows(run_dir: RunDir) -> list[dict[str, Any]]:
    """`ddpctl status` rows of a rented run that has no machine to ask: from what was pulled and recorded."""
    record = run_dir.record()
    rows = []
    for node in record.get("nodes") or []:
        code = run_dir.path / "nodes" / str(node["index"]) / "exit_code"
        exit_code = int(code.read_text().strip()) if code.is_file() and code.read_text().strip().isdigit() else None
        rows.append({"node": node["index"], "host": node["label"], "state": "machine destroyed",
                     "exit_code": exit_code, "epoch": None, "epochs": None})
    if not rows:  # provisioning never ended (or failed): one row per instance created
        rows = [{"node": "-", "host": f"vast:{i['instance_id']}", "state": i["state"], "exit_code": None,
                 "epoch": None, "epochs": None} for i in record.get("instances") or []]
    return rows


def rented_rows(runs_dir: Path, now: float | None = None) -> list[dict[str, Any]]:
    """Every instance that a run under `runs_dir` rented and did not verify destroyed."""
    now = time.time() if now is None else now
    rows = []
    for path in sorted(runs_dir.glob(f"*/{RUN_FILE}")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for inst in live(record.get("instances") or []):
            rows.append({"run": path.parent.name, "instance_id": inst["instance_id"], "state": inst["state"],
                         "gpu_name": inst.get("gpu_name"), "ssh": f"{inst.get('ssh_host')}:{inst.get('ssh_port')}",
                         "dph": inst.get("dph"), "hours": (now - float(inst["created_at"])) / 3600,
                         "cost_usd": round(instance_cost(inst, now), 6)})
    return rows


def print_rented(runs_dir: Path, json_out: bool) -> None:
    """`ddpctl status --rented`: the machines local runs still rent (they keep billing until `ddpctl down`)."""
    rows = rented_rows(runs_dir)
    if json_out:
        print(json.dumps({"rented": rows}, indent=2))
        return
    if not rows:
        say(f"no run under {runs_dir} holds a rented machine")
        return
    from rich.table import Table

    table = Table(title="still rented: billing until `ddpctl down RUN`")
    for column in ("run", "instance", "state", "GPU", "ssh", "$/hour", "hours", "cost so far"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["run"], str(r["instance_id"]), r["state"], str(r["gpu_name"] or "?"), r["ssh"],
                      f"{float(r['dph'] or 0):.4f}", f"{r['hours']:.2f}", f"${r['cost_usd']:.4f}")
    console.print(table)
    total = sum(float(r["dph"] or 0) for r in rows)
    say(f"{len(rows)} machine(s) billing ${total:.4f}/hour in all")
