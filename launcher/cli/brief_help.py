"""`up --help` on one screen: the options most runs need, in their panels (by place), and a line saying how to see
the rest (`--help-all`, or the command-line reference, which lists every option: docs/hooks/cli_reference.py)."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand

# What most runs set, by place; every other option is in `--help-all` and the reference.
COMMON_OPTIONS = frozenset({
    # the run
    "gpus", "model", "dataset", "data_dir", "epochs", "batch_size", "lr", "name", "launcher", "strategy", "env",
    "provider", "nodes",
    # SSH hosts and Docker
    "host", "identity_file", "runtime", "image", "detach",
    # Vast.ai and Slurm
    "gpu_name", "max_price", "down", "partition", "time", "account",
    # output
    "dry_run", "config", "save_config", "from_run", "help", "help_all",
})
HELP_ALL_META = "ddpctl.help_all"
# One line within 100 columns.
REST_LINE = "Options most runs need. All {count}: `ddpctl {name} --help-all`, or docs/reference/cli.md."


class BriefHelpCommand(TyperCommand):
    """A command whose --help hides the options outside COMMON_OPTIONS (still accepted and documented)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if ctx.meta.get(HELP_ALL_META):
            super().format_help(ctx, formatter)
            return
        shown = [p for p in self.params if not getattr(p, "hidden", False)]
        tucked = [p for p in shown if p.param_type_name == "option" and p.name not in COMMON_OPTIONS]
        for param in tucked:
            param.hidden = True  # type: ignore[attr-defined]
        try:
            super().format_help(ctx, formatter)
        finally:
            for param in tucked:
                param.hidden = False  # type: ignore[attr-defined]
        options = sum(1 for p in shown if p.param_type_name == "option" and p.name not in ("help", "help_all"))
        typer.echo(" " + REST_LINE.format(name=ctx.info_name or self.name, count=options))


def show_all_help(ctx: typer.Context, asked: bool) -> None:
    """--help-all: the help with every option, then exit."""
    if asked and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL_META] = True
        typer.echo(ctx.get_help())
        raise typer.Exit()


HELP_ALL = typer.Option(False, "--help-all", is_eager=True, expose_value=False, callback=show_all_help,
                        help="Show every option (the help above shows those most runs need).", rich_help_panel=None)
