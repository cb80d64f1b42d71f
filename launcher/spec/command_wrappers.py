"""The commands a `-- CMD` runs once the programs that only wrap another are looked through (`env`, `nice`,
`nohup`, `time`, `stdbuf`, `taskset`, `ionice`, `timeout`, `setsid`, `numactl`, `chrt`, `exec`, `command`, `sudo`,
`srun`, and the environment runners `uv run`, `poetry run`, `pipenv run`, `conda run`, with their options; a shell's
`-c` string, each of its simple commands). The refusal of a second launcher reads these, so that
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
    # The word that makes the program a wrapper (`uv run`, `conda run`); its other subcommands run nothing of ours.
    subcommand: str = ""
    # srun has far more options with a value than without: for it the two fields above list those WITHOUT one.
    values_unless_listed: bool = False
    # `VAR=value` words between the options and the command (env, sudo).
    assignments: bool = False
    # The option that runs a module instead of a command (`uv run -m MOD` is `python -m MOD`).
    module_option: tuple[str, ...] = ()


WRAPPERS = {
    "env": Wrapper("uCS", ("--unset", "--chdir", "--split-string"), assignments=True),
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
    "sudo": Wrapper("CDghpRrtTUu", ("--close-from", "--chdir", "--group", "--host", "--prompt", "--chroot", "--role",
                                    "--type", "--command-timeout", "--other-user", "--user"), assignments=True),
    # srun (Slurm 22.05 `srun --help`): the short letters and long names WITHOUT a value (those whose value is
    # optional take it only after `=`); every other option takes one.
    "srun": Wrapper("EHIkKlOQsuvVXZh", (
        "--compress", "--contiguous", "--disable-status", "--exact", "--exclusive", "--help", "--hold", "--immediate",
        "--kill-on-bad-exit", "--label", "--multi-prog", "--nice", "--no-allocate", "--no-kill", "--overcommit",
        "--overlap", "--oversubscribe", "--preserve-env", "--propagate", "--pty", "--quiet", "--quit-on-interrupt",
        "--reboot", "--resv-ports", "--send-libs", "--spread-job", "--test-only", "--unbuffered", "--usage",
        "--use-min-nodes", "--verbose", "--version"), values_unless_listed=True),
    # uv's run and global options that take a value (uv 0.8); `-m MOD` runs a module as python -m does.
    "uv": Wrapper("pCPif", (
        "--with", "--with-editable", "--with-requirements", "--extra", "--no-extra", "--group", "--no-group",
        "--only-group", "--package", "--python", "--directory", "--project", "--env-file", "--index",
        "--default-index", "--index-url", "--extra-index-url", "--find-links", "--upgrade-package",
        "--reinstall-package", "--config-setting", "--config-settings-package", "--no-build-isolation-package",
        "--no-binary-package", "--no-build-package", "--refresh-package", "--link-mode", "--resolution",
        "--prerelease", "--fork-strategy", "--exclude-newer", "--exclude-newer-package", "--index-strategy",
        "--keyring-provider", "--python-platform", "--cache-dir", "--color", "--config-file",
        "--allow-insecure-host"), subcommand="run", module_option=("-m", "--module")),
    "poetry": Wrapper("CP", ("--directory", "--project"), subcommand="run"),
    "pipenv": Wrapper("", ("--python",), subcommand="run"),
    "conda": Wrapper("np", ("--name", "--prefix", "--cwd"), subcommand="run"),
    "mamba": Wrapper("np", ("--name", "--prefix", "--cwd"), subcommand="run"),
    "micromamba": Wrapper("np", ("--name", "--prefix", "--cwd"), subcommand="run"),
}
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
# A shell's control operators: each separates one simple command from the next.
SHELL_OPERATORS = re.compile(r"[;&|()<>\n]+")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
DEPTH = 8  # wrappers inside wrappers: no real command goes deeper


def _takes_value(wrapper: Wrapper, option: str) -> bool:
    """Whether `option` (`-x` or `--name`, without `=value`) takes the next word as its value."""
    listed = option in wrapper.long_with_value if option.startswith("--") else option[1] in wrapper.short_with_value
    return listed != wrapper.values_unless_listed


def _options_end(program: str, wrapper: Wrapper, args: tuple[str, ...]) -> tuple[int, tuple[str, ...] | None]:
    """Where `program`'s own options in `args` end (the index of the first word that is not one of them), and the
    command they name themselves where one does (`env -S STRING`, `uv run -m MOD`), else None."""
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return i + 1, None
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d+", word) and program != "nice":
            return i, None
        if word.startswith("--"):
            name, has_value, value = word.partition("=")
            given = value if has_value else (args[i + 1] if i + 1 < len(args) else "")
            after = args[i + (1 if has_value else 2):]
            if name == "--split-string":  # env -S: the string is the command's first words
                return len(args), (*_split(given), *after)
            if name in wrapper.module_option:
                return len(args), ("python", "-m", given, *after)
            i += 1 if has_value or not _takes_value(wrapper, name) else 2
            continue
        for j, letter in enumerate(word[1:], start=1):
            rest = word[j + 1:]
            given = rest or (args[i + 1] if i + 1 < len(args) else "")
            after = args[i + (1 if rest else 2):]
            if f"-{letter}" in wrapper.module_option:
                return len(args), ("python", "-m", given, *after)
            if _takes_value(wrapper, f"-{letter}"):
                if program == "env" and letter == "S":
                    return len(args), (*_split(given), *after)
                i += 0 if rest else 1
                break
        i += 1
    return i, None


def _wrapped(program: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """The command `program` (a wrapper) runs, given its arguments; () where it runs none (`uv pip install`)."""
    wrapper = WRAPPERS[program]
    i, named = _options_end(program, wrapper, args)
    if named is not None:
        return named
    if wrapper.subcommand:  # `uv --directory D run ...`: the options before the subcommand, then its own
        if args[i:i + 1] != (wrapper.subcommand,):
            return ()
        j, named = _options_end(program, wrapper, args[i + 1:])
        if named is not None:
            return named
        i += 1 + j
    i += wrapper.positionals
    while wrapper.assignments and i < len(args) and ASSIGNMENT.fullmatch(args[i]):
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
        shown = f"{program} {WRAPPERS[program].subcommand}".rstrip()
        found += [(f"{shown} {how}", cmd) for how, cmd in inner_commands(inner, depth + 1)]
    elif program in SHELLS:
        text = _shell_string(command[1:])
        for simple in _simple_commands(text) if text is not None else []:
            found += [(f"{program} -c '{how}", cmd) for how, cmd in inner_commands(simple, depth + 1)]
    return found
