"""`ddpctl status | logs | pull | down | doctor`: reattach to a run from its local run directory alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from launcher.errors import DdpctlError, SpecError
from launcher.execute.pull_record import incomplete_pull_line
from launcher.places.registry import PLACES, place_of_record
from launcher.results.interruptions import interruption_line
from launcher.results.progress import console, listing
from launcher.results.run_records import restarts_told
from launcher.results.rundir import RunDir, find_run, read_json
from launcher.spec.hosts import parse_hosts
from launcher.spec.run_spec import check_port, check_python
from launcher.spec.validate import check_at_least, check_runs_dir, check_seconds

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions

RUN_ARG = typer.Argument(None, help="Run id or directory (default: the newest run).")
RUNS_DIR = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live.")
ACCEPT = typer.Option(False, "--accept-new-host-keys", help="Trust and record unknown host keys.")
IDENTITY = typer.Option(None, "--identity-file", "-i", help="SSH private key.")
TIMEOUT = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each SSH connection.")


def _options(runs_dir: Path, identity_file: Path | None = None, accept: bool = False,
             timeout: float = 10.0) -> UpOptions:
    from launcher.planning.request import UpOptions

    return UpOptions(runs_dir=runs_dir, identity_file=identity_file, accept_new_host_keys=accept,
                     connect_timeout=timeout, show_progress=False)


def _find_run(runs_dir: Path, run: str | None) -> RunDir:
    """find_run, after refusing a --runs-dir that is a file where it would be searched."""
    if run is None or not Path(run).is_dir():
        check_runs_dir(runs_dir)
    run_dir = find_run(runs_dir, run)
    run_dir.typed_record()  # a corrupt or foreign run.json is one line naming it, before anything connects
    return run_dir


def status(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, json_out: bool = typer.Option(False, "--json"),
           identity_file: Path | None = IDENTITY, connect_timeout: float = TIMEOUT,
           rented: bool = typer.Option(False, "--rented", help="List every Vast.ai machine still rented (and "
                                       "billing) by any run under --runs-dir.")) -> None:
    """Where a run stands: each node's process state and progress, and what was pulled."""
    check_seconds(connect_timeout, "--connect-timeout")
    if rented:
        checked = check_runs_dir(runs_dir)
        for held in PLACES.values():  # what each place still holds (Vast.ai: its rented machines)
            held.print_held(checked, json_out)
        return
    run_dir = _find_run(runs_dir, run)
    rows = place_of_record(run_dir.typed_record()).status_rows(run_dir, _options(runs_dir, identity_file, False,
                                                                               connect_timeout))
    record = run_dir.record()  # after the rows: asking a rented run's API brings its instances and cost up to date
    extra = {k: record[k] for k in ("instances", "cost_usd", "failure", "interruptions") if k in record}
    told = restarts_told(run_dir)  # each restart: its attempt, the nodes that restarted, what caused it
    world = measured_world(run_dir)
    if json_out:
        print(json.dumps({"run": run_dir.run_id, "path": str(run_dir.path), "nodes": rows, **extra,
                          **({"restarts": told} if told else {}),
                          **({"world_size": world} if world is not None else {})}, indent=2))
        return
    table = Table(title=f"run {run_dir.run_id}")
    watchdogs = any("autostop" in row for row in rows)  # a Vast.ai run with autostop: each node's watchdog
    losses = any(row.get("loss") is not None for row in rows)  # the newest progress record's loss, where one has it
    for column in ("node", "host", "state", "exit", "epoch", *(("loss",) if losses else ()), "restarts",
                   *(("autostop",) if watchdogs else ())):
        table.add_column(column)
    for row in rows:
        epoch = f"{row['epoch']}/{row['epochs']}" if row["epoch"] else "-"
        exit_code = "-" if row["exit_code"] is None else str(row["exit_code"])
        loss = [] if not losses else ["-" if row.get("loss") is None else f"{row['loss']:.4g}"]
        table.add_row(str(row["node"]), str(row["host"]), str(row["state"]), exit_code, epoch, *loss,
                      str(row.get("restarts", "-")), *([_autostop_cell(row)] if watchdogs else []))
    listing.print(table)
    for row in rows:  # a node that could not be asked: why (HOST KEY CHANGED: what to do)
        if row.get("error"):
            listing.print(f"node {row['node']}: {row['error']}", markup=False, highlight=False, soft_wrap=True)
    for entry in told:
        cause = entry["cause"]["summary"] if entry.get("cause") else "cause not recorded"
        listing.print(f"restart {entry['attempt']}: {cause}", markup=False, highlight=False, soft_wrap=True)
    for lost in record.get("interruptions") or []:  # --interruptible: each machine lost, and what it took
        listing.print(interruption_line(lost), markup=False, highlight=False, soft_wrap=True)
    if isinstance(record.get("failure"), dict) and record["failure"].get("summary"):  # what `up` named as the cause
        listing.print(f"failure: {record['failure']['summary']}", markup=False, highlight=False)
    if world is not None:
        listing.print(f"world size {world}, as its processes joined (summary.json)", markup=False, highlight=False)
    for held in PLACES.values():
        note = held.held_note(runs_dir)
        if note:
            console.print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)



