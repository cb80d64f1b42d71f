"""`ddpctl doctor`: the preflight checks (login, python/torch, GPUs or cores, disk, rendezvous reachability)
as a table or JSON, one row per host."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.table import Table

from launcher.errors import DdpctlError, HostError
from launcher.planning.preflight import HostFacts, Problem, check_rendezvous_reachable, check_requirements, probe_host
from launcher.results.progress import console
from launcher.transport.hostsession import HostSession
from launcher.transport.parallel import run_on_hosts
from launcher.transport.ssh import resolve_target

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions


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
                found = outcome.value
                row.update(python=found.python, torch=found.torch, gpus=found.gpus, cpus=found.cpus,
                           disk_free_gb=round(found.disk_free / 2**30, 1), address=found.address)
            rows.append(row)
        problems = check_requirements(facts, gpus, runs_host_torch=True) if len(facts) == len(rows) else []
        network: str | None = None
        if not any(r["problems"] for r in rows) and len(rows) > 1:
            addr0 = options.rdzv_addr or facts[0].address or targets[0].hostname
            try:
                check_rendezvous_reachable([session.conn(i) for i in range(len(rows))], session.labels, python,
                                           addr0, rdzv_port)
                network = f"every node reached node 0 at {addr0}:{rdzv_port}"
            except HostError as e:
                problems.append(Problem(e.host, e.reason))
            except DdpctlError as e:
                problems.append(Problem(None, str(e)))
    general: list[str] = []
    rows_by_host = {r["host"]: r for r in rows}
    for problem in problems:
        if problem.host in rows_by_host:
            rows_by_host[problem.host]["problems"].append(problem.text)
            rows_by_host[problem.host]["ok"] = False
        else:
            general.append(str(problem))
    ok = not general and all(r["ok"] and not r["problems"] for r in rows)
    if json_out:
        print(json.dumps({"ok": ok, "hosts": rows, "problems": general, "network": network}, indent=2))
        return ok
    table = Table(title="ddpctl doctor")
    table.add_column("host", overflow="fold")  # the whole user@host:port, wrapped if it must be
    for column in ("python", "torch", "GPUs", "cores", "free disk", "address", "ready"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["host"], str(row.get("python", "-")), str(row.get("torch", "-")), str(row.get("gpus", "-")),
                      str(row.get("cpus", "-")), f"{row.get('disk_free_gb', '-')} GB", str(row.get("address", "-")),
                      "no" if row["problems"] else "yes")
    console.print(table)
    for row in rows:
        for text in row["problems"]:
            console.print(f"{row['host']}: {text}", markup=False)
    for text in general:
        console.print(text, markup=False)
    if network:
        console.print(network)
    return ok


def _short(error: BaseException | None) -> str:
    return str(error).split(": ", 1)[-1] if str(error) else type(error).__name__
