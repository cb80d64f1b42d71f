"""`ddpctl status | logs | pull | down | doctor`: reattach to a run from its local run directory alone."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from launcher.errors import DdpctlError
from launcher.hosts import parse_host
from launcher.progress import console
from launcher.rundir import find_run

if TYPE_CHECKING:
    from launcher.up import UpOptions

RUN_ARG = typer.Argument(None, help="Run id or directory (default: the newest run).")
RUNS_DIR = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live.")
ACCEPT = typer.Option(False, "--accept-new-host-keys", help="Trust and record unknown host keys.")
IDENTITY = typer.Option(None, "--identity-file", "-i", help="SSH private key.")
TIMEOUT = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each SSH connection.")


def _options(runs_dir: Path, identity_file: Path | None = None, accept: bool = False,
             timeout: float = 10.0) -> UpOptions:
    from launcher.up import UpOptions

    return UpOptions(runs_dir=runs_dir, identity_file=identity_file, accept_new_host_keys=accept,
                     connect_timeout=timeout, show_progress=False)


def status(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, json_out: bool = typer.Option(False, "--json"),
           identity_file: Path | None = IDENTITY, connect_timeout: float = TIMEOUT,
           rented: bool = typer.Option(False, "--rented", help="List every Vast.ai machine still rented (and "
                                       "billing) by any run under --runs-dir.")) -> None:
    """Where a run stands: each node's process state and progress, and what was pulled."""
    from launcher.remote import poll_states, reattach
    from launcher.vast.lifecycle import is_released, offline_rows, print_rented, rented_rows, say

    if rented:
        print_rented(runs_dir, json_out)
        return
    run_dir = find_run(runs_dir, run)
    record = run_dir.record()
    rows = []
    if record.get("hosts") and not is_released(record):  # a destroyed machine's address may be someone else's now
        with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
            states = poll_states(session, run_dir)
        for index, state in enumerate(states):
            progress = (state.progress or {}) if state else {}
            rows.append({"node": index, "host": session.labels[index],
                         "state": state.label if state else "unreachable",
                         "exit_code": state.exit_code if state else None,
                         "epoch": progress.get("epoch"), "epochs": progress.get("epochs")})
    elif record.get("provider") == "vast":  # released, or never got as far as starting: nothing to reach
        rows = offline_rows(run_dir)
    else:
        events = run_dir.events()
        exited = [e for e in events if e["event"] in ("exited", "stopped")]
        summary_exists = (run_dir.path / "summary.json").exists()
        local_state = "finished" if summary_exists else ("ended" if exited else "running or interrupted")
        rows.append({"node": 0, "host": "local", "state": local_state,
                     "exit_code": exited[-1].get("exit_code") if exited else None, "epoch": None, "epochs": None})
    extra = {k: record[k] for k in ("instances", "cost_usd") if k in record}
    if json_out:
        print(json.dumps({"run": run_dir.run_id, "path": str(run_dir.path), "nodes": rows, **extra}, indent=2))
        return
    table = Table(title=f"run {run_dir.run_id}")
    for column in ("node", "host", "state", "exit", "epoch"):
        table.add_column(column)
    for row in rows:
        epoch = f"{row['epoch']}/{row['epochs']}" if row["epoch"] else "-"
        exit_code = "-" if row["exit_code"] is None else str(row["exit_code"])
        table.add_row(str(row["node"]), str(row["host"]), str(row["state"]), exit_code, epoch)
    console.print(table)
    still = rented_rows(runs_dir)
    if still:
        say(f"{len(still)} Vast.ai machine(s) of run(s) {', '.join(sorted({r['run'] for r in still}))} are still "
            "rented and billing: see `ddpctl status --rented`; stop them with `ddpctl down RUN`", style="yellow")


