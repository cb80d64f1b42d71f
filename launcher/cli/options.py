"""Launch options declared once, as data: `up`, `sweep` (and any later command that launches) take their options
from these blocks, and `--config` files, `--save-config` and `--from` read the same declarations.

A block is a tuple of LaunchOption; a command lists the blocks it takes in `takes_options(...)`. To add options,
declare a new block here and add it to LAUNCH_BLOCKS (and to the commands' `takes_options`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from launcher.spec.launchers import LAUNCHERS
from launcher.spec.strategies import PRECISIONS, STRATEGIES

# `up --help` groups its ~40 options into these panels.
RUN, HOSTS, OUTPUT = "Run", "Hosts / SSH", "Output"
DOCKER, VAST = "Docker (--runtime docker)", "Vast.ai (--provider vast)"
SLURM = "Slurm (--provider slurm)"
STRATEGY = "Strategy"

# What a value may be in a config file, by the option's Python type.
KINDS = {int: "int", float: "float", bool: "bool", str: "str", Path: "path", list: "repeated"}


@dataclass(frozen=True)
class LaunchOption:
    """One option: its name (the Python parameter and the config key), type, default, help and panel."""

    name: str
    type: type
    default: Any
    help: str
    panel: str = RUN
    optional: bool = False  # None allowed (the default decides later)
    flags: tuple[str, ...] = ()  # extra spellings, e.g. "-i"
    choices: tuple[str, ...] = ()
    hidden: bool = False
    in_config: bool = True  # False: what this invocation does (--dry-run, --json), not what the experiment is

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def flag_decl(self) -> str:
        """The Typer spelling: `--x/--no-x` for a negatable flag."""
        flag = _FLAG_OVERRIDES.get(self.name, self.flag)
        if self.type is bool and self.in_config and self.name not in NOT_NEGATABLE:  # --no-x undoes a config's x
            return f"{flag}/--no-{flag[2:]}"
        return flag

    @property
    def kind(self) -> str:
        """int, float, bool, str, path, repeated or choice: what a config file may give for it."""
        return "choice" if self.choices else KINDS[self.type]

    def annotation(self) -> Any:
        base: Any = list[str] if self.type is list else self.type
        return base | None if self.optional else base


def opt(name: str, type_: type, default: Any, help_: str, panel: str = RUN, **kw: Any) -> LaunchOption:
    """Shorthand for a declaration line."""
    return LaunchOption(name, type_, default, help_, panel, **kw)


WHERE_OPTIONS = (
    opt("host", list, (), r"\[user@]host[:port] or ssh alias; repeat, node 0 first.", HOSTS),
    opt("runtime", str, "native", "native, docker or auto (on SSH hosts).", RUN, choices=("native", "docker", "auto")),
    opt("provider", str, None, "local, ssh, vast or slurm \\[default: ssh with --host, else local].", RUN,
        optional=True, choices=("local", "ssh", "vast", "slurm")),
    opt("python", str, None, "The Python that runs torchrun, on the hosts (default python3) or here (default: the "
        "one running ddpctl), e.g. a venv's bin/python.", RUN, optional=True),
    opt("env", list, (), "NAME=VALUE for every rank, or NAME: its value from this shell (for secrets); repeat.", RUN),
    opt("image", str, None, "The image to run: with --runtime docker (or auto), a local image shipped to the hosts "
        "(default ddpctl:latest); with --provider vast, the registry reference each machine starts from (required; "
        "`ddpctl image push`).", DOCKER, optional=True),
    opt("registry", str, None, "With --runtime docker (or auto): hosts pull this image reference instead of "
        "receiving the local --image.", DOCKER, optional=True),
    opt("identity_file", Path, None, "SSH private key.", HOSTS, optional=True, flags=("-i",)),
    opt("accept_new_host_keys", bool, False, "Trust and record unknown host keys (never changed ones).", HOSTS),
    opt("connect_timeout", float, 10.0, "Seconds to wait for each SSH connection.", HOSTS),
    opt("rdzv_addr", str, None, "Node 0's address as the other nodes reach it.", HOSTS, optional=True),
    opt("rdzv_port", int, None, "Rendezvous port on node 0 \\[default: 29400, or a free one].", HOSTS,
        optional=True),
    opt("allow_public_rendezvous", bool, False, "Allow node 0's rendezvous on a public address (only behind a "
        "firewall: it is unauthenticated).", HOSTS),
    opt("stall_timeout", float, 0.0, "Stop the run (on hosts: every node, then pull; on Slurm: scancel the job, "
        "then pull) when no training step was seen for this many seconds (a hung collective; a job waiting in "
        "Slurm's queue never counts); 0: no stop, a node without a step is only named, after 5x its "
        "slowest step interval (at least 60 s; 300 s before the first step).", HOSTS),
)

VAST_OPTIONS = (
    opt("gpu_name", str, None, 'Vast.ai: GPU model, e.g. "RTX 3080".', VAST, optional=True),
    opt("max_price", float, None, "Vast.ai: most $/hour per machine.", VAST, optional=True),
    opt("min_reliability", float, 0.95, "Vast.ai: least reliability, 0..1.", VAST),
    opt("disk", float, 32.0, "Vast.ai: disk per machine, GB.", VAST),
    opt("down", bool, False, "Vast.ai: destroy the machines once results are verified.", VAST),
    opt("max_cost", float, None, "Vast.ai: stop, pull and destroy before the run's spend (a sweep's: all its "
        "runs') passes this many USD.",
        VAST, optional=True),
    opt("max_cost_reserve", float, 120.0, "Seconds of spend --max-cost keeps for the final pull and teardown.",
        VAST, hidden=True),
    opt("ready_timeout", float, 900.0, "Vast.ai: seconds for a machine to start.", VAST),
    opt("expected_hours", float, None, "Vast.ai: how long the run takes; rented contracts must outlast it (default "
        "1 hour), with a margin.", VAST, optional=True),
    opt("registry_login", bool, False, "Vast.ai: pull a private image with the credentials of `docker login` "
        "(~/.docker/config.json) or $DDPCTL_REGISTRY_LOGIN (USER:TOKEN).", VAST),
    opt("autostop", float, None, "Vast.ai, --detach: stop (not destroy) the machines this many minutes after "
        "training ended with no pull (default 30; 0: never).", VAST, optional=True),
    opt("interruptible", bool, False, "Vast.ai: rent interruptible (bid) machines; an outbid or lost machine is "
        "replaced and every rank resumes from the newest pulled snapshot.", VAST),
    opt("bid", float, None, "Vast.ai, --interruptible: bid in $/hour per machine (default: each offer's min_bid "
        "+25%).", VAST, optional=True),
)

# `up --provider slurm --host LOGIN`: the allocation asked of the cluster (launcher/spec/slurm_request.py).
SLURM_OPTIONS = (
    opt("partition", str, None, "Slurm: partition \\[default: the cluster's default].", SLURM, optional=True),
    opt("time", str, None, "Slurm: time limit (minutes, HH:MM:SS or D-HH:MM:SS).", SLURM, optional=True),
    opt("account", str, None, "Slurm: account to charge.", SLURM, optional=True),
    opt("qos", str, None, "Slurm: quality of service.", SLURM, optional=True),
    opt("constraint", str, None, "Slurm: node features, e.g. a100.", SLURM, optional=True),
    opt("workdir", str, None, "Slurm: folder on the shared file system for code and runs (may name $SCRATCH) "
        "\\[default: ~/.ddpctl/slurm].", SLURM, optional=True),
    opt("sbatch_option", list, (), "Slurm: another sbatch option, e.g. '--mem=64G'; repeat.", SLURM),
    opt("prelude", list, (), "Slurm: a shell line run before torchrun, e.g. 'module load cuda/12.4'; repeat.", SLURM),
    opt("requeue", bool, False, "Slurm: train past the time limit: signalled before it, the run saves a snapshot "
        "and the job requeues itself, resuming from it.", SLURM),
    opt("max_requeues", int, None, "Slurm: requeue at most this many times (implies --requeue) \\[default: 10].",
        SLURM, optional=True),
)

# `up` only: one run's experiment (sweep declares the same names as comma lists or preset-defaulted values).
RUN_OPTIONS = (
    opt("gpus", int, None, "Processes per node (default: the node's GPUs, or 2 on CPU; 1 with --provider slurm).",
        RUN, optional=True),
    opt("model", str, "mnist-cnn", "mnist-cnn, mnist-cnn-small (write-up 5) or resnet18.", RUN),
    opt("dataset", str, "synthetic", "synthetic, mnist or cifar10.", RUN),
    opt("data_dir", str, None, "Folder holding the data set files.", RUN, optional=True),
    opt("epochs", int, 3, "Epochs to train.", RUN),
    opt("batch_size", int, 32, "Batch size per process.", RUN),
    opt("lr", float, 0.01, "SGD learning rate.", RUN),
    opt("save_every", int, 1, "Snapshot every N epochs.", RUN),
    opt("seed", int, 0, "Seed for data order, initial weights and synthetic data.", RUN),
    opt("launcher", str, "torchrun", "How `-- CMD` starts on each node: torchrun (one worker per --gpus), spawn "
        "(the script starts its own processes: run once per node, told its place by DDPCTL_* variables) or mpirun "
        "(an MPI job across the nodes).", RUN, choices=LAUNCHERS),
    opt("max_restarts", int, 0, "torchrun restarts after a worker fails (resume from snapshots).", RUN),
    opt("name", str, None, "Run name (letters, digits, . _ -); an id is derived from it.", RUN, optional=True),
    opt("synthetic_train_size", int, None, "Synthetic data set: training samples.", RUN, optional=True),
    opt("synthetic_test_size", int, None, "Synthetic data set: test samples.", RUN, optional=True),
    opt("trainer_arg", list, (), "Extra option passed to the trainer.", RUN, hidden=True),
)

# The parallel strategy and its options (`up`; `sweep` declares the same names, --strategy as a comma list).
DEVICES_HELP = "dp, mp, ddp-mp: devices, e.g. cpu,cpu or cuda:0,cuda:1 (default: the GPUs)."
THREADS_HELP = "Intra-op threads per process (default: the node's cores / its processes)."
AVERAGE_HELP = "local-sgd: average parameters every N steps, each 'epoch' (default) or at the 'end'."
PRECISION_HELP = "fp32 (default) or bf16 (autocast)."
STRATEGY_OPTIONS = (
    opt("strategy", str, "ddp", "ddp (torchrun), spawn, dp, mp, ddp-mp, hogwild or local-sgd; --gpus stays the "
        "processes / GPUs to use (docs/guides/strategies.md).", STRATEGY, choices=STRATEGIES),
    opt("devices", str, None, DEVICES_HELP, STRATEGY, optional=True),
    opt("threads_per_process", int, None, THREADS_HELP, STRATEGY, optional=True),
    opt("average_every", str, None, AVERAGE_HELP, STRATEGY, optional=True),
    opt("precision", str, "fp32", PRECISION_HELP, STRATEGY, choices=PRECISIONS),
)

# `up` only: one run's own way of being followed, and the machines it rents (a sweep rents per layout).
UP_WHERE_OPTIONS = (
    opt("detach", bool, False, "Start the run and return (on this machine too: it goes on without the terminal); "
        "follow with status/logs, stop with down.", HOSTS),
    opt("nodes", int, 1, "Vast.ai: machines to rent; Slurm: nodes to allocate (one torchrun node each).", RUN),
    opt("outputs", list, (), "With `-- CMD` on hosts: bring back only these of the files your script writes in its "
        "working directory (gitignore-style: 'snapshot.pt', '*.csv', 'checkpoints/'); repeat. Its "
        "$DDPCTL_OUTPUT_DIR always comes back.", OUTPUT),
    opt("check_bandwidth", bool, False, "SSH hosts: before training, measure all-reduce bus bandwidth and latency "
        "between the nodes (as `ddpctl doctor --bandwidth`) and record them in run.json.", HOSTS),
)

UP_OUTPUT_OPTIONS = (
    opt("runs_dir", Path, Path("runs"), "Where run directories live.", OUTPUT, in_config=False),
    opt("json_out", bool, False, "Print the final summary as JSON on stdout.", OUTPUT, in_config=False),
    opt("progress", str, "auto", "How the run is shown as it goes: live (a display redrawn in place), plain "
        "(time-stamped lines as things happen, for a log file, a pipe or CI), or auto: live on a terminal that can "
        "redraw, plain otherwise (TERM=dumb included).", OUTPUT, choices=("auto", "live", "plain"), in_config=False),
    opt("quiet", bool, False, "Hide the live tail of global rank 0's output under the progress display.", OUTPUT,
        in_config=False),
    opt("dry_run", bool, False, "Print what each node would run (hosts are probed, read-only); change nothing.",
        OUTPUT, in_config=False),
    opt("no_probe", bool, False, "With --dry-run: connect to no host; what only the hosts can tell is shown as "
        "unknown.", OUTPUT, in_config=False),
    opt("config", Path, None, "TOML file of launch options (same names as the flags); the command line overrides "
        "it.", OUTPUT, optional=True, in_config=False),
    opt("save_config", Path, None, "With --dry-run: write this run's options to a TOML file for --config "
        "(--env values are not written: names only).", OUTPUT, optional=True, in_config=False),
    opt("from_run", Path, None, "Start a new run like this one (runs/<id> or its run.json); options given here "
        "override the recorded ones.", OUTPUT, optional=True, in_config=False),
    opt("save_plan", Path, None, "With --dry-run: write the plan it prints to a JSON file, for --plan.", OUTPUT,
        optional=True, in_config=False),
    opt("plan", Path, None, "Run exactly the plan saved with --dry-run --save-plan (its spec, hosts, runtime and "
        "code), once the hosts are found to give it still.", OUTPUT, optional=True, in_config=False),
)

# Every block a launching command may take; config keys are the names in these.
LAUNCH_BLOCKS: tuple[tuple[LaunchOption, ...], ...] = (RUN_OPTIONS, STRATEGY_OPTIONS, WHERE_OPTIONS, UP_WHERE_OPTIONS,
                                                        VAST_OPTIONS, SLURM_OPTIONS, UP_OUTPUT_OPTIONS)

_FLAG_OVERRIDES = {"json_out": "--json", "from_run": "--from"}
NOT_NEGATABLE = ("down",)  # config flags with no --no-x form (flags not kept in a config have none either)


def _flag(option: LaunchOption) -> str:
    return _FLAG_OVERRIDES.get(option.name, option.flag)


def takes_options(*blocks: tuple[LaunchOption, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command `def cmd(ctx, ..., **values)` one Typer option per declaration of `blocks`."""
    declared = [o for block in blocks for o in block]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command).parameters.values() if p.kind != p.VAR_KEYWORD]
        params = own + [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation(),
                                          default=_option_with_flag(o)) for o in declared]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {**{p.name: p.annotation for p in own}, **{o.name: o.annotation()
                                                                            for o in declared}}
        command.__launch_options__ = tuple(declared)  # type: ignore[attr-defined]
        return command

    return decorate


def _option_with_flag(option: LaunchOption) -> Any:
    default = list(option.default) if option.type is list else option.default
    return typer.Option(default, option.flag_decl, *option.flags, help=option.help, rich_help_panel=option.panel,
                        hidden=option.hidden)


def declared_options(command: Callable[..., Any]) -> dict[str, LaunchOption]:
    """The launch options a command takes, by name."""
    return {o.name: o for o in getattr(command, "__launch_options__", ())}


def flag_of(name: str) -> str:
    """The command-line spelling of a declared option."""
    option = next((o for block in LAUNCH_BLOCKS for o in block if o.name == name), None)
    return _flag(option) if option else "--" + name.replace("_", "-")
