"""What to run: one validated, immutable run specification.

Everything a node needs to know about the experiment is here; where it runs (hosts) and how (native or
docker) are decided elsewhere. Construction validates, so a RunSpec that exists is a runnable one.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from launcher.errors import SpecError
from launcher.spec import strategies
from launcher.spec.launchers import check_launcher
from launcher.spec.trainer_bounds import check_trainer_args, check_trainer_value

MODELS = ("mnist-cnn", "mnist-cnn-small", "resnet18")
DATASETS = ("synthetic", "mnist", "cifar10")
BACKENDS = ("auto", "nccl", "gloo")
RUNTIMES = ("native", "docker", "auto")

# A name that is safe as a file name, a docker container name and a torchrun rendezvous id.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

DEFAULT_RDZV_PORT = 29400
MAX_NAME = 64 - len("-20261121-203916-cea2")  # a run id is NAME-YYYYmmdd-HHMMSS-xxxx, a safe name of <= 64
# What run.json and the sweep manifest hold in place of each --env value: they are API keys and tokens.
MASKED = "***"


def check_name(name: str, what: str = "--name") -> str:
    """Return `name` if it is a safe run name, else raise SpecError saying what is allowed."""
    if not SAFE_NAME.fullmatch(name) or ".." in name:
        raise SpecError(
            f"{what} {name!r} is not a valid name: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_port(port: int, option: str = "--rdzv-port") -> int:
    """Return `port` if it is an unprivileged TCP port (1024-65535), else raise SpecError saying so."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise SpecError(f"{option} must be between 1024 and 65535, got {port}")
    return port


def check_python(python: str, option: str = "--python") -> str:
    """Return `python` if it names an interpreter (not empty, no spaces around it), else raise SpecError."""
    if not python or python != python.strip():
        raise SpecError(f"{option} {python!r} names no interpreter: give a command or path such as python3 or "
                        "/opt/venv/bin/python")
    return python


def command_stem(command: tuple[str, ...] | list[str]) -> str:
    """What a `-- CMD` run is called when not named: its script's name (`python train.py` -> train, `python -m
    pkg.train` -> train), else its program's; reduced to a safe name."""
    words = list(command)
    picked = words[0] if words else "command"
    for i, word in enumerate(words[1:], start=1):
        if word.endswith(".py"):
            picked = word
            break
        if word == "-m" and i + 1 < len(words):
            picked = words[i + 1].rsplit(".", 1)[-1]
            break
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", picked.rsplit("/", 1)[-1].removesuffix(".py")).strip("-._")
    return stem[:MAX_NAME] or "command"


