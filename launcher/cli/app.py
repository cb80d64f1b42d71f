"""The `ddpctl` command line: thin commands over the core; domain errors become one line and exit 1."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from launcher.cli.brief_help import HELP_ALL, BriefHelpCommand
from launcher.cli.config import config_text, recorded_options
from launcher.cli.exit_status import (
    INTERRUPTED_STATUS,
    OUTPUT_GONE_STATUS,
    exit_with,
    finish_output,
    output_gone,
    say,
)
from launcher.cli.launch import check_from_env, recorded_launch, resolve_values, up_spec, where_options
from launcher.cli.options import (
    OUTPUT,
    RUN_OPTIONS,
    SLURM_OPTIONS,
    STRATEGY_OPTIONS,
    UP_OUTPUT_OPTIONS,
    UP_WHERE_OPTIONS,
    VAST_OPTIONS,
    WHERE_OPTIONS,
    declared_options,
    takes_options,
)
from launcher.cli.plan_option import check_saved_files_not_shipped, save_plan_if_asked, up_saved_plan
from launcher.errors import DdpctlError, Interrupted, SpecError
from launcher.execute.following.plain_progress import output_style, unstamped
from launcher.results.progress import console, summary_table

ABOUT = ("Run PyTorch DDP experiments on this machine, on SSH hosts (natively or in Docker), on a Slurm cluster or on "
         "rented Vast.ai machines, and bring back what happened.")
app = typer.Typer(
    name="ddpctl",
    help=ABOUT,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules that add their commands with `register(app)`; each owns one family of commands.
COMMAND_MODULES = (
    "launcher.cli.run_commands",
    "launcher.runtimes.image",
    "launcher.cli.report_sweep",
    "launcher.cli.stacks_command",
)



def _print_version(asked: bool) -> None:
    if asked:
        from importlib import metadata

        try:
            version = metadata.version("ddpctl")
        except metadata.PackageNotFoundError:  # run from a checkout that was never installed
            version = "unknown (not installed: `pip install -e .` records it)"
        typer.echo(f"ddpctl {version}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print ddpctl's version and exit.")) -> None:
    """Run PyTorch DDP experiments on this machine, on SSH hosts (natively or in Docker), on a Slurm cluster or on
    rented Vast.ai machines, and bring back what happened."""


RUNS_DIR = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live.", rich_help_panel=OUTPUT)


@app.command(cls=BriefHelpCommand, context_settings={"allow_interspersed_args": False})
@takes_options(RUN_OPTIONS, STRATEGY_OPTIONS, WHERE_OPTIONS, UP_WHERE_OPTIONS, VAST_OPTIONS, SLURM_OPTIONS,
               UP_OUTPUT_OPTIONS)
def up(
    ctx: typer.Context,
    command: list[str] | None = typer.Argument(None, help="After `--`: your own command to run under torchrun."),
    help_all: bool = HELP_ALL,
    **values: Any,
) -> None:
    """Launch a DDP training run and follow it to the end."""
    from launcher.execute.following.interruption import catch_stop_signals
    from launcher.places.registry import run_up

    declared = declared_options(up)
    recorded, from_run, env_names = (recorded_launch(values["from_run"], declared) if values["from_run"]
                                     else ({}, None, []))
    values, given = resolve_values(ctx, {**values, "command": command}, declared, recorded)
    if values["plan"] is not None:
        with output_style(values["progress"]):
            finish_up(up_saved_plan(values, given, command), values["json_out"])
        return
    if from_run:
        check_from_env(env_names, values["env"], from_run)
    if values["save_plan"] is not None and not values["dry_run"]:
        raise SpecError("--save-plan writes the plan of a run that is not started: add --dry-run")
    if values["save_config"] is not None and not values["dry_run"]:
        raise SpecError("--save-config writes the options of a run that is not started: add --dry-run")
    where = where_options(values, given, show_progress=not values["json_out"], dry_run=values["dry_run"])
    spec = up_spec(values, where, given)
    # What re-runs it (`up --from`): the options as resolved here (the spec's python and processes per node).
    resolved = {**values, "python": spec.python, "gpus": None if where.auto_gpus else spec.nproc_per_node}
    options = {**recorded_options(resolved, declared), **({"command": list(spec.user_command)} if spec.user_command
                                                           else {})}
    record = {"options": options, **({"from_run": from_run} if from_run else {})}
    catch_stop_signals()  # SIGTERM and SIGHUP (the terminal closing) stop the run as Ctrl-C does, with an outcome
    with output_style(values["progress"]):  # plain time-stamped lines where stderr is not a terminal
        result = run_up(spec, replace(where, record=record))
        check_saved_files_not_shipped(values, result)
        if values["save_config"] is not None:
            save_config(values["save_config"], values, declared)
        save_plan_if_asked(values, result)
        finish_up(result, values["json_out"])


def save_config(path: Path, values: dict[str, Any], declared: dict[str, Any]) -> None:
    """Write `values` as a --config file (atomically: all of it or nothing)."""
    from launcher.results.user_files import write_user_file

    try:
        written = write_user_file(path, config_text(values, declared).encode(), "--save-config")
    except OSError as e:
        raise SpecError(f"--save-config {path}: cannot write it ({e.strerror})") from None
    print(f"options written to {path}" + (f" (the file its link leads to: {written})" if written != path else ""),
          file=sys.stderr)


def finish_up(result: Any, json_out: bool) -> None:
    """Print the plan (dry run), or the summary table / JSON; exit with the run's status."""
    if result.run_dir is None and result.plan is not None:
        print(json.dumps(result.plan.to_json(), indent=2) if json_out else result.plan.describe())
        if result.error:  # the plan above has unknowns: the hosts could not be probed
            raise DdpctlError(f"the plan above was made without probing the hosts (it names what that leaves unknown): "
                              f"{result.error}")
        return
    if json_out:
        from launcher.execute.pull_record import pull_json
        from launcher.places.registry import place_of_record
        from launcher.results.rundir import read_json

        ran = read_json(result.run_dir / "run.json") or {} if result.run_dir else {}
        pull = pull_json(result.run_dir, ran, place_of_record(ran).not_pulled_after_down) if result.run_dir else None
        print(json.dumps({"run_dir": str(result.run_dir), "exit_code": result.exit_code, "summary": result.summary,
                          **({"pull": pull} if pull else {})}, indent=2, sort_keys=True))
    elif result.summary:
        with unstamped():  # the same table as on a terminal
            console.print(summary_table(result.summary, f"run {result.run_dir.name}"))
        console.print(f"results in {result.run_dir}")
        if result.summary.get("command"):  # a `-- CMD` run: what it logged for TensorBoard or W&B, by folder
            from launcher.results.script_curves import script_logs_line

            logged = script_logs_line(result.run_dir)
            if logged:
                console.print(logged, markup=False, highlight=False, soft_wrap=True)
    if result.run_dir is not None:  # the run's outcome is its training's; a pull that missed files is said beside
        from launcher.execute.pull_record import incomplete_pull_line
        from launcher.places.registry import place_of_record
        from launcher.results.rundir import read_json

        ran = read_json(result.run_dir / "run.json") or {}
        incomplete = incomplete_pull_line(result.run_dir, ran, down_words=place_of_record(ran).not_pulled_after_down)
        if incomplete:
            console.print(incomplete, markup=False, highlight=False, soft_wrap=True)
    if result.summary and result.summary.get("world_warning") and not result.summary.get("world_failed"):
        print(f"warning: {result.summary['world_warning']}", file=sys.stderr)
    if result.exit_code == 130:
        from launcher.execute.following.interruption import recorded_outcome

        raise Interrupted(recorded_outcome(result.run_dir, f"stopped; snapshots and logs are in {result.run_dir}"))
    if result.exit_code != 0:
        raise DdpctlError(_failure_message(result))


