"""How the option errors name flags: `--a is`, `--a and --b are`; `it` / `them`."""

from __future__ import annotations

from collections.abc import Callable

# Launch option names -> their command-line flags (launcher/cli/options.py's flag_of, lent by the command layer).
Flags = Callable[[tuple[str, ...]], set[str]]


def listed(flags: list[str], singular: str, plural: str) -> str:
    """`--a is`, `--a and --b are`, `--a, --b and --c are`."""
    names = ", ".join(flags[:-1]) + (" and " if len(flags) > 1 else "") + flags[-1]
    return f"{names} {singular if len(flags) == 1 else plural}"


def they_are(flags: list[str]) -> str:
    return "it is" if len(flags) == 1 else "they are"


def it(flags: list[str]) -> str:
    return "it" if len(flags) == 1 else "them"
