"""What the user asks of a Slurm cluster (`up --provider slurm ...`), validated on construction."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from launcher.errors import SpecError
from launcher.spec.sbatch_options import check_sbatch_option

# Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_RE = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")  # partitions, accounts, QoS names
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.+\-&|,\[\]*:()!]+$")


@dataclass(frozen=True)
class SlurmRequest:
    """The allocation: nodes and time on a partition, with the accounting and extra sbatch options."""

    nodes: int = 1
    partition: str | None = None  # None: the cluster's default partition
    time: str | None = None  # Slurm's format; None: the partition's default
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    workdir: str | None = None  # on the shared file system; None: ~/.ddpctl/slurm
    sbatch_options: tuple[str, ...] = ()
    prelude: tuple[str, ...] = ()  # shell lines run before torchrun (module load, conda activate)
    # --requeue / --max-requeues: a signal before the time limit, a snapshot, the job requeued (places/slurm/
    # requeue.py); max_requeues is how many times at most (0: the job is not requeued).
    max_requeues: int = 0
    gpus_given: bool = True  # False: --gpus left to its default on Slurm (1 per node), which the dry run notes

    @property
    def requeue(self) -> bool:
        return self.max_requeues > 0

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise SpecError(f"--nodes {self.nodes}: give 1 or more")
        if self.time is not None:
            time_minutes(self.time)
        for flag, value in (("--partition", self.partition), ("--account", self.account), ("--qos", self.qos)):
            if value is not None and not _NAME_RE.match(value):
                raise SpecError(f"{flag} {value!r}: a Slurm name is letters, digits and . _ + -")
        if self.constraint is not None and not _CONSTRAINT_RE.match(self.constraint):
            raise SpecError(f"--constraint {self.constraint!r}: features joined with & | , (no spaces)")
        if self.workdir is not None and (not self.workdir.strip() or any(c.isspace() for c in self.workdir)):
            raise SpecError(f"--workdir {self.workdir!r}: give a folder path without spaces (sbatch's #SBATCH lines "
                            "cannot hold one)")
        for option in self.sbatch_options:  # read as sbatch reads it (launcher/spec/sbatch_options.py)
            check_sbatch_option(option, OWN_OPTIONS)
        if not 0 <= self.max_requeues <= MAX_REQUEUES_LIMIT:
            raise SpecError(f"--max-requeues {self.max_requeues}: give 1 to {MAX_REQUEUES_LIMIT}")
        if self.max_requeues and self.time is None:
            raise SpecError("--requeue needs --time: the job asks for its signal a set time before that limit")
        if self.max_requeues and time_minutes(self.time or "0") < 1:
            raise SpecError(f"--time {self.time}: --requeue needs a limit of at least a minute (Slurm's granularity)")
        for line in self.prelude:
            check_prelude_line(line)


DEFAULT_MAX_REQUEUES, MAX_REQUEUES_LIMIT = 10, 1000
# Options the batch script sets from the request and the plan: a second value would contradict the plan.
OWN_OPTIONS = ("--nodes", "--ntasks-per-node", "--ntasks", "--partition", "--time", "--account", "--qos",
               "--constraint", "--chdir", "--output", "--error", "--job-name", "--gpus-per-node", "--gres",
               "--open-mode", "--requeue", "--no-requeue", "--signal")


def check_prelude_line(line: str) -> None:
    """Refuse a --prelude line that is not one complete shell line (SpecError): several lines, a trailing
    backslash, an unclosed quote, a heredoc (whose body would need lines of its own). The batch script also runs
    the lines in a block of their own, checked by bash -n (launcher/places/slurm/prelude.py)."""
    if "\n" in line or "\r" in line or not line.strip():
        raise SpecError(f"--prelude {line!r}: give one shell line per --prelude (repeat it for more)")
    if line.rstrip().endswith("\\"):
        raise SpecError(f"--prelude {line!r}: a trailing backslash continues the line: give each line whole")
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    try:
        words = list(lexer)
    except ValueError:  # shlex does not know bash's $'...': such a line is left to bash -n
        if "$'" in line:
            return
        raise SpecError(f"--prelude {line!r}: an unclosed quote; give each line whole") from None
    if any(w in ("<<", "<<-") for w in words):
        raise SpecError(f"--prelude {line!r}: a heredoc needs lines of its own: put them in a script on the cluster "
                        "and give --prelude 'source FILE'")


def max_requeues_asked(requeue: bool | None, max_requeues: int | None) -> int:
    """--requeue alone: DEFAULT_MAX_REQUEUES; --max-requeues N: N (and --requeue implied); neither: 0."""
    if max_requeues is not None:
        if max_requeues < 1:
            raise SpecError(f"--max-requeues {max_requeues}: give 1 or more (or drop it, and --requeue, to end the job "
                            "at its time limit)")
        return max_requeues
    return DEFAULT_MAX_REQUEUES if requeue else 0


def time_minutes(text: str) -> float:
    """A Slurm time limit in minutes (SpecError when it is not one of Slurm's formats)."""
    m = _TIME_RE.match(text)
    if not m:
        raise SpecError(f"--time {text!r}: give minutes, HH:MM:SS or D-HH:MM:SS (Slurm's formats)")
    if m.group(1) is not None:  # D-HH[:MM[:SS]]
        days, hours, minutes, seconds = (int(g or 0) for g in m.group(1, 2, 3, 4))
    else:  # MM, MM:SS or HH:MM:SS
        parts = [int(g) for g in m.group(5, 6, 7) if g is not None]
        days, hours = 0, parts[0] if len(parts) == 3 else 0
        minutes, seconds = (parts[-2], parts[-1]) if len(parts) >= 2 else (parts[0], 0)
    total = days * 1440 + hours * 60 + minutes + seconds / 60
    if total <= 0:
        raise SpecError(f"--time {text!r}: give a limit above zero")
    return total