def _failure_message(result: Any) -> str:
    from launcher.execute.failures.cause import cause_of
    from launcher.execute.failures.worker_log import failure_tail, without_control_chars
    from launcher.places.registry import place_of_record
    from launcher.results.rundir import read_json

    if result.summary and result.summary.get("world_failed") and result.summary.get("world_warning"):
        return str(result.summary["world_warning"])
    ran = (read_json(result.run_dir / "run.json") if result.run_dir else None) or {}
    failure = cause_of(result.run_dir, place_of_record(ran).runs_here if ran else False)
    if failure is not None:  # the first failure across nodes (launcher/execute/failures/cause.py)
        return failure
    tail = without_control_chars(failure_tail(str(result.run_dir), 15)) if result.run_dir else ""
    return f"training failed (exit {result.exit_code}); logs in {result.run_dir}" + (f"\n{tail}" if tail else "")


def _register_commands() -> None:
    from launcher.places.registry import PLACES

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    for place in PLACES.values():  # a place's own commands (Vast.ai: `offers`, `vast login`)
        place.add_commands(app)


def _names_own_command(argv: list[str]) -> bool:
    """Whether the command line runs a command of this module (`up`): COMMAND_MODULES are then not imported."""
    own = {c.name or (c.callback.__name__.replace("_", "-") if c.callback else "") for c in app.registered_commands}
    return bool(argv) and argv[0] in own


