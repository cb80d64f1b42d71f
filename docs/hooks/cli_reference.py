"""MkDocs hook: the command-line reference, rendered from the Typer app itself at every build, so it cannot drift.

A page holding the marker line `<!-- cli-reference -->` gets, in its place, every command of `ddpctl` (groups'
subcommands included) with its usage, help and each visible option: its spellings, value, default and help,
grouped by the panel `--help` shows it under."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
REPO = Path(__file__).resolve().parents[2]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker with the reference (MkDocs calls this for every page)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


def cli_reference() -> str:
    """Markdown for every command of the ddpctl app, in the order `ddpctl --help` lists them."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # this checkout's launcher, whatever is installed
    import typer

    from launcher.cli.app import _register_commands, app

    _register_commands()
    root = typer.main.get_command(app)
    return "\n".join(_command_section(["ddpctl"], root))


def _command_section(path: list[str], command: Any) -> list[str]:
    lines: list[str] = []
    subcommands = getattr(command, "commands", None)
    if len(path) > 1:
        lines += [f"## `{' '.join(path)}`", "", _text(command.help or ""), ""]
        if not subcommands:
            lines += ["```text", _usage(path, command), "```", ""]
            lines += _params_tables(command)
    for name, sub in (subcommands or {}).items():
        if not getattr(sub, "hidden", False):
            lines += _command_section([*path, name], sub)
    return lines


def _usage(path: list[str], command: Any) -> str:
    pieces = [" ".join(path), "[OPTIONS]"]
    for param in command.params:
        if param.param_type_name == "argument":
            name = param.name.upper() + ("..." if param.nargs == -1 else "")
            separator = "-- " if path[-1] == "up" else ""  # up's own command comes after `--`
            pieces.append(name if param.required else f"[{separator}{name}]")
    return " ".join(pieces)


def _params_tables(command: Any) -> list[str]:
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    lines: list[str] = []
    if arguments:
        lines += ["| argument | what it is |", "| --- | --- |"]
        lines += [f"| `{p.name.upper()}` | {_cell(p.help or '')} |" for p in arguments]
        lines.append("")
    panels: dict[str, list[Any]] = {}
    for option in options:
        panels.setdefault(getattr(option, "rich_help_panel", None) or "Options", []).append(option)
    for panel, members in panels.items():
        if len(panels) > 1:
            lines += [f"**{_cell(panel)}**", ""]
        lines += ["| option | value | default | what it does |", "| --- | --- | --- | --- |"]
        lines += [_option_row(command, option) for option in members]
        lines.append("")
    return lines


def _option_row(command: Any, option: Any) -> str:
    spellings = " / ".join(f"`{s}`" for s in [*option.opts, *option.secondary_opts])
    return (f"| {spellings} | {_value(command, option)} | {_default(command, option)} | "
            f"{_cell(option.help or '')} |")


def _kind(command: Any, option: Any) -> str:
    """int, float, str, path, bool...: Typer's own label where it has one, else click's type name."""
    if hasattr(option, "display_type"):  # Typer with its own click: display_type(ctx) -> "<int>"
        import typer

        return str(option.display_type(typer.Context(command))).strip("<>")
    return str(getattr(getattr(option, "type", None), "name", "")).lower()


def _is_flag(command: Any, option: Any) -> bool:
    return bool(getattr(option, "is_flag", False)) or _kind(command, option) in ("bool", "boolean")


def _value(command: Any, option: Any) -> str:
    if _is_flag(command, option):
        return "flag"
    kind = _kind(command, option)
    kind = kind.replace("list[", "").rstrip("]") if option.multiple else kind
    return _cell(kind) + (", repeatable" if option.multiple else "")


def _default(command: Any, option: Any) -> str:
    default = option.default
    if _is_flag(command, option):
        return f"`{option.opts[0]}`" if default else ""  # a flag is off unless said
    if default is None or default == [] or default == () or callable(default):
        return ""
    return f"`{default}`"


def _text(text: str) -> str:
    return text.replace("\\[", "[").strip()


def _cell(text: str) -> str:
    """One table cell: on one line, `|` escaped, Rich's `\\[` back to `[`."""
    return " ".join(_text(text).split()).replace("|", "\\|")
