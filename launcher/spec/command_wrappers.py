"""The commands a `-- CMD` runs once the programs that only wrap another are looked through (`env`, `nice`,
`nohup`, `time`, `stdbuf`, `taskset`, `ionice`, `timeout`, `setsid`, `numactl`, `chrt`, `exec`, `command`, with their
options; a shell's `-c` string, each of its simple commands). The refusal of a second launcher reads these, so that
`env torchrun ...` or `sh -c 'torchrun ...'` is refused as `torchrun ...` is, not 40 s later as separate worlds."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Wrapper:
    """How a wrapping program's own arguments end: its options (short letters and long names that take a value)
    and how many words follow them before the wrapped command (taskset's mask, timeout's duration)."""

    short_with_value: str = ""
    long_with_value: tuple[str, ...] = ()
    positionals: int = 0


WRAPPERS = {
    "env": Wrapper("uCS", ("--unset", "--chdir", "--split-string")),
    "nice": Wrapper("n", ("--adjustment",)),
    "nohup": Wrapper(),
    "time": Wrapper("fo", ("--format", "--output")),
    "stdbuf": Wrapper("ioe", ("--input", "--output", "--error")),
    "taskset": Wrapper("", (), positionals=1),
    "ionice": Wrapper("cnpPu", ("--class", "--classdata", "--pid", "--pgid", "--uid")),
    "timeout": Wrapper("sk", ("--signal", "--kill-after"), positionals=1),
    "setsid": Wrapper(),
    "numactl": Wrapper("ipmNCw", ("--interleave", "--preferred", "--membind", "--cpunodebind", "--physcpubind",
                                  "--weighted-interleave")),
    "chrt": Wrapper("TPD", ("--sched-runtime", "--sched-period", "--sched-deadline"), positionals=1),
    "exec": Wrapper("a"),
    "command": Wrapper(),
}
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
# A shell's control operators: each separates one simple command from the next.
SHELL_OPERATORS = re.compile(r"[;&|()<>\n]+")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
DEPTH = 8  # wrappers inside wrappers: no real command goes deeper


def _wrapped(program: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """The command `program` (a wrapper) runs, given its arguments."""
    wrapper = WRAPPERS[program]
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d+", word) and program != "nice":
            break
        if word.startswith("--"):
            name, has_value, value = word.partition("=")
            if name == "--split-string":  # env -S: the string is the command's first words
                split = _split(value if has_value else (args[i + 1] if i + 1 < len(args) else ""))
                return (*split, *args[i + (1 if has_value else 2):])
            i += 1 if has_value or name not in wrapper.long_with_value else 2
            continue
        for j, letter in enumerate(word[1:], start=1):
            if letter in wrapper.short_with_value:
                rest = word[j + 1:]
                if program == "env" and letter == "S":
                    split = _split(rest or (args[i + 1] if i + 1 < len(args) else ""))
                    return (*split, *args[i + (1 if rest else 2):])
                i += 0 if rest else 1
                break
        i += 1
    i += wrapper.positionals
    while program == "env" and i < len(args) and ASSIGNMENT.fullmatch(args[i]):
        i += 1
    return args[i:]


def _split(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError:  # an unclosed quote: the shell would refuse it too, nothing to look at
        return ()


def _shell_string(args: tuple[str, ...]) -> str | None:
    """The string a shell runs with `-c` (options such as `-e`, `-ec`, `-o pipefail` before it), or None."""
    runs_string = False
    i = 0
    while i < len(args) and args[i][:1] in ("-", "+") and args[i] not in ("-", "--"):
        if args[i][1:] == "o":
            i += 1
        runs_string = runs_string or "c" in args[i][1:]
        i += 1
    if args[i:i + 1] == ("--",):
        i += 1
    return args[i] if runs_string and i < len(args) else None


def _simple_commands(text: str) -> list[tuple[str, ...]]:
    """A shell string's simple commands, each without its leading variable assignments (`A=1 torchrun ...`)."""
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[tuple[str, ...]] = []
    current: list[str] = []
    for token in [*tokens, ";"]:
        if SHELL_OPERATORS.fullmatch(token):
            while current and ASSIGNMENT.fullmatch(current[0]):
                current.pop(0)
            if current:
                commands.append(tuple(current))
            current = []
        else:
            current.append(token)
    return commands


def inner_commands(command: tuple[str, ...], depth: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    """Every command `command` runs, itself first, each with how it is reached as the user wrote it (`env `,
    `sh -c '`): wrappers looked through, a shell's `-c` string split into its simple commands."""
    found: list[tuple[str, tuple[str, ...]]] = [("", command)]
    if not command or depth >= DEPTH:
        return found
    program = os.path.basename(command[0])
    if program in WRAPPERS:
        inner = _wrapped(program, command[1:])
        found += [(f"{program} {how}", cmd) for how, cmd in inner_commands(inner, depth + 1)]
    elif program in SHELLS:
        text = _shell_string(command[1:])
        for simple in _simple_commands(text) if text is not None else []:
            found += [(f"{program} -c '{how}", cmd) for how, cmd in inner_commands(simple, depth + 1)]
    return found