def logs(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, node: int = typer.Option(0, "--node"),
         follow: bool = typer.Option(False, "--follow", "-f"), lines: int = typer.Option(50, "--lines", "-n"),
         identity_file: Path | None = IDENTITY, connect_timeout: float = TIMEOUT) -> None:
    """Print a node's torchrun output (`-f` to keep following it)."""
    from launcher.remote import node_workspaces, reattach
    from launcher.remote_node import read_state

    run_dir = find_run(runs_dir, run)
    if not run_dir.record().get("hosts"):
        path = run_dir.path / "torchrun.out"
        print("\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "")
        return
    workspaces = node_workspaces(run_dir)
    if not 0 <= node < len(workspaces):
        raise DdpctlError(f"--node {node}: run {run_dir.run_id} has nodes 0-{len(workspaces) - 1}")
    with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
        conn = session.conn(node)
        log = f"{workspaces[node]}/torchrun.out"
        result = conn.run(["tail", "-n", str(lines), log], timeout=30)
        print(result.stdout, end="")
        offset = int(conn.run(["wc", "-c", log], timeout=30).stdout.split()[0] or 0) if follow else 0
        while follow:
            state = read_state(conn, workspaces[node])
            chunk = conn.run(["tail", "-c", f"+{offset + 1}", log], timeout=30).stdout
            offset += len(chunk.encode())
            print(chunk, end="", flush=True)
            if state.finished:
                break
            time.sleep(1.0)


def pull(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, identity_file: Path | None = IDENTITY,
         connect_timeout: float = TIMEOUT) -> None:
    """Fetch every node's outputs into the run directory (incremental, sha256-verified)."""
    from launcher.remote import pull_run, reattach

    run_dir = find_run(runs_dir, run)
    with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
        stats = pull_run(session, run_dir)
    moved = sum(int(s.get("bytes_fetched", 0)) for s in stats)
    console.print(f"pulled {moved:,} bytes into {run_dir.path}/nodes (all files verified)")


def down(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, identity_file: Path | None = IDENTITY,
         connect_timeout: float = TIMEOUT, force: bool = typer.Option(False, "--force", help="Destroy rented "
         "machines even when their results could not be verified.")) -> None:
    """Stop every node's processes, then pull what they wrote (and release rented machines)."""
    from launcher.remote import pull_run, reattach, stop_all

    run_dir = find_run(runs_dir, run)
    if run_dir.record().get("instances"):  # rented: pull and verify, then destroy (refused unverified w/o --force)
        from launcher.vast.lifecycle import release_run

        release_run(run_dir, _options(runs_dir, identity_file, False, connect_timeout), force=force)
        return
    with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
        stop_all(session, run_dir)
        pull_run(session, run_dir)
    console.print(f"stopped run {run_dir.run_id}; results in {run_dir.path}")


def doctor(host: list[str] = typer.Option(..., "--host", help="Hosts to check; repeat."),
           gpus: int = typer.Option(1, "--gpus"), python: str = typer.Option("python3", "--python"),
           rdzv_addr: str | None = typer.Option(None, "--rdzv-addr"), rdzv_port: int = typer.Option(29400),
           identity_file: Path | None = IDENTITY, accept_new_host_keys: bool = ACCEPT,
           connect_timeout: float = TIMEOUT, json_out: bool = typer.Option(False, "--json")) -> None:
    """Check hosts before a run: login, python/torch, GPUs or cores, disk, and reachability of node 0."""
    from launcher.doctor import run_doctor
    from launcher.up import UpOptions

    options = UpOptions(hosts=tuple(parse_host(h) for h in host), identity_file=identity_file,
                        accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout,
                        rdzv_addr=rdzv_addr)
    if not run_doctor(options, gpus=gpus, python=python, rdzv_port=rdzv_port, json_out=json_out):
        raise DdpctlError("some hosts are not ready for a run: see the problems listed above")


def register(app: typer.Typer) -> None:
    for command in (status, logs, pull, down, doctor):
        app.command(name=command.__name__)(command)
