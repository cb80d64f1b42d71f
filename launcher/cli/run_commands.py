"""`ddpctl status | logs | pull | down | doctor`: reattach to a run from its local run directory alone."""

from __future__ import annotations

import codecs
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from launcher.errors import DdpctlError, SpecError
from launcher.results.progress import console, progress_record
from launcher.results.rundir import RunDir, find_run
from launcher.spec.hosts import parse_hosts
from launcher.spec.run_spec import check_port, check_python
from launcher.spec.validate import check_at_least, check_runs_dir, check_seconds

if TYPE_CHECKING:
    from launcher.execute.request import UpOptions

RUN_ARG = typer.Argument(None, help="Run id or directory (default: the newest run).")
RUNS_DIR = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live.")
ACCEPT = typer.Option(False, "--accept-new-host-keys", help="Trust and record unknown host keys.")
IDENTITY = typer.Option(None, "--identity-file", "-i", help="SSH private key.")
TIMEOUT = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each SSH connection.")


def _options(runs_dir: Path, identity_file: Path | None = None, accept: bool = False,
             timeout: float = 10.0) -> UpOptions:
    from launcher.execute.request import UpOptions

    return UpOptions(runs_dir=runs_dir, identity_file=identity_file, accept_new_host_keys=accept,
                     connect_timeout=timeout, show_progress=False)


def _find_run(runs_dir: Path, run: str | None) -> RunDir:
    """find_run, after refusing a --runs-dir that is a file where it would be searched."""
    if run is None or not Path(run).is_dir():
        check_runs_dir(runs_dir)
    return find_run(runs_dir, run)


def _ran_here(run_dir: RunDir) -> bool:
    """A local run: no hosts, nothing rented (a Vast.ai run records its instances before it has hosts)."""
    record = run_dir.record()
    return not record.get("hosts") and record.get("provider", "local") == "local"


def status(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, json_out: bool = typer.Option(False, "--json"),
           identity_file: Path | None = IDENTITY, connect_timeout: float = TIMEOUT,
           rented: bool = typer.Option(False, "--rented", help="List every Vast.ai machine still rented (and "
                                       "billing) by any run under --runs-dir.")) -> None:
    """Where a run stands: each node's process state and progress, and what was pulled."""
    from launcher.execute.on_hosts import poll_states, reattach
    from launcher.providers.vast.ledger import say
    from launcher.providers.vast.rented_list import is_released, offline_rows, print_rented, rented_rows

    check_seconds(connect_timeout, "--connect-timeout")
    if rented:
        print_rented(check_runs_dir(runs_dir), json_out)
        return
    run_dir = _find_run(runs_dir, run)
    record = run_dir.record()
    rows = []
    if record.get("hosts") and not is_released(record):  # a destroyed machine's address may be someone else's now
        with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
            states = poll_states(session, run_dir)
        for index, state in enumerate(states):
            progress = (progress_record(state.progress) or {}) if state else {}
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
    from launcher.execute.on_hosts import node_workspaces, reattach
    from launcher.runtimes.native import read_state

    check_seconds(connect_timeout, "--connect-timeout")
    if lines < 1:
        raise SpecError(f"--lines must be at least 1, got {lines}")
    run_dir = _find_run(runs_dir, run)
    if _ran_here(run_dir):
        if node != 0:
            raise SpecError(f"--node {node}: run {run_dir.run_id} ran on this machine; it has node 0 only")
        _local_logs(run_dir, lines, follow)
        return
    if not run_dir.record().get("hosts"):
        raise DdpctlError(f"run {run_dir.run_id} has no machines to read logs from (none was rented and reached): "
                          f"see `ddpctl status {run_dir.run_id}`")
    workspaces = node_workspaces(run_dir)
    if not 0 <= node < len(workspaces):
        raise DdpctlError(f"--node {node}: run {run_dir.run_id} has nodes 0-{len(workspaces) - 1}")
    with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
        conn = session.conn(node)
        log = f"{workspaces[node]}/torchrun.out"
        # No output yet is how every run starts (and how one that never started stays): a note, not an error,
        # so that `logs` in a loop or a script right after `up --detach` does not fail.
        if not conn.run(["test", "-f", log], timeout=30).ok:
            _no_output_yet(node, follow)
            offset = 0
        else:
            result = conn.run(["tail", "-n", str(lines), log], timeout=30)
            print(result.stdout, end="")
            size = conn.run(["wc", "-c", log], timeout=30).stdout.split() if follow else []
            offset = int(size[0]) if size and size[0].isdigit() else 0
        while follow:
            state = read_state(conn, workspaces[node])
            chunk = conn.run(["tail", "-c", f"+{offset + 1}", log], timeout=30).stdout
            offset += len(chunk.encode())
            print(chunk, end="", flush=True)
            if state.finished:
                break
            time.sleep(FOLLOW_POLL_SECONDS)


