"""`ddpctl doctor`: the preflight checks (login, python/torch, GPUs or cores, disk, clock offset, rendezvous
reachability) as a table or JSON, one row per host."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.table import Table

from launcher.errors import DdpctlError, HostError
from launcher.execute.hosts.bandwidth import measure, summary_lines
from launcher.planning.clock_offset import SKEW_LIMIT, ClockSkew, widest_skew
from launcher.planning.host_round import ProbeAnswer, probe_all
from launcher.planning.preflight import REACH_TIMEOUT, HostFacts, Problem, check_requirements, reached_port
from launcher.planning.rdzv_reservation import listen_request
from launcher.results.progress import console, listing
from launcher.transport.hostsession import HostSession
from launcher.transport.parallel import HostOutcome
from launcher.transport.ssh import resolve_target

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions


def run_doctor(options: UpOptions, *, gpus: int, python: str, rdzv_port: int, json_out: bool,
               bandwidth_bytes: int = 0) -> bool:
    """Check each host and the network between them in one probe round trip per host (node 0 listens on the
    rendezvous port, the others connect to it); print the findings; True when a run could start. With
    `bandwidth_bytes`, once every check passed, all-reduce bandwidth and latency are measured up to that size."""
    targets = [resolve_target(h, options.ssh_config, options.identity_file) for h in options.hosts]
    with HostSession(targets, options) as session:
        count = len(targets)
        listen = None
        if count > 1:  # nothing is reserved (no run id): the port is only tried
            listen = listen_request(addr=options.rdzv_addr, own=not options.rdzv_addr, hostname=targets[0].hostname,
                                    port=rdzv_port, expect=count - 1, seconds=REACH_TIMEOUT + 20, any_free=False,
                                    run_id=None)
        outcomes = probe_all([session.conn(i) for i in range(count)], session.labels, python, listen=listen,
                             connect_timeout=REACH_TIMEOUT, timeout=options.connect_timeout + 90)
        rows, facts = _host_rows(outcomes)
        problems = check_requirements(facts, gpus, runs_host_torch=True) if len(facts) == len(rows) else []
        skew = widest_skew(session.labels, [o.value.clock if o.value else None for o in outcomes])
        if skew is not None and skew.matters:
            problems.append(Problem(None, skew.problem()))
        network: str | None = None
        if listen is not None and len(facts) == len(rows):
            node0 = outcomes[0].value
            addr0 = (node0.addr if node0 is not None else None) or options.rdzv_addr or targets[0].hostname
            try:
                port = reached_port(outcomes, session.labels, addr0, rdzv_port)
                network = f"every node reached node 0 at {addr0}:{port}"
            except HostError as e:
                problems.append(Problem(e.host, e.reason))
            except DdpctlError as e:
                problems.append(Problem(None, str(e)))
        measured = _bandwidth(session, facts, python, rdzv_port, bandwidth_bytes, problems) if bandwidth_bytes else None
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
        figures = {"busbw_gbit_s": measured["busbw_gbit_s"], "latency_ms": measured["latency_ms"],
                   "bandwidth": measured} if measured else {}
        print(json.dumps({"ok": ok, "hosts": rows, "problems": general, "network": network,
                          "clock_skew": _skew_json(skew), **figures}, indent=2))
        return ok
    _print_findings(rows, outcomes, general, network, skew, measured)
    return ok


def _print_findings(rows: list[dict[str, Any]], outcomes: list[HostOutcome[int, ProbeAnswer]], general: list[str],
                    network: str | None, skew: ClockSkew | None, measured: dict[str, Any] | None) -> None:
    """The plain output: the hosts' table (stdout), then each problem and what was measured (stderr)."""
    table = Table(title="ddpctl doctor")
    table.add_column("host", overflow="fold")  # the whole user@host:port, wrapped if it must be
    for column in ("python", "torch", "GPUs", "cores", "free disk", "address", "clock", "ready"):
        table.add_column(column)
    for row, outcome in zip(rows, outcomes, strict=True):
        clock = outcome.value.clock if outcome.value is not None else None
        table.add_row(row["host"], str(row.get("python", "-")), str(row.get("torch", "-")), str(row.get("gpus", "-")),
                      str(row.get("cpus", "-")), f"{row.get('disk_free_gb', '-')} GB", str(row.get("address", "-")),
                      clock.shown if clock else "unknown", "no" if row["problems"] else "yes")
    listing.print(table)
    for row in rows:
        for text in row["problems"]:
            console.print(f"{row['host']}: {text}", markup=False)
    for text in general:
        console.print(text, markup=False)
    if network:
        console.print(network)
    if skew is not None and not skew.matters:
        console.print(f"clocks: {skew.ahead} is {skew.seconds:.2g} s ahead of {skew.behind} (± {skew.margin:.2g} s), "
                      f"within the {SKEW_LIMIT:g} s torchrun's rendezvous tolerates", markup=False)
    for line in summary_lines(measured) if measured else []:
        console.print(line, markup=False)


def _bandwidth(session: HostSession, facts: list[HostFacts], python: str, port: int, max_bytes: int,
               problems: list[Problem]) -> dict[str, Any] | None:
    """The measurement (launcher/execute/hosts/bandwidth.py) where the checks passed; else why not, among the
    problems."""
    if len(facts) < 2 or len(facts) != len(session.labels):
        problems.append(Problem(None, "--bandwidth measures between nodes: give two --host or more, each reached"))
        return None
    if problems:
        return None  # named already: a measurement could only fail on them
    try:
        return measure([session.conn(i) for i in range(len(facts))], facts, python=python, port=port,
                       max_bytes=max_bytes)
    except DdpctlError as e:
        problems.append(Problem(None, str(e)))
        return None


def _host_rows(outcomes: list[HostOutcome[int, ProbeAnswer]]) -> tuple[list[dict[str, Any]], list[HostFacts]]:
    """A row per host (what it is, or why it could not be asked), and the facts of those that answered."""
    rows: list[dict[str, Any]] = []
    facts: list[HostFacts] = []
    for outcome in outcomes:
        row: dict[str, Any] = {"host": outcome.label, "ok": outcome.error is None, "problems": []}
        if outcome.value is None:
            row["problems"].append(_short(outcome.error))
        else:
            found = outcome.value.facts
            facts.append(found)
            row.update(python=found.python, torch=found.torch, gpus=found.gpus, cpus=found.cpus,
                       disk_free_gb=round(found.disk_free / 2**30, 1), address=found.address,
                       clock=outcome.value.clock.to_json() if outcome.value.clock else None)
        rows.append(row)
    return rows, facts


def _skew_json(skew: ClockSkew | None) -> dict[str, Any] | None:
    """The widest skew between two hosts' clocks, and whether it matters (None: fewer than two measured)."""
    if skew is None:
        return None
    return {"ahead": skew.ahead, "behind": skew.behind, "seconds": round(skew.seconds, 4),
            "uncertainty_s": round(skew.margin, 4), "limit_s": SKEW_LIMIT, "matters": skew.matters}


def _short(error: BaseException | None) -> str:
    return str(error).split(": ", 1)[-1] if str(error) else type(error).__name__