def new_run_id(name: str | None, model: str, dataset: str, command: tuple[str, ...] | list[str] = ()) -> str:
    """A fresh run id: the user's name (or the `-- CMD` script's, or model-dataset), a UTC timestamp and 4 random
    hex digits."""
    stem = check_name(name) if name is not None else command_stem(command) if command else f"{model}-{dataset}"
    if name is not None and len(name) > MAX_NAME:
        raise SpecError(f"--name {name!r} has {len(name)} characters: at most {MAX_NAME}, since the run id adds "
                        "a timestamp and 4 hex digits (21 characters)")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{stem}-{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunSpec:
    """The experiment: model, data, hyper-parameters and the process layout (nodes x processes)."""

    run_id: str
    model: str = "mnist-cnn"
    dataset: str = "synthetic"
    data_dir: str | None = None
    epochs: int = 3
    batch_size: int = 32
    lr: float = 0.01
    save_every: int = 1
    seed: int = 0
    max_restarts: int = 0
    nproc_per_node: int = 2
    nnodes: int = 1
    backend: str = "auto"
    # `ddpctl up -- CMD...`: the user's own command replaces our trainer under torchrun.
    user_command: tuple[str, ...] = ()
    # Extra trainer options (synthetic sizes, fault injection for tests), passed through verbatim.
    trainer_args: tuple[str, ...] = ()
    rdzv_port: int = DEFAULT_RDZV_PORT
    python: str = "python3"
    extra_env: tuple[tuple[str, str], ...] = field(default=())
    # Names of --env variables whose values were not stored (a spec read back from JSON): it cannot run again.
    withheld_env: tuple[str, ...] = ()
    # How the work is parallelised (launcher/spec/strategies.py); None: the trainer's default for the option.
    strategy: str = "ddp"
    devices: str | None = None
    threads_per_process: int | None = None
    average_every: str | None = None
    precision: str = "fp32"
    # How `-- CMD` starts on each node (launcher/spec/launchers.py): torchrun, spawn or mpirun.
    launcher: str = "torchrun"

    def __post_init__(self) -> None:
        check_name(self.run_id, "run id")
        if not self.user_command:
            if self.model not in MODELS:
                raise SpecError(f"unknown model {self.model!r}: choose one of {', '.join(MODELS)}")
            if self.dataset not in DATASETS:
                raise SpecError(f"unknown data set {self.dataset!r}: choose one of {', '.join(DATASETS)}")
        # The trainer's own bounds (launcher/spec/trainer_bounds.py), so a bad value is refused before torchrun.
        for option, value in (("--epochs", self.epochs), ("--batch-size", self.batch_size),
                              ("--save-every", self.save_every), ("--seed", self.seed), ("--lr", self.lr)):
            check_trainer_value(option, value)
        _at_least(self.max_restarts, 0, "--max-restarts")
        _at_least(self.nproc_per_node, 1, "--gpus")
        _at_least(self.nnodes, 1, "the number of nodes")
        if not self.user_command:
            check_trainer_args(self.trainer_args)
        if self.backend not in BACKENDS:
            raise SpecError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        check_port(self.rdzv_port)
        strategies.check_strategy(self.strategy, devices=self.devices, average_every=self.average_every,
                                  user_command=bool(self.user_command), nnodes=self.nnodes,
                                  nproc_per_node=self.nproc_per_node)
        check_launcher(self.launcher, user_command=bool(self.user_command), max_restarts=self.max_restarts)
        if self.threads_per_process is not None:
            check_trainer_value("--threads-per-process", self.threads_per_process)
        if self.precision not in strategies.PRECISIONS:
            raise SpecError(f"--precision {self.precision!r}: choose one of {', '.join(strategies.PRECISIONS)}")
        check_python(self.python)
        for key in [k for k, _ in self.extra_env] + list(self.withheld_env):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise SpecError(f"environment variable name {key!r} is not valid")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def with_layout(self, *, nnodes: int, nproc_per_node: int) -> RunSpec:
        """The same experiment on another process layout (validated again)."""
        return replace(self, nnodes=nnodes, nproc_per_node=nproc_per_node)

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON, with `extra_env` as {NAME: "***"}: the values are never written anywhere."""
        data = asdict(self)
        data["user_command"] = list(self.user_command)
        data["trainer_args"] = list(self.trainer_args)
        data["extra_env"] = {key: MASKED for key in sorted([k for k, _ in self.extra_env] + list(self.withheld_env))}
        del data["withheld_env"]
        # The resolved layout (what --gpus became for the strategy); derived, so from_json drops it again.
        data["torchrun_workers_per_node"] = strategies.torchrun_workers(self.strategy, self.nproc_per_node)
        data["processes_per_node"] = strategies.processes_per_node(self.strategy, self.nproc_per_node)
        data["trainer_processes"] = strategies.trainer_processes(self.strategy, self.nproc_per_node)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        """A spec from to_json(); its --env variables come back as `withheld_env` names (a value other than "***",
        from a run.json written before values were masked, is kept)."""
        data = dict(data)
        data["user_command"] = tuple(data.get("user_command", ()))
        data["trainer_args"] = tuple(data.get("trainer_args", ()))
        env = dict(data.get("extra_env", {}))
        data["extra_env"] = tuple(sorted((k, v) for k, v in env.items() if v != MASKED))
        data["withheld_env"] = tuple(sorted(k for k, v in env.items() if v == MASKED))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _at_least(value: int, low: int, option: str) -> None:
    if not isinstance(value, int) or value < low:
        raise SpecError(f"{option} must be an integer >= {low}, got {value!r}")
