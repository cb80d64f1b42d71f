"""CLI commands `ddpctl report` and `ddpctl sweep`: options in, one call into report.py / sweep.py, output out.

Errors are DdpctlError and are turned into one line by the CLI's edge (launcher/cli.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from launcher.errors import SpecError
from launcher.hosts import HostSpec, parse_host
from launcher.presets import apply_preset, get_preset
from launcher.spec import RunSpec
from launcher.sweep import (
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

EXIT_INTERRUPTED = 130


def up_executor(hosts: tuple[HostSpec, ...], runtime: str = "native", show_progress: bool = True) -> Execute:
    """The sweep's way to run one entry: `ddpctl up` on the first spec.nnodes hosts (or locally)."""

    def execute(spec: RunSpec, runs_dir: Path) -> Path:
        from launcher.up import UpOptions, run_up

        options = UpOptions(runs_dir=runs_dir, hosts=hosts[: spec.nnodes], runtime=runtime,
                            show_progress=show_progress)
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
    from launcher.report import build_report, dump_json, write_report

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

    from launcher.report import render_terminal

    Console().print(render_terminal(rows))


def sweep_command(
    gpus: str | None = typer.Option(None, "--gpus", help="Processes per node to sweep, e.g. 1,2,4 "
                                       "(default: the preset's)."),
    nodes: str | None = typer.Option(None, "--nodes", help="Node counts to sweep, e.g. 1,2 (default 1)."),
    preset: str | None = typer.Option(None, "--preset", help="mnist, cifar10-resnet18 or mnist-cpu."),
    scale_lr: str | None = typer.Option(None, "--scale-lr", help="none (default), linear or sqrt: scale lr "
                                           "with the world size over the smallest one."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the sweep in this directory."),
    model: str | None = typer.Option(None, "--model"),
    dataset: str | None = typer.Option(None, "--dataset"),
    data_dir: str | None = typer.Option(None, "--data-dir"),
    epochs: int | None = typer.Option(None, "--epochs"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Per process."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate at the smallest world size."),
    seed: int | None = typer.Option(None, "--seed"),
    backend: str | None = typer.Option(None, "--backend"),
    synthetic_train_size: int | None = typer.Option(None, "--synthetic-train-size"),
    synthetic_test_size: int | None = typer.Option(None, "--synthetic-test-size"),
    host: list[str] | None = typer.Option(None, "--host", help="[user@]host[:port]; repeat for more nodes."),
    runtime: str | None = typer.Option(None, "--runtime", help="native or docker (on hosts)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="The sweep directory goes under here."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show each run's progress."),
) -> None:
    """Run one experiment per process layout, one after another, then write the scaling report."""
    if resume is not None:
        given = {"--gpus": gpus, "--nodes": nodes, "--preset": preset, "--scale-lr": scale_lr, "--model": model,
                 "--dataset": dataset, "--data-dir": data_dir, "--epochs": epochs, "--batch-size": batch_size,
                 "--lr": lr, "--seed": seed, "--backend": backend, "--host": host, "--runtime": runtime,
                 "--synthetic-train-size": synthetic_train_size, "--synthetic-test-size": synthetic_test_size}
        extra = [name for name, value in given.items() if value]
        if extra:
            raise SpecError(f"--resume continues the sweep as its sweep.json records it; leave out {', '.join(extra)}")
        sweep_dir = resume
        launch = load_manifest(sweep_dir).get("launch", {})
    else:
        trainer_args: list[str] = []
        for option, size in (("--synthetic-train-size", synthetic_train_size),
                             ("--synthetic-test-size", synthetic_test_size)):
            if size is not None:
                if size < 1:
                    raise SpecError(f"{option} must be an integer >= 1, got {size}")
                trainer_args += [option, str(size)]
        fields = apply_preset(preset, model=model, dataset=dataset, data_dir=data_dir, epochs=epochs,
                              batch_size=batch_size, lr=lr, seed=seed, backend=backend,
                              trainer_args=tuple(trainer_args) or None)
        base = RunSpec(run_id="sweep", **fields)
        if gpus is None and preset is None:
            raise SpecError("--gpus is missing: give the processes per node to sweep, e.g. --gpus 1,2,4")
        gpu_counts = parse_counts(gpus, "--gpus") if gpus is not None else list(get_preset(str(preset)).sweep_gpus)
        node_counts = parse_counts(nodes, "--nodes") if nodes is not None else [1]
        hosts = [parse_host(text) for text in host or []]
        if max(node_counts) > max(len(hosts), 1):
            raise SpecError(f"--nodes {max(node_counts)} needs at least {max(node_counts)} --host options "
                            f"(got {len(hosts)}); a local run has one node")
        mode = scale_lr or "none"
        if mode not in SCALE_LR_MODES:
            raise SpecError(f"--scale-lr {mode!r}: choose one of {', '.join(SCALE_LR_MODES)}")
        launch = {"hosts": [h.text for h in hosts], "runtime": runtime or "native"}
        sweep_dir = new_sweep(base, plan_layouts(gpu_counts, node_counts), runs_dir, mode, preset, launch)
        typer.echo(f"sweep {sweep_dir}: {', '.join(plan_layouts_text(gpu_counts, node_counts))}")
    execute = up_executor(tuple(parse_host(h) for h in launch.get("hosts", [])),
                          str(launch.get("runtime", "native")), progress)

    def announce(entry: dict[str, Any], spec: RunSpec) -> None:
        typer.echo(f"layout {spec.nnodes}x{spec.nproc_per_node} (world size {spec.world_size}, lr {spec.lr:g}): "
                   f"run {spec.run_id}")

    try:
        run_sweep(sweep_dir, execute, announce)
    except KeyboardInterrupt:
        # A message that says how to go on is worth more than the bare exit status of Ctrl-C.
        raise SweepError(f"sweep interrupted; continue it with `ddpctl sweep --resume {sweep_dir}`") from None
    report, files = finish_sweep(sweep_dir)
    _print_table(report.rows)
    typer.echo(f"report: {files[0]}")


def plan_layouts_text(gpus: list[int], nodes: list[int]) -> list[str]:
    return [f"{layout.label} (world size {layout.world_size})" for layout in plan_layouts(gpus, nodes)]


def register(app: typer.Typer) -> None:
    """Add `report` and `sweep` to the ddpctl app."""
    app.command("report")(report_command)
    app.command("sweep")(sweep_command)