def measured_world(run_dir: RunDir) -> int | None:
    """The world size the run's summary.json records once it ended (as its ranks saw it: the trainer's, or a
    script's measured from the processes that joined, launcher/results/joined_worlds.py); None before, or unknown."""
    summary = read_json(run_dir.path / "summary.json")
    world = summary.get("world_size") if isinstance(summary, dict) else None
    return world if isinstance(world, int) and not isinstance(world, bool) else None


def _autostop_cell(row: dict[str, object]) -> str:
    """A node's watchdog state and the key it stops its machine with (Vast.ai: the instance's own or a scoped one)."""
    key = {"container": "CONTAINER_API_KEY", "scoped": "scoped key"}.get(str(row.get("autostop_key")))
    return str(row.get("autostop", "-")) + (f" ({key})" if key else "")

def logs(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR,
         node: int | None = typer.Option(None, "--node", help="Show this node's torchrun output (default 0)."),
         rank: int | None = typer.Option(None, "--rank", help="Show this global rank's own output instead (its "
                                         "stdout, and its stderr on stderr), from the newest attempt."),
         attempt: int | None = typer.Option(None, "--attempt", help="With --rank: the output of this attempt "
                                            "(0 = before the first restart; default: the newest)."),
         follow: bool = typer.Option(False, "--follow", "-f"), lines: int = typer.Option(50, "--lines", "-n"),
         identity_file: Path | None = IDENTITY, connect_timeout: float = TIMEOUT) -> None:
    """Print a node's torchrun output, or with --rank a worker's own output (`-f` to keep following it)."""
    check_seconds(connect_timeout, "--connect-timeout")
    if lines < 1:
        raise SpecError(f"--lines must be at least 1, got {lines}")
    if rank is not None and node is not None:
        raise SpecError("--rank and --node both choose what to show: give --rank R (a global rank; its node comes "
                        "from the run's plan) or --node K (that node's torchrun output)")
    if rank is not None and rank < 0:
        raise SpecError(f"--rank {rank}: ranks start at 0")
    if attempt is not None and (rank is None or follow or attempt < 0):
        raise SpecError(f"--attempt {attempt}: give it with --rank R and without -f (it reads one attempt's "
                        "output; -f follows the newest), as a number from 0 (before the first restart)")
    run_dir = _find_run(runs_dir, run)
    options = _options(runs_dir, identity_file, False, connect_timeout)
    if rank is not None:
        place_of_record(run_dir.typed_record()).print_rank_log(run_dir, rank, lines, follow, options, attempt)
        return
    place_of_record(run_dir.typed_record()).print_log(run_dir, node or 0, lines, follow, options)


