"""CLI commands `ddpctl report` and `ddpctl sweep`: options in, one call into report.py / sweep.py, output out.

Errors are DdpctlError and are turned into one line by the CLI's edge (launcher/cli/app.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from launcher.errors import Interrupted, SpecError
from launcher.results.sweep import (
    SCALE_LR_MODES,
    Execute,
    SweepError,
    finish_sweep,
    load_manifest,
    new_sweep,
    parse_counts,
    plan_layouts,
    run_sweep,
)
from launcher.spec.hosts import parse_host, parse_hosts
from launcher.spec.presets import apply_preset, get_preset
from launcher.spec.run_spec import RunSpec
from launcher.spec.validate import check_runs_dir, check_seconds

EXIT_INTERRUPTED = 130


def up_executor(launch: dict[str, Any], show_progress: bool = True) -> Execute:
    """The sweep's way to run one entry: `ddpctl up` on the first spec.nnodes of the sweep's hosts (or locally).

    `launch` is the manifest's record of where and how (hosts, runtime, SSH settings)."""
    hosts = tuple(parse_host(h) for h in launch.get("hosts", []))
    identity = launch.get("identity_file")

    def execute(spec: RunSpec, runs_dir: Path) -> Path:
        from launcher.execute.request import UpOptions
        from launcher.execute.up import run_up

        options = UpOptions(
            runs_dir=runs_dir, hosts=hosts[: spec.nnodes], runtime=str(launch.get("runtime", "native")),
            show_progress=show_progress, identity_file=Path(identity) if identity else None,
            accept_new_host_keys=bool(launch.get("accept_new_host_keys", False)),
            connect_timeout=float(launch.get("connect_timeout", 10.0)), rdzv_addr=launch.get("rdzv_addr"),
            image=launch.get("image"),
        )  # fmt: skip
        result = run_up(spec, options)
        if result.exit_code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if result.run_dir is None:
            raise SweepError(f"run {spec.run_id} did not start")
        if result.exit_code != 0:
            raise SweepError(f"run {spec.run_id} ended with exit code {result.exit_code}; "
                             f"its logs are in {result.run_dir / 'logs'}")
        return result.run_dir

    return execute


