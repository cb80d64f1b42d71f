"""What rented runs still hold: `ddpctl status` rows of a run whose machines are gone, and `status --rented`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from launcher.places.vast.ledger import hourly, instance_cost, live, open_intents, say
from launcher.results.progress import listing
from launcher.results.rundir import RUN_FILE, RunDir


def is_released(record: dict[str, Any]) -> bool:
    """A rented run whose machines are all destroyed (nothing to reach over SSH any more), and none of whose
    creates may have rented one unseen."""
    return (bool(record.get("instances")) and not live(record["instances"])
            and not open_intents(record.get("create_intents") or []))


def _intent_rows(run: str, record: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """`status --rented` rows of creates whose answer was lost and whose machine no listing has shown yet."""
    return [{"run": run, "instance_id": None, "state": f"create of offer {i.get('offer_id')} unanswered",
             "gpu_name": None, "ssh": "unknown", "dph": None, "storage_dph": None,
             "hours": (now - float(i.get("sent_at") or now)) / 3600, "cost_usd": None}
            for i in open_intents(record.get("create_intents") or [])]


def offline_rows(run_dir: RunDir) -> list[dict[str, Any]]:
    """`ddpctl status` rows of a rented run that has no machine to ask: from what was pulled and recorded."""
    record = run_dir.record()
    rows = []
    for node in record.get("nodes") or []:
        code = run_dir.path / "nodes" / str(node["index"]) / "exit_code"
        exit_code = int(code.read_text().strip()) if code.is_file() and code.read_text().strip().isdigit() else None
        rows.append({"node": node["index"], "host": node["label"], "state": "machine destroyed",
                     "exit_code": exit_code, "epoch": None, "epochs": None})
    if not rows:  # provisioning never ended (or failed): one row per instance created, and per unanswered create
        rows = [{"node": "-", "host": f"vast:{i['instance_id']}", "state": i["state"], "exit_code": None,
                 "epoch": None, "epochs": None} for i in record.get("instances") or []]
        rows += [{"node": "-", "host": f"vast offer {i.get('offer_id')}", "state": f"create unanswered ({i['state']}): "
                  f"`ddpctl down {run_dir.run_id}` looks for it by label", "exit_code": None, "epoch": None,
                  "epochs": None} for i in open_intents(record.get("create_intents") or [])]
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
                         "dph": hourly(inst), "storage_dph": inst.get("storage_dph"),
                         "hours": (now - float(inst["created_at"])) / 3600,
                         "cost_usd": round(instance_cost(inst, now), 6)})
        rows += _intent_rows(path.parent.name, record, now)
    return rows


def _refresh_states(runs_dir: Path) -> None:
    """Ask the API which machines of each run are stopped (one list request per run), and look up by label the
    creates whose answer was lost (lost_creates.py); as recorded without a key."""
    from launcher.errors import DdpctlError
    from launcher.places.vast.apikey import vast_client
    from launcher.places.vast.ledger import Ledger
    from launcher.places.vast.lost_creates import reconcile_run
    from launcher.places.vast.machine_states import refresh

    runs = [p.parent for p in sorted(runs_dir.glob(f"*/{RUN_FILE}"))]
    ledgers = []
    for path in runs:
        try:
            ledger = Ledger(RunDir.open(path))
        except DdpctlError:
            continue
        if live(ledger.instances) or open_intents(ledger.intents):
            ledgers.append(ledger)
    if not ledgers:
        return
    try:
        with vast_client() as client:
            for ledger in ledgers:
                if open_intents(ledger.intents):
                    reconcile_run(client, ledger)
                if live(ledger.instances):
                    refresh(client, ledger)
    except DdpctlError as exc:
        say(f"as recorded (the Vast.ai API could not be asked: {str(exc).splitlines()[0]})", style="yellow")


def print_rented(runs_dir: Path, json_out: bool) -> None:
    """`ddpctl status --rented`: the machines local runs still rent (they keep billing until `ddpctl down`); their
    states (running or stopped) are asked of the API first when a key is at hand."""
    _refresh_states(runs_dir)
    rows = rented_rows(runs_dir)
    if json_out:
        print(json.dumps({"rented": rows}, indent=2))
        return
    if not rows:
        say(f"no run under {runs_dir} holds a rented machine")
        return
    from rich.table import Table

    table = Table(title="still rented: billing until `ddpctl down RUN` (stopped: storage only)")
    for column in ("run", "instance", "state", "GPU", "ssh", "$/hour", "hours", "cost so far"):
        table.add_column(column)
    for r in rows:
        cost = "unknown" if r["cost_usd"] is None else f"${r['cost_usd']:.4f}"
        rate = "unknown" if r["dph"] is None else f"{float(r['dph']):.4f}"
        table.add_row(r["run"], str(r["instance_id"] or "?"), r["state"], str(r["gpu_name"] or "?"), r["ssh"],
                      rate, f"{r['hours']:.2f}", cost)
    listing.print(table)
    total = sum(float(r["dph"] or 0) for r in rows)
    unsure = sum(1 for r in rows if r["instance_id"] is None)
    say(f"{len(rows) - unsure} machine(s) billing ${total:.4f}/hour in all"
        + (f"; {unsure} create(s) without an answer may have rented more: `ddpctl down RUN` looks for them by label"
           if unsure else ""))
