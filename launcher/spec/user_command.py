"""The user's own command (`ddpctl up ... -- CMD`): what it may not be (another launcher), which of our options it
cannot use (those only our trainer reads), and the program each node runs for it (`python` is the node's own)."""

from __future__ import annotations

import os
import re

from launcher.errors import SpecError
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


def launcher_in(command: tuple[str, ...]) -> str | None:
    """The launcher `command` starts (as the user would name it), or None when it starts none."""
    if not command:
        return None
    program = os.path.basename(command[0])
    if program in LAUNCHER_PROGRAMS or program in MPI_PROGRAMS:
        return " ".join([program, *command[1:2]]) if program == "accelerate" else program
    if _is_python(program):
        for i, word in enumerate(command[1:], start=1):
            if word == "-m":
                module: str | None = command[i + 1] if i + 1 < len(command) else ""
            else:
                module = word[2:] if word.startswith("-m") else None
            if module is None:
                if not word.startswith("-"):
                    return None  # the script: what follows is its own arguments
                continue
            if module in LAUNCHER_MODULES or module.split(".")[0] in ("accelerate", "deepspeed"):
                return f"{program} -m {module}"
            return None
    return None


def check_user_command(command: tuple[str, ...], trainer_flags: list[str]) -> None:
    """Refuse a `-- CMD` that starts another launcher, and our trainer's options given with it (`trainer_flags`:
    the command-line spelling of those the user gave)."""
    launcher = launcher_in(command)
    if launcher in MPI_PROGRAMS:
        raise SpecError(f"`-- {launcher} ...` would start a whole MPI job inside each of ddpctl's workers: "
                        f"{MPI_INSTEAD}")
    if launcher is not None:
        raise SpecError(f"`-- {launcher} ...` would start a second launcher inside ddpctl's torchrun: {INSTEAD}")
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
