"""CLI commands `ddpctl report` and `ddpctl sweep`: options in, one call into report.py / sweep.py, output out.

Errors are DdpctlError and are turned into one line by the CLI's edge (launcher/cli/app.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from launcher.cli.config import check_values, recorded_options
from launcher.cli.launch import parse_env, where_options, with_env
from launcher.cli.options import (
    AVERAGE_HELP,
    DEVICES_HELP,
    OUTPUT,
    PRECISION_HELP,
    RUN,
    SLURM_OPTIONS,
    STRATEGY,
    THREADS_HELP,
    VAST_OPTIONS,
    WHERE_OPTIONS,
    flag_of,
    takes_options,
)
from launcher.errors import Interrupted, SpecError
from launcher.execute.following.plain_progress import output_style, plain_output, stamp
from launcher.execute.this_machine.defaults import default_python
from launcher.places.registry import PLACES, place_named
from launcher.results.sweep import (
    SCALE_LR_MODES,
    Execute,
    Layout,
    SweepError,
    finish_sweep,
    load_manifest,
    new_sweep,
    parse_counts,
    plan_layouts,
    run_sweep,
    strategy_spec,
)
from launcher.spec.presets import apply_preset, get_preset
from launcher.spec.run_spec import RunSpec
from launcher.spec.strategies import DEVICE_STRATEGIES, STRATEGIES

EXIT_INTERRUPTED = 130


def up_executor(launch: dict[str, Any], env: list[str], show_progress: bool = True) -> Execute:
    """The sweep's way to run one entry: `ddpctl up` on the first spec.nnodes of the sweep's hosts (or locally,
    or on spec.nnodes rented machines).

    `launch` is the manifest's record of where and how (the launch options, --env by name only); `env` the --env
    values given to this invocation, which the entries' specs get back."""
    base = where_options(*launch_values(launch), show_progress=show_progress)
    env_values = parse_env(env)
    missing = sorted(set(launch.get("env_names") or ()) - {name for name, _ in env_values})
    if missing:  # before any entry runs, not as the first entry's failure
        raise SpecError(f"this sweep was started with --env {', '.join(missing)}: sweep.json keeps names only; "
                        "give the values again with --env NAME=VALUE")

    def execute(spec: RunSpec, runs_dir: Path) -> Path:
        from launcher.places.registry import place_of, run_up

        spec = with_env(spec, env_values)
        options = replace(base, runs_dir=runs_dir, hosts=base.hosts[: spec.nnodes], auto_gpus=False,
                          record={"options": entry_options(launch, spec)})
        options = place_of(options).sweep_entry(options, spec.nnodes, runs_dir)  # what to rent or allocate for it
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


def entry_options(launch: dict[str, Any], spec: RunSpec) -> dict[str, Any]:
    """What run.json keeps to re-run one entry with `up --from`: the sweep's launch options and the entry's spec."""
    fields = ("model", "dataset", "data_dir", "epochs", "batch_size", "lr", "seed", "save_every", "max_restarts",
              "python")
    return {**{k: v for k, v in launch.items() if k != "host"}, "host": list(launch.get("host", []))[: spec.nnodes],
            **{k: getattr(spec, k) for k in fields if getattr(spec, k) is not None}, "gpus": spec.nproc_per_node,
            "trainer_arg": list(spec.trainer_args), "env_names": [name for name, _ in spec.extra_env],
            **({"command": list(spec.user_command)} if spec.user_command else {})}  # `-- CMD`: `up --from` runs it


