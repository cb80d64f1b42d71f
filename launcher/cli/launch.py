"""The launch options validated once, into typed objects: UpOptions (where and how) and, for `up`, the RunSpec.
`up` and `sweep` both go through `where_options`; the layering of `--from`, `--config` and the command line is
`resolve_values`."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from launcher.cli.config import check_values, read_config
from launcher.cli.options import LaunchOption, flag_of
from launcher.errors import SpecError
from launcher.places.option_words import it as _it
from launcher.places.option_words import listed as _listed
from launcher.places.registry import PLACES, chosen_name, place_named
from launcher.planning.request import UpOptions
from launcher.spec.hosts import HostSpec, host_name_problem, parse_hosts
from launcher.spec.launchers import check_script
from launcher.spec.run_spec import DEFAULT_RDZV_PORT, RunSpec, check_port, new_run_id
from launcher.spec.script_look import look
from launcher.spec.user_command import TRAINER_ONLY, check_user_command
from launcher.spec.validate import check_runs_dir, check_seconds

if TYPE_CHECKING:
    from launcher.places.base import Place

# The strategy options (RunSpec validates them; None: the spec's default).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
STRATEGY_SPEC_OPTIONS = ("strategy", "devices", "threads_per_process", "average_every", "precision")
SPEC_OPTIONS = ("model", "dataset", "data_dir", "epochs", "batch_size", "lr", "save_every", "seed", "max_restarts",
                "launcher")


def resolve_values(ctx: typer.Context, values: dict[str, Any], declared: dict[str, LaunchOption],
                   recorded: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The options after layering defaults < `recorded` (--from) < --config < the command line, and the names of
    those set by anything but a default (what `up` checks fits the provider), in declaration order."""
    layered = dict(recorded or {})
    if values.get("config") is not None:
        layered.update(read_config(values["config"], declared))
    merged, given = dict(values), []
    for name, option in declared.items():
        source = ctx.get_parameter_source(name)
        typed = source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
        if not typed and name in layered:
            merged[name] = layered[name]
        default = list(option.default) if option.type is list else option.default
        if merged.get(name) is False:  # --no-x (or x = false) asks for what happens anyway
            continue
        if typed or (name in layered and merged.get(name) != default):  # a file's default value is no request
            given.append(name)
    if not values.get("command") and layered.get("command"):  # `-- CMD` on the command line wins over a file's
        merged["command"] = layered["command"]
    return merged, given


def where_options(values: dict[str, Any], given: list[str], *, show_progress: bool, dry_run: bool = False,
                  hosts: tuple[HostSpec, ...] | None = None) -> UpOptions:
    """Where and how to run, from the declared WHERE and VAST options; SpecError on anything that does not fit."""
    hosts = parse_hosts(values["host"]) if hosts is None else hosts
    runtime = values["runtime"]
    if runtime not in ("native", "docker", "auto"):
        raise SpecError(f"--runtime {runtime!r}: choose one of native, docker, auto")
    stall_timeout = values["stall_timeout"]
    if stall_timeout < 0 or not math.isfinite(stall_timeout):
        raise SpecError(f"--stall-timeout {stall_timeout:g}: give seconds >= 0 (0 turns it off)")
    check_seconds(values["connect_timeout"], "--connect-timeout")
    if values["rdzv_port"] is not None:
        check_port(values["rdzv_port"])
    from launcher.runtimes.image import check_reference

    for name in ("image", "registry"):
        if values[name] is not None:
            check_reference(values[name], flag_of(name))
    provider = chosen_name(values["provider"], hosts)
    check_options_fit(provider, hosts, runtime, [flag_of(n) for n in given])
    asked = place_named(provider).requests(values)  # what to rent (vast) or allocate (slurm), from its options
    vast, slurm = asked.get("vast"), asked.get("slurm")
    if values.get("no_probe") and not dry_run:
        raise SpecError("--no-probe only changes --dry-run (a run always probes its hosts): add --dry-run or drop it")
    if stall_timeout and values.get("detach"):
        raise SpecError("--stall-timeout acts while `up` follows the run: drop --detach, or stop a stalled run "
                        "with `ddpctl down`")
    if runtime == "docker" and not hosts:
        raise SpecError("--runtime docker needs --host (locally, use `docker compose up`)")
    if values.get("check_bandwidth") and (not place_named(provider).hosts_per_node or len(hosts) < 2):
        raise SpecError("--check-bandwidth measures the network between SSH hosts: give two --host or more")
    parse_env(values["env"])
    rdzv_problem = values["rdzv_addr"] and host_name_problem(values["rdzv_addr"])
    if rdzv_problem:
        raise SpecError(f"--rdzv-addr: {rdzv_problem}; give node 0's address as the other nodes reach it")
    return UpOptions(
        runs_dir=check_runs_dir(values["runs_dir"]), hosts=hosts, runtime=runtime, show_progress=show_progress,
        dry_run=dry_run, detach=bool(values.get("detach")), allow_public_rendezvous=values["allow_public_rendezvous"],
        identity_file=values["identity_file"], accept_new_host_keys=values["accept_new_host_keys"],
        connect_timeout=values["connect_timeout"], rdzv_addr=values["rdzv_addr"], image=values["image"],
        registry=values["registry"], auto_rdzv_port=values["rdzv_port"] is None, provider=provider, vast=vast,
        auto_gpus=values.get("gpus") is None and (bool(hosts) or vast is not None) and slurm is None, slurm=slurm,
        stall_timeout=stall_timeout,
        probe=not values.get("no_probe"), show_output=not values.get("quiet"),
        check_bandwidth=bool(values.get("check_bandwidth")),
    )  # fmt: skip


