"""`ddpctl doctor`: every check `up` makes before starting, as a table (or JSON), one row per host."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.table import Table

from launcher.errors import DdpctlError
from launcher.hostsession import HostSession
from launcher.parallel import run_on_hosts
from launcher.preflight import HostFacts, check_rendezvous_reachable, check_requirements, probe_host
from launcher.progress import console
from launcher.ssh import resolve_target

if TYPE_CHECKING:
    from launcher.up import UpOptions


def run_doctor(options: UpOptions, *, gpus: int, python: str, rdzv_port: int, json_out: bool) -> bool:
    """Check each host and the network between them; print the findings; True when a run could start."""
    targets = [resolve_target(h, options.ssh_config, options.identity_file) for h in options.hosts]
    rows: list[dict[str, Any]] = []
    with HostSession(targets, options) as session:
        outcomes = run_on_hosts(list(range(len(targets))),
                                lambda i: probe_host(session.conn(i), python, session.label_of(i)),
                                timeout=options.connect_timeout + 90, label=session.label_of)
        facts: list[HostFacts] = []
        for outcome in outcomes:
            row: dict[str, Any] = {"host": outcome.label, "ok": outcome.error is None, "problems": []}
            if outcome.value is None:
                row["problems"].append(_short(outcome.error))
            else:
                facts.append(outcome.value)
                info = outcome.value.info
                row.update(python=info.get("python"), torch=info.get("torch"), gpus=info.get("gpus"),
                           cpus=info.get("cpus"), disk_free_gb=round(int(info.get("disk_free") or 0) / 2**30, 1),
                           address=outcome.value.address)
            rows.append(row)
        problems = check_requirements(facts, gpus, need_torch=True) if len(facts) == len(rows) else []
        network: str | None = None
        if not any(r["problems"] for r in rows) and len(rows) > 1:
            addr0 = options.rdzv_addr or facts[0].address or targets[0].hostname
            try:
                check_rendezvous_reachable([session.conn(i) for i in range(len(rows))], session.labels, python,
                                           addr0, rdzv_port)
                network = f"every node reached node 0 at {addr0}:{rdzv_port}"
            except DdpctlError as e:
                problems.append(str(e))
    for problem in problems:
        label = problem.split(":", 1)[0]
        for row in rows:
            if row["host"] == label:
                row["problems"].append(problem.split(": ", 1)[1])
                row["ok"] = False
    general = [p for p in problems if p.split(":", 1)[0] not in {r["host"] for r in rows}]
    ok = not general and all(r["ok"] and not r["problems"] for r in rows)
    if json_out:
        print(json.dumps({"ok": ok, "hosts": rows, "problems": general, "network": network}, indent=2))
        return ok
    table = Table(title="ddpctl doctor")
    for column in ("host", "python", "torch", "GPUs", "cores", "free disk", "address", "ready"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["host"], str(row.get("python", "-")), str(row.get("torch", "-")), str(row.get("gpus", "-")),
                      str(row.get("cpus", "-")), f"{row.get('disk_free_gb', '-')} GB", str(row.get("address", "-")),
                      "no" if row["problems"] else "yes")
    console.print(table)
    for row in rows:
        for problem in row["problems"]:
            console.print(f"{row['host']}: {problem}", markup=False)
    for problem in general:
        console.print(problem, markup=False)
    if network:
        console.print(network)
    return ok


def _short(error: BaseException | None) -> str:
    return str(error).split(": ", 1)[-1] if str(error) else type(error).__name__