def refuse_empty_command(argv: list[str]) -> None:
    """`up --` with nothing after it: click reads it as no command, which would run the built-in trainer instead
    of the command the user meant to give."""
    if len(argv) > 1 and argv[0] == "up" and argv[-1] == "--" and "--" not in argv[:-1]:
        raise SpecError(f"`{argv[0]} --` with no command after it: give the command to run (`-- python3 train.py`), "
                        "or drop the `--` to run the built-in trainer")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning our errors and usage errors into one line on stderr."""
    from launcher.cli.plain_values import use_plain_values
    from launcher.execute.following.interruption import catch_stop_signals, interrupted_by, restore_signals

    use_plain_values()  # option values read without importing pydantic (launcher/cli/plain_values.py)
    if not _names_own_command(sys.argv[1:] if argv is None else argv):  # `up` needs none of the others
        _register_commands()
    previous = catch_stop_signals()  # SIGTERM and SIGHUP (a closed terminal) end every command as Ctrl-C does
    try:
        refuse_empty_command(sys.argv[1:] if argv is None else argv)
        status = app(args=argv, standalone_mode=False)  # click returns an Exit's code instead of raising it
        if status == INTERRUPTED_STATUS:  # typer turns a KeyboardInterrupt into Exit(130), silently: say it
            from launcher.execute.following.interruption import last_cause

            say(f"error: interrupted by {last_cause()}")
        if isinstance(status, int) and status:
            exit_with(status)
        finish_output()
    except DdpctlError as e:
        say(f"error: {e}")
        exit_with(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        say("error: interrupted")
        exit_with(INTERRUPTED_STATUS)
    except _CLICK_ERROR as e:  # a click.ClickException: format_message() and exit_code
        if e.__class__.__name__ == "NoArgsIsHelpError":
            exit_with(0)
        from launcher.cli.option_hints import no_such_option_message

        message = no_such_option_message(e) or e.format_message()  # type: ignore[attr-defined]
        say(f"error: {message} (see --help)")
        exit_with(e.exit_code)  # type: ignore[attr-defined]
    except typer.Exit as e:
        exit_with(e.exit_code)
    except OSError as e:  # a write to a terminal or pipe that is gone (launcher/cli/exit_status.py)
        if interrupted_by(e):  # after SIGHUP: the interruption's status; the run's events say how it ended
            say(f"error: interrupted ({e.strerror or e})")
            exit_with(INTERRUPTED_STATUS)
        if output_gone():
            exit_with(OUTPUT_GONE_STATUS)
        raise
    finally:
        restore_signals(previous)


# typer >= 0.20 vendors its own click; its usage errors share only the class name with click's.
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
