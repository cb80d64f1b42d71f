"""`--sbatch-option VALUE` read as sbatch reads it, so that an option contradicting the plan cannot pass in another
spelling: sbatch splits an `#SBATCH` line into words (quotes group them) and parses them with getopt_long, which
takes any unique prefix of a long option (`--partitio=x` is --partition) and an option's argument from the next
word (`--nodes 4`). Each value must be exactly one long option of sbatch's (with its argument, in one word or
two), not one of those ddpctl sets from the plan, nor one that turns the job into something else (`--wrap`,
`--array`) or changes what sbatch answers ddpctl (`--parsable`, `--test-only`, `--wait`).
"""

from __future__ import annotations

import shlex

from launcher.errors import SpecError

REQUIRED, OPTIONAL, NONE = "required", "optional", "none"

# sbatch's long options (Slurm 22.05, src/common/slurm_opt.c with sbatch's set) and whether each takes an argument.
_OPTIONAL = ("exclusive", "export", "get-user-env", "nice", "no-kill", "propagate")
_NONE = ("contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable",
         "quiet", "reboot", "requeue", "spread-job", "test-only", "usage", "use-min-nodes", "verbose", "version",
         "wait")
_REQUIRED = (
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters",
    "comment", "constraint", "container", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error", "exclude", "export-file",
    "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task",
    "gres", "gres-flags", "hint", "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user",
    "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist",
    "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "open-mode",
    "output", "partition", "power", "priority", "profile", "qos", "reservation", "signal", "sockets-per-node",
    "switches", "thread-spec", "threads-per-core", "time", "time-min", "tmp", "uid", "wait-all-nodes", "wckey",
    "wrap",
)
SBATCH_LONG_OPTIONS: dict[str, str] = {**{n: REQUIRED for n in _REQUIRED}, **{n: OPTIONAL for n in _OPTIONAL},
                                       **{n: NONE for n in _NONE}}

# Options that make the job something else, or change what sbatch tells ddpctl: never passed through.
NOT_PASSED = {
    "--wrap": "it replaces the batch script ddpctl writes",
    "--array": "it submits several jobs where the plan is one",
    "--gpus": "ddpctl asks for the plan's GPUs itself (--gpus-per-node, from its --gpus)",
    "--gpus-per-task": "ddpctl asks for the plan's GPUs itself (--gpus-per-node, from its --gpus)",
    "--gpus-per-socket": "ddpctl asks for the plan's GPUs itself (--gpus-per-node, from its --gpus)",
    "--ntasks-per-core": "ddpctl runs one task per node (torchrun starts the processes)",
    "--ntasks-per-socket": "ddpctl runs one task per node (torchrun starts the processes)",
    "--ntasks-per-gpu": "ddpctl runs one task per node (torchrun starts the processes)",
    "--clusters": "ddpctl follows the job on the cluster it submits to",
    "--parsable": "it changes the answer ddpctl reads the job id from",
    "--test-only": "it submits nothing (ddpctl runs sbatch --test-only itself before submitting)",
    "--wait": "it keeps sbatch from returning (ddpctl follows the job itself)",
    "--help": "it prints help instead of submitting", "--usage": "it prints help instead of submitting",
    "--version": "it prints the version instead of submitting",
}


def sbatch_option(value: str) -> str:
    """The sbatch long option (`--name`) that `value` holds, as sbatch would read it; SpecError (one line) unless
    the value is exactly one long option with its argument."""
    shown = f"--sbatch-option {value!r}"
    try:
        words = shlex.split(value)
    except ValueError:
        raise SpecError(f"{shown}: an unclosed quote; give one long sbatch option, e.g. '--mem=64G'") from None
    if not words or not words[0].startswith("--") or words[0] == "--":
        raise SpecError(f"{shown}: give one long sbatch option, e.g. '--mem=64G'")
    typed, has_value, _ = words[0][2:].partition("=")
    name = _resolve(typed, shown)
    takes = SBATCH_LONG_OPTIONS[name]
    expected = 2 if takes == REQUIRED and not has_value else 1
    if takes == NONE and has_value:
        raise SpecError(f"{shown}: --{name} takes no value")
    if len(words) < expected:
        raise SpecError(f"{shown}: --{name} needs a value, e.g. '--{name}=VALUE'")
    if len(words) > expected:
        with_value = " and its value" if expected == 2 else ""
        raise SpecError(f"{shown}: sbatch reads it as {len(words)} words, more than --{name}{with_value}: give one "
                        "option per --sbatch-option (repeat it for more)")
    return f"--{name}"


def _resolve(typed: str, shown: str) -> str:
    """getopt_long's rule: the exact name, else the only option it is a prefix of."""
    if typed in SBATCH_LONG_OPTIONS:
        return typed
    matches = sorted(n for n in SBATCH_LONG_OPTIONS if typed and n.startswith(typed))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise SpecError(f"{shown}: --{typed} is ambiguous for sbatch (--{', --'.join(matches)}): give the whole name")
    raise SpecError(f"{shown}: sbatch has no option --{typed} (see `man sbatch`)")


def check_sbatch_option(value: str, own: tuple[str, ...]) -> None:
    """Refuse a value that is not one sbatch option, or whose option ddpctl sets itself (`own`) or never passes."""
    if "\n" in value or "\r" in value or "#" in value:
        raise SpecError(f"--sbatch-option {value!r}: give one long sbatch option, e.g. '--mem=64G'")
    option = sbatch_option(value)
    typed = value.split()[0].split("=", 1)[0] if value.split() else ""
    spelled = f"sbatch reads {typed} as {option}; " if typed != option else ""
    if option in own:
        raise SpecError(f"--sbatch-option {value!r}: {spelled}ddpctl sets {option} itself; use its own flag (see "
                        "`ddpctl up --help`, panel Slurm)")
    if option in NOT_PASSED:
        raise SpecError(f"--sbatch-option {value!r}: {spelled}{option} is not passed on: {NOT_PASSED[option]}")