def pull(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, identity_file: Path | None = IDENTITY,
         connect_timeout: float = TIMEOUT) -> None:
    """Fetch every node's outputs into the run directory (incremental, sha256-verified)."""
    check_seconds(connect_timeout, "--connect-timeout")
    run_dir = _find_run(runs_dir, run)
    stats = place_of_record(run_dir.typed_record()).pull(run_dir, _options(runs_dir, identity_file, False,
                                                                        connect_timeout))
    moved = sum(int(s.get("bytes_fetched", 0)) for s in stats)
    incomplete = incomplete_pull_line(run_dir.path, run_dir.record(),
                                      down_words=place_of_record(run_dir.typed_record()).not_pulled_after_down)
    console.print(f"pulled {moved:,} bytes into {run_dir.path}/nodes " + (
        f"(what came back is verified); {incomplete}" if incomplete else "(all files verified)"),
        markup=False, highlight=False, soft_wrap=True)


def down(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, identity_file: Path | None = IDENTITY,
         connect_timeout: float = TIMEOUT, force: bool = typer.Option(False, "--force", help="Destroy rented "
         "machines even when their results could not be verified.")) -> None:
    """Stop every node's processes, then pull what they wrote (and release rented machines)."""
    check_seconds(connect_timeout, "--connect-timeout")
    run_dir = _find_run(runs_dir, run)
    done = place_of_record(run_dir.typed_record()).down(run_dir, _options(runs_dir, identity_file, False,
                                                                       connect_timeout), force)
    console.print(done, markup=False, highlight=False, soft_wrap=True)
    incomplete = incomplete_pull_line(run_dir.path, run_dir.record(), after_down=True,
                                      down_words=place_of_record(run_dir.typed_record()).not_pulled_after_down)
    if incomplete:
        console.print(incomplete, markup=False, highlight=False, soft_wrap=True)


def doctor(host: list[str] = typer.Option(..., "--host", help="Hosts to check; repeat."),
           gpus: int = typer.Option(1, "--gpus"), python: str = typer.Option("python3", "--python"),
           rdzv_addr: str | None = typer.Option(None, "--rdzv-addr"), rdzv_port: int = typer.Option(29400),
           identity_file: Path | None = IDENTITY, accept_new_host_keys: bool = ACCEPT,
           connect_timeout: float = TIMEOUT, json_out: bool = typer.Option(False, "--json"),
           bandwidth: bool = typer.Option(False, "--bandwidth", help="Also measure all-reduce bus bandwidth and "
                                          "latency between the hosts (gloo on CPU, NCCL on GPUs), up to the "
                                          "gradient size of --model."),
           model: str = typer.Option("mnist-cnn", "--model", help="With --bandwidth: the model whose gradient "
                                     "is the largest message."),
           dataset: str = typer.Option("mnist", "--dataset", help="With --bandwidth: the data set (its image "
                                       "shape sizes the model).")) -> None:
    """Check hosts before a run: login, python/torch, GPUs or cores, disk, and reachability of node 0."""
    from launcher.cli.doctor import run_doctor
    from launcher.planning.request import UpOptions
    from launcher.spec.gradient_size import GRADIENT_BYTES

    check_at_least(gpus, 1, "--gpus")
    check_python(python)
    check_port(rdzv_port)
    check_seconds(connect_timeout, "--connect-timeout")
    options = UpOptions(hosts=parse_hosts(host), identity_file=identity_file,
                        accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout,
                        rdzv_addr=rdzv_addr)
    if bandwidth and len(host) < 2:
        raise SpecError("--bandwidth measures the network between hosts: give two --host or more")
    if (model, dataset) not in GRADIENT_BYTES:
        models, datasets = sorted({m for m, _ in GRADIENT_BYTES}), sorted({d for _, d in GRADIENT_BYTES})
        raise SpecError(f"--model {model} --dataset {dataset}: choose a model of {', '.join(models)} and a data "
                        f"set of {', '.join(datasets)}")
    if not run_doctor(options, gpus=gpus, python=python, rdzv_port=rdzv_port, json_out=json_out,
                      bandwidth_bytes=GRADIENT_BYTES[(model, dataset)] if bandwidth else 0):
        raise DdpctlError("some hosts are not ready for a run: see the problems listed above")


def register(app: typer.Typer) -> None:
    for command in (status, logs, pull, down, doctor):
        app.command(name=command.__name__)(command)