FOLLOW_POLL_SECONDS = 1.0
START_GRACE_SECONDS = 30.0


def _no_output_yet(node: int, follow: bool) -> None:
    waiting = "; waiting for it (Ctrl-C to stop)" if follow else " (the run is starting, or it never started)"
    print(f"node {node} has no output yet{waiting}", file=sys.stderr, flush=True)


def _local_logs(run_dir: RunDir, lines: int, follow: bool) -> None:
    """A run on this machine: the end of its torchrun.out, then (with `follow`) what is added until it ends."""
    path = run_dir.path / "torchrun.out"
    offset = 0
    if path.exists():
        data = path.read_bytes()
        offset = len(data)
        text = data.decode(errors="replace")
        print("".join(text.splitlines(keepends=True)[-lines:]), end="", flush=True)
    else:
        _no_output_yet(0, follow and not _local_run_ended(run_dir))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while follow:
        ended = _local_run_ended(run_dir)  # before reading: what it wrote before it ended is still shown
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            print(decoder.decode(chunk), end="", flush=True)
        if ended:
            break
        time.sleep(FOLLOW_POLL_SECONDS)


def _local_run_ended(run_dir: RunDir) -> bool:
    """True once `up` recorded the end of the run, or once its torchrun is gone (`up` itself was killed)."""
    if any(e.get("event") in ("exited", "stopped") for e in run_dir.events()):
        return True
    record = run_dir.record()
    pid = record.get("local_pid")
    if not isinstance(pid, int):  # starting right now (the pid follows within moments), or it never started
        return time.time() - float(record.get("created") or 0) > START_GRACE_SECONDS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (ended, not yet reaped) still answers kill 0
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def pull(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, identity_file: Path | None = IDENTITY,
         connect_timeout: float = TIMEOUT) -> None:
    """Fetch every node's outputs into the run directory (incremental, sha256-verified)."""
    from launcher.execute.on_hosts import pull_run, reattach

    check_seconds(connect_timeout, "--connect-timeout")
    run_dir = _find_run(runs_dir, run)
    if _ran_here(run_dir):
        raise DdpctlError(f"run {run_dir.run_id} is a local run and `pull` is for runs on hosts: its files are "
                          f"already in {run_dir.path}")
    with reattach(run_dir, _options(runs_dir, identity_file, False, connect_timeout)) as session:
        stats = pull_run(session, run_dir)
    moved = sum(int(s.get("bytes_fetched", 0)) for s in stats)
    console.print(f"pulled {moved:,} bytes into {run_dir.path}/nodes (all files verified)")


def down(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, identity_file: Path | None = IDENTITY,
         connect_timeout: float = TIMEOUT, force: bool = typer.Option(False, "--force", help="Destroy rented "
         "machines even when their results could not be verified.")) -> None:
    """Stop every node's processes, then pull what they wrote (and release rented machines)."""
    from launcher.execute.on_hosts import pull_run, reattach, stop_all

    check_seconds(connect_timeout, "--connect-timeout")
    run_dir = _find_run(runs_dir, run)
    if _ran_here(run_dir):
        pid = run_dir.record().get("local_pid")
        raise DdpctlError(f"run {run_dir.run_id} is a local run and `down` is for runs on hosts: stop a local run "
                          "with Ctrl-C where `ddpctl up` runs" + (f" (or `kill {pid}`, its torchrun)" if pid else "")
                          + f"; its files are in {run_dir.path}")
    if run_dir.record().get("instances"):  # rented: pull and verify, then destroy (refused unverified w/o --force)
        from launcher.providers.vast.release import release_run

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
    from launcher.cli.doctor import run_doctor
    from launcher.execute.request import UpOptions

    check_at_least(gpus, 1, "--gpus")
    check_python(python)
    check_port(rdzv_port)
    check_seconds(connect_timeout, "--connect-timeout")
    options = UpOptions(hosts=parse_hosts(host), identity_file=identity_file,
                        accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout,
                        rdzv_addr=rdzv_addr)
    if not run_doctor(options, gpus=gpus, python=python, rdzv_port=rdzv_port, json_out=json_out):
        raise DdpctlError("some hosts are not ready for a run: see the problems listed above")


def register(app: typer.Typer) -> None:
    for command in (status, logs, pull, down, doctor):
        app.command(name=command.__name__)(command)