def parse_env(items: list[str], environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """--env items, sorted by name: NAME=VALUE, or a bare NAME whose value is taken from ddpctl's own environment
    (as `docker run -e NAME` does), so that a secret such as WANDB_API_KEY is on no command line, not even here."""
    environ = os.environ if environ is None else environ
    env = []
    for item in items:
        key, sep, value = item.partition("=")
        if not ENV_NAME.fullmatch(key):
            raise SpecError(f"--env {item!r}: {key!r} is not valid as a variable name (letters, digits and _, not "
                            "first a digit): give NAME=VALUE, or NAME to pass the value this shell has")
        if not sep:
            if key not in environ:
                raise SpecError(f"--env {key}: {key} is not set in this shell: export it first, or give {key}=VALUE")
            value = environ[key]
        env.append((key, value))
    return tuple(sorted(env))


def up_spec(values: dict[str, Any], where: UpOptions, given: tuple[str, ...] | list[str] = ()) -> RunSpec:
    """The validated RunSpec of `up`'s options (after where_options, which picked the provider); `given`: the names
    of the options the user set (typed or from --config), checked against `-- CMD`."""
    from launcher.execute.this_machine.defaults import default_python

    if values["command"]:
        check_user_command(tuple(values["command"]), [flag_of(name) for name in given if name in TRAINER_ONLY])
    if values.get("outputs"):
        from launcher.transport.outputs import check_outputs_option

        check_outputs_option(values["outputs"], values["command"])
    if values["command"] and not place_named(where.provider).runs_here:
        from launcher.transport.sync import check_ship_dir

        check_ship_dir(Path.cwd())
    trainer_args: list[str] = []
    for name in ("synthetic_train_size", "synthetic_test_size"):
        if values[name] is not None:
            trainer_args += [flag_of(name), str(values[name])]
    gpus = values["gpus"]
    if gpus is None and not (where.hosts or where.vast):  # this machine's run: its GPUs (the local executor's)
        from launcher.execute.this_machine.run import default_local_procs

        gpus = default_local_procs()
    spec = RunSpec(
        run_id=new_run_id(values["name"], values["model"], values["dataset"], values["command"] or ()),
        **{name: values[name] for name in SPEC_OPTIONS},
        nproc_per_node=gpus if gpus is not None else 1,
        nnodes=where.vast.nodes if where.vast else where.slurm.nodes if where.slurm else max(1, len(where.hosts)),
        user_command=tuple(values["command"] or ()), trainer_args=tuple(trainer_args + list(values["trainer_arg"])),
        python=values["python"] if values["python"] is not None else default_python(
            place_named(where.provider).runs_here),
        rdzv_port=DEFAULT_RDZV_PORT if values["rdzv_port"] is None else values["rdzv_port"],
        extra_env=parse_env(values["env"]),
        **{name: values[name] for name in STRATEGY_SPEC_OPTIONS if values.get(name) is not None},
    )  # fmt: skip
    if spec.user_command:
        check_launch_fits(spec, where, explicit="launcher" in given)
    return spec


def check_launch_fits(spec: RunSpec, where: UpOptions, *, explicit: bool) -> None:
    """Refuse what the launcher cannot run (its runtime, what the script itself does: launcher/spec/script_look.py);
    print the warnings of a launcher the user chose outright."""
    if spec.launcher != "torchrun" and where.runtime == "docker":
        raise SpecError(f"--launcher {spec.launcher} runs on the hosts' own Python: drop --runtime docker (docker "
                        "nodes run torchrun)")
    if spec.launcher == "mpirun" and where.detach and spec.nnodes > 1:
        raise SpecError("--launcher mpirun across nodes gives node 0 SSH access to the others for the run only, "
                        "removed when `up` ends: drop --detach (follow the run to its end)")
    findings = look(spec.user_command, Path.cwd())
    for warning in check_script(findings, spec.launcher, explicit=explicit, nnodes=spec.nnodes,
                                nproc_per_node=spec.nproc_per_node):
        typer.echo(f"warning: {warning}", err=True)


def _flags(names: tuple[str, ...]) -> set[str]:
    return {flag_of(name) for name in names}


def check_options_fit(provider: str, hosts: tuple[HostSpec, ...], runtime: str, given: list[str]) -> None:
    """Refuse options the chosen place and runtime would silently ignore, and places that lack hosts (each place
    names its own options and those it has no use for: launcher/places/)."""
    place = place_named(provider)
    for other in PLACES.values():  # another place's own options (those this place has no use for: below)
        theirs = [flag for flag in given if flag in _flags(other.own_options) - _flags(place.also_takes)
                  - _flags(place.unused_options)] if other is not place else []
        if theirs:
            raise SpecError(_taken_elsewhere(theirs, other, place))
    place.check_hosts(hosts)
    place.check_options(runtime, given, _flags)


def _taken_elsewhere(flags: list[str], owner: Place, chosen: Place) -> str:
    """The error for `owner`'s own options given for `chosen`; where a third place reads some of them too (Slurm:
    --nodes), it is named beside the owner."""
    sharer = next((p for p in PLACES.values() if p not in (owner, chosen) and set(flags) & _flags(p.also_takes)),
                  None)
    also = [flag for flag in flags if sharer is not None and flag in _flags(sharer.also_takes)]
    where = f"--provider {owner.name}" + (
        " only" if sharer is None else f" or {sharer.name}" if also == flags else
        f" ({_listed(also, 'is', 'are')} also for --provider {sharer.name})")
    hint = owner.own_options_hint + (f" or {sharer.own_options_hint.removeprefix('add ')}" if sharer else "")
    return f"{_listed(flags, 'is', 'are')} for {where}: {hint}, or drop {_it(flags)}"


def recorded_launch(run_ref: Path, declared: dict[str, LaunchOption]) -> tuple[dict[str, Any], str, list[str]]:
    """--from: the recorded options of a run (its directory or run.json), its id, and its --env names."""
    from launcher.results.rundir import RunDir

    run_dir = RunDir.open(run_ref.parent if run_ref.name == "run.json" and run_ref.is_file() else run_ref)
    record = run_dir.typed_record()
    where = f"{run_dir.path / 'run.json'}: options"
    if record.options is None:
        raise SpecError(f"{run_dir.path / 'run.json'} has no recorded options (written by an older ddpctl): start "
                        "the run again with its options, or with --config")
    options = dict(record.options)
    env_names = options.pop("env_names", [])
    command = options.pop("command", None)  # the `-- CMD ...` after the options
    values = check_values(options, declared, where)
    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        values["command"] = command
    values.setdefault("gpus", run_dir.spec().nproc_per_node)  # what --gpus resolved to on those hosts
    return values, record.run_id, list(env_names)


def check_from_env(env_names: list[str], env: list[str], run_id: str) -> None:
    """A run's --env values are not recorded: --from needs them given again."""
    missing = sorted(set(env_names) - {item.partition("=")[0] for item in env})
    if missing:
        raise SpecError(f"run {run_id} was started with --env {', '.join(missing)}: the values were not recorded; "
                        "give them again with --env NAME=VALUE, or --env NAME with NAME exported in this shell")


def with_env(spec: RunSpec, env: tuple[tuple[str, str], ...]) -> RunSpec:
    """`spec` with the --env values it was recorded without (a sweep entry read back from sweep.json)."""
    given = dict(env)
    missing = [name for name in spec.withheld_env if name not in given]
    if missing:
        raise SpecError(f"the values of --env {', '.join(missing)} were not stored (sweep.json keeps names only): "
                        "give them again with --env NAME=VALUE")
    return replace(spec, extra_env=tuple(sorted({**dict(spec.extra_env), **given}.items())), withheld_env=())