def report_command(
    dirs: list[Path] = typer.Argument(..., help="Run directories or sweep directories."),
    out: Path | None = typer.Option(None, "--out", help="Where report.md, report.json and the PNG plots go "
                                       "(default: the sweep directory when given one sweep, else ./report)."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON instead of a table."),
    preset: str | None = typer.Option(None, "--preset", help="Show this preset's reference figures beside "
                                         "ours (a sweep's own preset is used otherwise)."),
) -> None:
    """Scaling table, Markdown report and plots from finished runs, one row per process layout."""
    from launcher.results.report import dump_json, write_report
    from launcher.results.run_figures import build_report

    if preset:
        get_preset(preset)
    report = build_report(dirs, preset)
    if out is None:
        out = dirs[0] if len(dirs) == 1 and (dirs[0] / "sweep.json").is_file() else Path("report")
    files = write_report(report, out)
    if as_json:
        typer.echo(dump_json(report.rows, report.reference, files[2:]))
        print(f"report written to {files[0]}", file=sys.stderr)
        return
    _print_table(report.rows)
    typer.echo(f"report: {files[0]} (plots: {', '.join(p.name for p in files[2:])})")


def _print_table(rows: Any) -> None:
    from rich.console import Console

    from launcher.results.report import render_terminal

    Console().print(render_terminal(rows))


def sweep_command(
    gpus: str | None = typer.Option(None, "--gpus", help="Processes per node to sweep, e.g. 1,2,4 "
                                    "(default: the preset's)."),
    nodes: str | None = typer.Option(None, "--nodes", help="Node counts to sweep, e.g. 1,2 (default 1)."),
    preset: str | None = typer.Option(None, "--preset", help="mnist, cifar10-resnet18 or mnist-cpu."),
    scale_lr: str | None = typer.Option(None, "--scale-lr", help="none (default), linear or sqrt: scale lr "
                                        "with the world size over the smallest one."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the sweep in this directory."),
    model: str | None = typer.Option(None, "--model", help="mnist-cnn or resnet18."),
    dataset: str | None = typer.Option(None, "--dataset", help="synthetic, mnist or cifar10."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder holding the data set files."),
    epochs: int | None = typer.Option(None, "--epochs"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Per process."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate at the smallest world size."),
    seed: int | None = typer.Option(None, "--seed"),
    save_every: int | None = typer.Option(None, "--save-every", help="Snapshot every N epochs."),
    max_restarts: int | None = typer.Option(None, "--max-restarts"),
    backend: str | None = typer.Option(None, "--backend", help="auto, nccl or gloo."),
    python: str | None = typer.Option(None, "--python",
                                      help="Python on the hosts (default python3), or here (default: ddpctl's)."),
    synthetic_train_size: int | None = typer.Option(None, "--synthetic-train-size"),
    synthetic_test_size: int | None = typer.Option(None, "--synthetic-test-size"),
    host: list[str] | None = typer.Option(None, "--host", help="[user@]host[:port]; repeat, node 0 first."),
    runtime: str | None = typer.Option(None, "--runtime", help="native, docker or auto (on hosts)."),
    image: str | None = typer.Option(None, "--image", help="Image for --runtime docker."),
    identity_file: Path | None = typer.Option(None, "--identity-file", "-i", help="SSH private key."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys",
                                              help="Trust and record unknown host keys (never changed ones)."),
    connect_timeout: float | None = typer.Option(None, "--connect-timeout"),
    rdzv_addr: str | None = typer.Option(None, "--rdzv-addr", help="Node 0's address as the other nodes reach it."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="The sweep directory goes under here."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show each run's progress."),
) -> None:
    """Run one experiment per process layout, one after another, then write the scaling report."""
    options = dict(locals())
    if resume is not None:
        # Everything about the experiment and where it runs is in the manifest; only the display may change.
        given = [f"--{k.replace('_', '-')}" for k, v in options.items()
                 if k not in ("resume", "runs_dir", "progress") and v not in (None, False)]
        if given:
            raise SpecError(f"--resume continues the sweep as its sweep.json records it; leave out {', '.join(given)}")
        sweep_dir = resume
        launch = load_manifest(sweep_dir).get("launch", {})
    else:
        sweep_dir, launch = _start_sweep(options)
    try:
        run_sweep(sweep_dir, up_executor(launch, progress), _announce)
    except KeyboardInterrupt:
        # A message that says how to go on is worth more than the bare exit status of Ctrl-C.
        raise Interrupted(f"sweep interrupted; continue it with `ddpctl sweep --resume {sweep_dir}`") from None
    report, files = finish_sweep(sweep_dir)
    _print_table(report.rows)
    typer.echo(f"report: {files[0]}")


def _announce(entry: dict[str, Any], spec: RunSpec) -> None:
    typer.echo(f"layout {spec.nnodes}x{spec.nproc_per_node} (world size {spec.world_size}, lr {spec.lr:g}): "
               f"run {spec.run_id}")


def _start_sweep(o: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Validate the options and create the sweep directory with its manifest; nothing is written on bad input."""
    from launcher.execute.local import default_python
    from launcher.execute.up import check_local_run
    from launcher.spec.run_spec import RUNTIMES

    trainer_args: list[str] = []
    for option in ("synthetic_train_size", "synthetic_test_size"):
        if o[option] is not None:
            if o[option] < 1:
                raise SpecError(f"--{option.replace('_', '-')} must be an integer >= 1, got {o[option]}")
            trainer_args += [f"--{option.replace('_', '-')}", str(o[option])]
    spec_options = ("model", "dataset", "data_dir", "epochs", "batch_size", "lr", "seed", "save_every",
                    "max_restarts", "backend", "python")
    if o["python"] is None:
        o = {**o, "python": default_python("ssh" if o["host"] else "local")}
    fields = apply_preset(o["preset"], trainer_args=tuple(trainer_args) or None,
                          **{k: o[k] for k in spec_options})
    base = RunSpec(run_id="sweep", **fields)
    if o["gpus"] is None and o["preset"] is None:
        raise SpecError("--gpus is missing: give the processes per node to sweep, e.g. --gpus 1,2,4")
    gpu_counts = parse_counts(o["gpus"], "--gpus") if o["gpus"] is not None else list(
        get_preset(o["preset"]).sweep_gpus)
    node_counts = parse_counts(o["nodes"], "--nodes") if o["nodes"] is not None else [1]
    hosts = parse_hosts(o["host"] or [])
    if max(node_counts) > max(len(hosts), 1):
        raise SpecError(f"--nodes {max(node_counts)} needs at least {max(node_counts)} --host options "
                        f"(got {len(hosts)}); a local run has one node")
    mode = o["scale_lr"] or "none"
    if mode not in SCALE_LR_MODES:
        raise SpecError(f"--scale-lr {mode!r}: choose one of {', '.join(SCALE_LR_MODES)}")
    runtime = o["runtime"] or "native"
    if runtime not in RUNTIMES:
        raise SpecError(f"--runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    if runtime == "docker" and not hosts:
        raise SpecError("--runtime docker needs --host (locally, use `docker compose up`)")
    if o["image"] is not None:
        from launcher.runtimes.image import check_reference

        check_reference(o["image"], "--image")
    if o["connect_timeout"] is not None:
        check_seconds(o["connect_timeout"], "--connect-timeout")
    check_runs_dir(o["runs_dir"])
    if not hosts:  # what `up` checks before each local run, checked once before the sweep directory exists
        check_local_run(base.with_layout(nnodes=1, nproc_per_node=max(gpu_counts)))
    launch = {"hosts": [h.text for h in hosts], "runtime": runtime, "image": o["image"],
              "identity_file": str(o["identity_file"].resolve()) if o["identity_file"] else None,
              "accept_new_host_keys": o["accept_new_host_keys"], "rdzv_addr": o["rdzv_addr"],
              "connect_timeout": o["connect_timeout"] or 10.0}
    layouts = plan_layouts(gpu_counts, node_counts)
    sweep_dir = new_sweep(base, layouts, o["runs_dir"], mode, o["preset"], launch)
    typer.echo(f"sweep {sweep_dir}: " + ", ".join(f"{lay.label} (world size {lay.world_size})" for lay in layouts))
    return sweep_dir, launch


def register(app: typer.Typer) -> None:
    """Add `report` and `sweep` to the ddpctl app."""
    app.command("report")(report_command)
    app.command("sweep")(sweep_command)