def launch_values(launch: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The launch options a sweep manifest records, over the declared defaults (manifests written before the
    option layer name the hosts `hosts`), and the names set; --env comes back empty (names only are kept)."""
    declared = {o.name: o for block in (WHERE_OPTIONS, VAST_OPTIONS, SLURM_OPTIONS) for o in block}
    recorded = {("host" if k == "hosts" else k): v for k, v in launch.items() if v is not None and k != "env_names"}
    values = {name: list(o.default) if o.type is list else o.default for name, o in declared.items()}
    values.update(check_values(recorded, declared, "sweep.json: launch"), runs_dir=Path("runs"))
    given = [name for name, o in declared.items() if values[name] != (list(o.default) if o.type is list
                                                                       else o.default) and values[name] is not False]
    return values, given


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
    from launcher.results.report import render_terminal, script_lines
    from launcher.results.table_output import table_console

    table_console().print(render_terminal(rows))
    for line in script_lines(rows):  # a script's row: what its time measured, what it logged
        typer.echo(line)


@takes_options(WHERE_OPTIONS, VAST_OPTIONS, SLURM_OPTIONS)
def sweep_command(
    ctx: typer.Context,
    command: list[str] | None = typer.Argument(None, help="After `--`: your own command, run once per layout "
                                               "under torchrun (its report row: docs/guides/sweeps-and-reports.md)."),
    gpus: str | None = typer.Option(None, "--gpus", help="Processes per node to sweep, e.g. 1,2,4 "
                                    "(default: the preset's).", rich_help_panel=RUN),
    nodes: str | None = typer.Option(None, "--nodes", help="Node counts to sweep, e.g. 1,2 (default 1).",
                                     rich_help_panel=RUN),
    preset: str | None = typer.Option(None, "--preset", help="mnist, mnist-spawn, mnist-dp-mp, "
                                      "cifar10-resnet18 or mnist-cpu (docs/reference-experiments.md).",
                                      rich_help_panel=RUN),
    scale_lr: str | None = typer.Option(None, "--scale-lr", help="none (default), linear or sqrt: scale lr "
                                        "with the world size over the smallest one.", rich_help_panel=RUN),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the sweep in this directory.",
                                       rich_help_panel=OUTPUT),
    model: str | None = typer.Option(None, "--model", help="mnist-cnn, mnist-cnn-small (write-up 5) or resnet18.",
                                     rich_help_panel=RUN),
    dataset: str | None = typer.Option(None, "--dataset", help="synthetic, mnist or cifar10.", rich_help_panel=RUN),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder holding the data set files.",
                                        rich_help_panel=RUN),
    epochs: int | None = typer.Option(None, "--epochs", rich_help_panel=RUN),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Per process.", rich_help_panel=RUN),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate at the smallest world size.",
                                    rich_help_panel=RUN),
    seed: int | None = typer.Option(None, "--seed", rich_help_panel=RUN),
    save_every: int | None = typer.Option(None, "--save-every", help="Snapshot every N epochs.", rich_help_panel=RUN),
    max_restarts: int | None = typer.Option(None, "--max-restarts", rich_help_panel=RUN),
    backend: str | None = typer.Option(None, "--backend", help="auto, nccl or gloo.", rich_help_panel=RUN),
    synthetic_train_size: int | None = typer.Option(None, "--synthetic-train-size", rich_help_panel=RUN),
    synthetic_test_size: int | None = typer.Option(None, "--synthetic-test-size", rich_help_panel=RUN),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="The sweep directory goes under here.",
                                  rich_help_panel=OUTPUT),
    progress: str = typer.Option("auto", "--progress", help="How each run is shown as it goes: live (a display "
                                 "redrawn in place), plain (time-stamped lines, for a log file, a pipe or CI), or "
                                 "auto: live on a terminal, plain otherwise.", rich_help_panel=OUTPUT),
    no_progress: bool = typer.Option(False, "--no-progress", help="Show no run's progress, only the sweep's lines "
                                     "and the report.", rich_help_panel=OUTPUT),
    # Issue 14: strategy options (the help texts are `up`'s, from launcher/cli/options.py).
    strategy: str | None = typer.Option(None, "--strategy", help="Strategies to compare, e.g. ddp,hogwild,local-sgd "
                                        "(default: the preset's, else ddp).", rich_help_panel=STRATEGY),
    devices: str | None = typer.Option(None, "--devices", help=DEVICES_HELP, rich_help_panel=STRATEGY),
    threads_per_process: int | None = typer.Option(None, "--threads-per-process", help=THREADS_HELP,
                                                   rich_help_panel=STRATEGY),
    average_every: str | None = typer.Option(None, "--average-every", help=AVERAGE_HELP, rich_help_panel=STRATEGY),
    precision: str | None = typer.Option(None, "--precision", help=PRECISION_HELP, rich_help_panel=STRATEGY),
    **launch_options: Any,
) -> None:
    """Run one experiment per process layout, one after another, then write the scaling report."""
    options = {**{k: v for k, v in locals().items() if k not in ("ctx", "launch_options")}, **launch_options}
    typed = typed_here(ctx, list(options))
    if resume is not None:
        # Everything about the experiment and where it runs is in the manifest; only the display (and the --env
        # values, which it does not keep) may be given again.
        given = [flag_of(k) for k in typed if k not in ("resume", "runs_dir", "progress", "no_progress", "env")]
        if given:
            raise SpecError(f"--resume continues the sweep as its sweep.json records it; leave out {', '.join(given)}")
    with output_style(progress):  # plain time-stamped lines where stderr is not a terminal
        if resume is not None:
            sweep_dir = resume
            launch = load_manifest(sweep_dir).get("launch", {})
        else:
            sweep_dir, launch = _start_sweep(options, [k for k in typed if k in launch_options])
        try:
            run_sweep(sweep_dir, up_executor(launch, options["env"], not no_progress), _announce)
        except KeyboardInterrupt:
            # A message that says how to go on is worth more than the bare exit status of Ctrl-C.
            raise Interrupted(f"sweep interrupted; continue it with `ddpctl sweep --resume {sweep_dir}`") from None
        report, files = finish_sweep(sweep_dir)
        _print_table(report.rows)
        typer.echo(f"report: {files[0]}")


def _announce(entry: dict[str, Any], spec: RunSpec) -> None:
    _say(f"{spec.strategy}: layout {spec.nnodes}x{spec.nproc_per_node} (world size {spec.world_size}, "
         f"lr {spec.lr:g}): run {spec.run_id}")


def _say(line: str) -> None:
    """One line of the sweep's own on stdout, time-stamped where the output is plain lines."""
    typer.echo(f"{stamp()} {line}" if plain_output() else line)


def typed_here(ctx: typer.Context, names: list[str]) -> list[str]:
    """The options of `names` given on the command line (not defaults)."""
    sources = {name: ctx.get_parameter_source(name) for name in names}
    return [name for name, source in sources.items() if source is not None and source.name == "COMMANDLINE"
            and ctx.params.get(name) is not False]


def _start_sweep(o: dict[str, Any], given: list[str]) -> tuple[Path, dict[str, Any]]:
    """Validate the options and create the sweep directory with its manifest; nothing is written on bad input."""
    from launcher.execute.this_machine.run import check_local_run

    trainer_args: list[str] = []
    for option in ("synthetic_train_size", "synthetic_test_size"):
        if o[option] is not None:
            if o[option] < 1:
                raise SpecError(f"--{option.replace('_', '-')} must be an integer >= 1, got {o[option]}")
            trainer_args += [f"--{option.replace('_', '-')}", str(o[option])]
    if o["gpus"] is None and o["preset"] is None:
        raise SpecError("--gpus is missing: give the processes per node to sweep, e.g. --gpus 1,2,4")
    gpu_counts = parse_counts(o["gpus"], "--gpus") if o["gpus"] is not None else list(
        get_preset(o["preset"]).sweep_gpus)
    node_counts = parse_counts(o["nodes"], "--nodes") if o["nodes"] is not None else [1]
    mode = o["scale_lr"] or "none"
    if mode not in SCALE_LR_MODES:
        raise SpecError(f"--scale-lr {mode!r}: choose one of {', '.join(SCALE_LR_MODES)}")
    # The options `up` takes, checked as `up` checks them (Slurm: the largest allocation the sweep asks for).
    # A place that reads --nodes beside its own options (a Slurm allocation) is asked for the largest one.
    asked = PLACES.get(o["provider"])
    where = where_options({**o, "nodes": max(node_counts)} if asked and "nodes" in asked.also_takes else o, given,
                          show_progress=False)
    place = place_named(where.provider)
    if not place.allocates_nodes and max(node_counts) > max(len(where.hosts), 1):
        raise SpecError(f"--nodes {max(node_counts)} needs at least {max(node_counts)} --host options "
                        f"(got {len(where.hosts)}); a local run has one node")
    spec_options = ("model", "dataset", "data_dir", "epochs", "batch_size", "lr", "seed", "save_every",
                    "max_restarts", "backend", "threads_per_process", "precision")
    python = o["python"] if o["python"] is not None else default_python(place.runs_here)
    fields = apply_preset(o["preset"], trainer_args=tuple(trainer_args) or None, extra_env=parse_env(o["env"]),
                          python=python, rdzv_port=o["rdzv_port"],
                          **{k: o[k] for k in spec_options})
    strategies, strategy_options = _sweep_strategies(o, fields)
    if o.get("command"):  # `-- CMD`: the same script on every layout
        fields["user_command"] = tuple(o["command"])
    base = RunSpec(run_id="sweep", **fields)
    if place.runs_here:  # what `up` checks before each local run, checked once before the sweep exists
        for name in strategies:
            if name != "local-sgd" or max(gpu_counts) > 1:
                check_local_run(strategy_spec(base, name, strategy_options, Layout(1, max(gpu_counts))))
    launch = recorded_options(o, {opt.name: opt for block in (WHERE_OPTIONS, VAST_OPTIONS, SLURM_OPTIONS)
                                  for opt in block})
    layouts = plan_layouts(gpu_counts, node_counts)
    skipped: list[str] = []
    sweep_dir = new_sweep(base, layouts, o["runs_dir"], mode, o["preset"], launch, strategies, strategy_options,
                          skipped)
    if skipped:
        _say(f"left out {', '.join(skipped)}: local-sgd needs at least 2 processes (with one it is plain "
             "SGD, as ddp on one process is)")
    _say(f"sweep {sweep_dir}: " + ", ".join(f"{lay.label} (world size {lay.world_size})" for lay in layouts))
    return sweep_dir, launch


def _sweep_strategies(o: dict[str, Any], fields: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The strategies to sweep (--strategy, else the preset's) and their own options, taken out of `fields`
    (devices, average_every apply to some strategies only: each entry gets them where they apply)."""
    if o["strategy"] is not None:
        names: tuple[str, ...] = tuple(dict.fromkeys(part.strip() for part in o["strategy"].split(",")))
        if not all(names):
            raise SpecError(f"--strategy {o['strategy']!r} is not a list: give strategies separated by commas, "
                            f"e.g. ddp,hogwild,local-sgd")
    else:
        names = get_preset(o["preset"]).strategies if o["preset"] else ("ddp",)
    fields.pop("strategy", None)
    options: dict[str, Any] = {key: fields.pop(key) for key in ("devices", "average_every") if key in fields}
    for key, applies in (("devices", DEVICE_STRATEGIES), ("average_every", ("local-sgd",))):
        if o[key] is not None:
            if not set(names) & set(applies):
                flag = "--" + key.replace("_", "-")
                raise SpecError(f"{flag} is for --strategy {' or '.join(applies)}, none of which this sweep runs: "
                                f"drop {flag} or add one of them to --strategy")
            options[key] = o[key]
    for name in names:
        if name not in STRATEGIES:
            raise SpecError(f"unknown strategy {name!r} in --strategy: choose from {', '.join(STRATEGIES)}")
    return names, options


def register(app: typer.Typer) -> None:
    """Add `report` and `sweep` to the ddpctl app."""
    app.command("report")(report_command)
    app.command("sweep", context_settings={"allow_interspersed_args": False})(sweep_command)
