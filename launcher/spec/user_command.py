"""The user's own command (`ddpctl up ... -- CMD`): what it may not be (another launcher), which of our options it
cannot use (those only our trainer reads), and the program each node runs for it (`python` is the node's own)."""

from __future__ import annotations

import os
import re

from launcher.errors import SpecError
from launcher.spec.command_wrappers import inner_commands
from launcher.spec.launchers import MPI_INSTEAD

# The options that only reach our trainer's argv (spec/torchrun.py: trainer_argv and strategy_argv, and the
# synthetic data set's sizes, passed as trainer_args): with `-- CMD` nothing reads them. --strategy is not here:
# ddp is what a command gets anyway, and the spec refuses any other with `-- CMD` (strategies.check_strategy).
TRAINER_ONLY = ("model", "dataset", "data_dir", "epochs", "batch_size", "lr", "save_every", "seed",
                "synthetic_train_size", "synthetic_test_size", "trainer_arg", "devices", "threads_per_process",
                "average_every", "precision")

# First words that mean "the node's interpreter" (torchrun itself runs a script with its own sys.executable).
INTERPRETER_WORDS = ("python", "python3")

# Python modules that are launchers: `python -m X` would start a second launcher inside ddpctl's torchrun.
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed")
LAUNCHER_PROGRAMS = ("torchrun", "accelerate", "accelerate-launch", "deepspeed")
# MPI's launchers: ddpctl starts the MPI job itself with --launcher mpirun.
MPI_PROGRAMS = ("mpiexec", "mpirun", "orterun", "mpiexec.hydra", "mpiexec.openmpi", "mpirun.openmpi",
                "mpiexec.mpich", "mpirun.mpich")

INSTEAD = ("ddpctl is the launcher (it runs torchrun on every node): give your script itself, e.g. "
           "`-- python train.py ARGS`, and set the launch with `ddpctl up` options: --gpus (processes per node), "
           "--host (one per node), --max-restarts, --rdzv-addr/--rdzv-port")


def _is_python(word: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", os.path.basename(word)) is not None


# Python's own options that take a value (`-X dev`, `-W ignore`): the word after them is not the script.
PYTHON_OPTIONS_WITH_VALUE = "XWQ"


def _python_module(args: tuple[str, ...]) -> str | None:
    """The module `python ARGS` runs with -m (python's own options looked through, `-um mod` and `-mmod` too), or
    None when it runs a script, `-c` code or stdin."""
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--check-hash-based-pycs":
            i += 2
            continue
        if not word.startswith("-") or word in ("-", "--"):
            return None  # the script (or stdin): what follows is its own arguments
        for j, letter in enumerate(word[1:], start=1):
            rest = word[j + 1:]
            if letter == "m":
                return rest or (args[i + 1] if i + 1 < len(args) else "")
            if letter == "c":
                return None
            if letter in PYTHON_OPTIONS_WITH_VALUE:
                i += 0 if rest else 1
                break
        i += 1
    return None


def _launcher_of(command: tuple[str, ...]) -> str | None:
    """The launcher `command` itself starts (as the user would name it), wrappers not looked through."""
    if not command:
        return None
    program = os.path.basename(command[0])
    if program in LAUNCHER_PROGRAMS or program in MPI_PROGRAMS:
        return " ".join([program, *command[1:2]]) if program == "accelerate" else program
    if _is_python(program):
        module = _python_module(command[1:])
        if module is not None and (module in LAUNCHER_MODULES or module.split(".")[0] in ("accelerate", "deepspeed")):
            return f"{program} -m {module}"
    return None


def found_launcher(command: tuple[str, ...]) -> tuple[str, str] | None:
    """The launcher `command` starts, directly or through wrappers (`env`, `nice`, `sh -c '...'`), as the pair
    (its name, how the user's command reaches it: `env torchrun`, `sh -c 'torchrun`), or None when it starts none."""
    for how, inner in inner_commands(command):
        launcher = _launcher_of(inner)
        if launcher is not None:
            return launcher, how + launcher
    return None


def launcher_in(command: tuple[str, ...]) -> str | None:
    """The launcher `command` starts (as the user would name it, with its wrappers), or None when it starts none."""
    found = found_launcher(command)
    return None if found is None else found[1]


def check_user_command(command: tuple[str, ...], trainer_flags: list[str]) -> None:
    """Refuse a `-- CMD` that starts another launcher (also wrapped: `env torchrun`, `sh -c 'torchrun ...'`), and
    our trainer's options given with it (`trainer_flags`: the command-line spelling of those the user gave)."""
    found = found_launcher(command)
    if found is not None:
        launcher, reached = found
        shown = f"`-- {reached} ...'`" if "'" in reached else f"`-- {reached} ...`"
        if launcher in MPI_PROGRAMS:
            raise SpecError(f"{shown} would start a whole MPI job inside each of ddpctl's workers: {MPI_INSTEAD}")
        raise SpecError(f"{shown} would start a second launcher inside ddpctl's torchrun: {INSTEAD}")
    if trainer_flags:
        names = ", ".join(trainer_flags)
        it = "it is" if len(trainer_flags) == 1 else "they are"
        raise SpecError(f"{names}: {it} read only by ddpctl's own trainer, and `-- CMD` runs your command instead; "
                        f"pass such settings to your script after `--`, or drop {names}")


def node_command(command: tuple[str, ...], python: str) -> tuple[str, ...]:
    """The program and arguments a node runs for `-- CMD`: a first word `python` or `python3` is the node's own
    interpreter, the one running torchrun (`python`); a path the user names is kept as given."""
    if command and command[0] in INTERPRETER_WORDS:
        return (python, *command[1:])
    return command
