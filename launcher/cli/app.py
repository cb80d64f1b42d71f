"""The `ddpctl` command line: thin commands over the core; domain errors become one line and exit 1."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import typer

from launcher.errors import DdpctlError, Interrupted, SpecError
from launcher.results.progress import console, summary_table
from launcher.spec.hosts import HostSpec, parse_hosts
from launcher.spec.run_spec import DEFAULT_RDZV_PORT, RUNTIMES, RunSpec, check_port, new_run_id
from launcher.spec.validate import check_runs_dir, check_seconds

app = typer.Typer(
    name="ddpctl",
    help="Run PyTorch DDP experiments locally, on SSH hosts or on Vast.ai, and bring back what happened.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules that add their commands with `register(app)`; each owns one family of commands.
COMMAND_MODULES = (
    "launcher.cli.run_commands",
    "launcher.runtimes.image",
    "launcher.cli.vast",
    "launcher.cli.report_sweep",
)



@app.callback()
def _root() -> None:
    """Run PyTorch DDP experiments locally, on SSH hosts or on Vast.ai, and bring back what happened."""


# `up --help` groups its ~40 options into these panels.
RUN, HOSTS, OUTPUT = "Run", "Hosts / SSH", "Output"
DOCKER, VAST = "Docker (--runtime docker)", "Vast.ai (--provider vast)"
RUNS_DIR = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live.", rich_help_panel=OUTPUT)


def spec_from_options(*, gpus: int, nnodes: int, model: str, dataset: str, data_dir: str | None,
                      epochs: int, batch_size: int, lr: float, save_every: int, seed: int, max_restarts: int,
                      name: str | None, command: list[str], python: str, rdzv_port: int,
                      synthetic_train_size: int | None, synthetic_test_size: int | None,
                      trainer_arg: list[str], env: list[str]) -> RunSpec:
    """Build the validated RunSpec from `up`'s options."""
    trainer_args: list[str] = []
    if synthetic_train_size is not None:
        trainer_args += ["--synthetic-train-size", str(synthetic_train_size)]
    if synthetic_test_size is not None:
        trainer_args += ["--synthetic-test-size", str(synthetic_test_size)]
    trainer_args += trainer_arg
    extra_env = []
    for item in env:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"--env {item!r} is not of the form NAME=VALUE")
        extra_env.append((key, value))
    return RunSpec(
        run_id=new_run_id(name, model, dataset),
        model=model, dataset=dataset, data_dir=data_dir, epochs=epochs, batch_size=batch_size, lr=lr,
        save_every=save_every, seed=seed, max_restarts=max_restarts, nproc_per_node=gpus, nnodes=nnodes,
        user_command=tuple(command), trainer_args=tuple(trainer_args), python=python, rdzv_port=rdzv_port,
        extra_env=tuple(sorted(extra_env)),
    )  # fmt: skip


@app.command(context_settings={"allow_interspersed_args": False})
def up(
    ctx: typer.Context,
    command: list[str] | None = typer.Argument(None, help="After `--`: your own command to run under torchrun."),
    gpus: int | None = typer.Option(None, "--gpus", help="Processes per node (default: the node's GPUs, or 2 on CPU).",
        rich_help_panel=RUN),
    host: list[str] = typer.Option([], "--host", help=r"\[user@]host[:port] or ssh alias; repeat, node 0 first.",
        rich_help_panel=HOSTS),
    model: str = typer.Option("mnist-cnn", help="mnist-cnn or resnet18.", rich_help_panel=RUN),
    dataset: str = typer.Option("synthetic", help="synthetic, mnist or cifar10.", rich_help_panel=RUN),
    data_dir: str | None = typer.Option(None, help="Folder holding the data set files.", rich_help_panel=RUN),
    epochs: int = typer.Option(3, help="Epochs to train.", rich_help_panel=RUN),
    batch_size: int = typer.Option(32, help="Batch size per process.", rich_help_panel=RUN),
    lr: float = typer.Option(0.01, help="SGD learning rate.", rich_help_panel=RUN),
    save_every: int = typer.Option(1, help="Snapshot every N epochs.", rich_help_panel=RUN),
    seed: int = typer.Option(0, help="Seed for data order, initial weights and synthetic data.", rich_help_panel=RUN),
    max_restarts: int = typer.Option(0, help="torchrun restarts after a worker fails (resume from snapshots).",
        rich_help_panel=RUN),
    name: str | None = typer.Option(None, help="Run name (letters, digits, . _ -); an id is derived from it.",
        rich_help_panel=RUN),
    runs_dir: Path = RUNS_DIR,
    json_out: bool = typer.Option(False, "--json", help="Print the final summary as JSON on stdout.",
        rich_help_panel=OUTPUT),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what each node would run (hosts are probed, "
        "read-only); change nothing.", rich_help_panel=OUTPUT),
    no_probe: bool = typer.Option(False, "--no-probe", help="With --dry-run: connect to no host; what only the "
        "hosts can tell is shown as unknown.", rich_help_panel=OUTPUT),
    runtime: str = typer.Option("native", help="native, docker or auto (on SSH hosts).", rich_help_panel=RUN),
    image: str | None = typer.Option(None, help="The image to run: with --runtime docker (or auto), a local image "
                                     "shipped to the hosts (default ddpctl:latest); with --provider vast, the "
                                     "registry reference each machine starts from (required; `ddpctl image push`).",
        rich_help_panel=DOCKER),
    registry: str | None = typer.Option(None, help="With --runtime docker (or auto): hosts pull this image "
                                        "reference instead of receiving the local --image.", rich_help_panel=DOCKER),
    python: str | None = typer.Option(None, help="The Python that runs torchrun, on the hosts (default python3) "
                                                  "or here (default: the one running ddpctl), e.g. a venv's "
                                                  "bin/python.", rich_help_panel=RUN),
    identity_file: Path | None = typer.Option(None, "--identity-file", "-i", help="SSH private key.",
        rich_help_panel=HOSTS),
    accept_new_host_keys: bool = typer.Option(False, help="Trust and record unknown host keys (never changed ones).",
        rich_help_panel=HOSTS),
    connect_timeout: float = typer.Option(10.0, help="Seconds to wait for each SSH connection.", rich_help_panel=HOSTS),
    rdzv_addr: str | None = typer.Option(None, help="Node 0's address as the other nodes reach it.",
        rich_help_panel=HOSTS),
    rdzv_port: int | None = typer.Option(None, help="Rendezvous port on node 0 \\[default: 29400, or a free one].",
        rich_help_panel=HOSTS),
    detach: bool = typer.Option(False, help="Start the run on the hosts and return; follow with status/logs.",
        rich_help_panel=HOSTS),
    allow_public_rendezvous: bool = typer.Option(
        False, help="Allow node 0's rendezvous on a public address (only behind a firewall: it is unauthenticated).",
        rich_help_panel=HOSTS),
    stall_timeout: float = typer.Option(
        0.0, "--stall-timeout", help="Hosts: stop every node and pull when no training step was seen for this many "
        "seconds (a hung collective); 0: only note it after 300 s.", rich_help_panel=HOSTS),
    synthetic_train_size: int | None = typer.Option(None, help="Synthetic data set: training samples.",
        rich_help_panel=RUN),
    synthetic_test_size: int | None = typer.Option(None, help="Synthetic data set: test samples.", rich_help_panel=RUN),
    trainer_arg: list[str] = typer.Option([], "--trainer-arg", help="Extra option passed to the trainer.", hidden=True,
        rich_help_panel=RUN),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE set for torchrun on every node; repeat.",
        rich_help_panel=RUN),
    provider: str | None = typer.Option(None, help="local, ssh or vast \\[default: ssh with --host, else local].",
        rich_help_panel=RUN),
    nodes: int = typer.Option(1, "--nodes", help="Vast.ai: machines to rent (one torchrun node each).",
        rich_help_panel=VAST),
    gpu_name: str | None = typer.Option(None, "--gpu-name", help='Vast.ai: GPU model, e.g. "RTX 3080".',
        rich_help_panel=VAST),
    max_price: float | None = typer.Option(None, "--max-price", help="Vast.ai: most $/hour per machine.",
        rich_help_panel=VAST),
    min_reliability: float = typer.Option(0.95, "--min-reliability", help="Vast.ai: least reliability, 0..1.",
        rich_help_panel=VAST),
    disk: float = typer.Option(32.0, "--disk", help="Vast.ai: disk per machine, GB.", rich_help_panel=VAST),
    down: bool = typer.Option(False, "--down", help="Vast.ai: destroy the machines once results are verified.",
        rich_help_panel=VAST),
    max_cost: float | None = typer.Option(None, "--max-cost", help="Vast.ai: stop, pull and destroy before the "
                                          "run's spend passes this many USD.", rich_help_panel=VAST),
    max_cost_reserve: float = typer.Option(120.0, "--max-cost-reserve", hidden=True,
                                           help="Seconds of spend --max-cost keeps for the final pull and teardown.",
        rich_help_panel=VAST),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout", help="Vast.ai: seconds for a machine to start.",
        rich_help_panel=VAST),
) -> None:
    """Launch a DDP training run and follow it to the end."""
    from launcher.execute.local import default_local_procs, default_python
    from launcher.execute.request import UpOptions
    from launcher.execute.up import run_up

    if runtime not in RUNTIMES:
        raise SpecError(f"--runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    hosts = parse_hosts(host)
    # Values first, then whether the options fit where the run goes.
    if stall_timeout < 0 or not math.isfinite(stall_timeout):
        raise SpecError(f"--stall-timeout {stall_timeout:g}: give seconds >= 0 (0 turns it off)")
    check_seconds(connect_timeout, "--connect-timeout")
    if rdzv_port is not None:
        check_port(rdzv_port)
    from launcher.runtimes.image import check_reference

    if image is not None:
        check_reference(image, "--image")
    if registry is not None:
        check_reference(registry, "--registry")
    provider = provider or ("ssh" if hosts else "local")
    _check_options_fit(provider, hosts, runtime, _given(ctx))
    vast = _vast_request(provider, nodes=nodes, gpu_name=gpu_name, max_price=max_price,
                         min_reliability=min_reliability, disk=disk, down=down, max_cost=max_cost,
                         max_cost_reserve_s=max_cost_reserve, ready_timeout=ready_timeout)
    if no_probe and not dry_run:
        raise SpecError("--no-probe only changes --dry-run (a run always probes its hosts): add --dry-run or drop it")
    if stall_timeout and detach:
        raise SpecError("--stall-timeout acts while `up` follows the run: drop --detach, or stop a stalled run "
                        "with `ddpctl down`")
    if command and provider != "local":
        from launcher.transport.sync import check_ship_dir

        check_ship_dir(Path.cwd())
    if runtime == "docker" and not hosts:
        raise SpecError("--runtime docker needs --host (locally, use `docker compose up`)")
    check_runs_dir(runs_dir)
    spec = spec_from_options(
        gpus=gpus if gpus is not None else (1 if hosts or vast else default_local_procs()),
        nnodes=vast.nodes if vast else max(1, len(hosts)), model=model, dataset=dataset, data_dir=data_dir,
        epochs=epochs, batch_size=batch_size, lr=lr, save_every=save_every, seed=seed, max_restarts=max_restarts,
        name=name,
        command=command or [], python=python if python is not None else default_python(provider),
        rdzv_port=DEFAULT_RDZV_PORT if rdzv_port is None else rdzv_port,
        synthetic_train_size=synthetic_train_size, synthetic_test_size=synthetic_test_size, trainer_arg=trainer_arg,
        env=env,
    )  # fmt: skip
    options = UpOptions(
        runs_dir=runs_dir, hosts=hosts, runtime=runtime, show_progress=not json_out, dry_run=dry_run,
        detach=detach, allow_public_rendezvous=allow_public_rendezvous,
        identity_file=identity_file, accept_new_host_keys=accept_new_host_keys,
        connect_timeout=connect_timeout, rdzv_addr=rdzv_addr, image=image,
        registry=registry, auto_gpus=gpus is None and (bool(hosts) or vast is not None),
        auto_rdzv_port=rdzv_port is None, provider=provider, vast=vast, stall_timeout=stall_timeout,
        probe=not no_probe,
    )  # fmt: skip
    result = run_up(spec, options)
    finish_up(result, json_out)


# `up` options that only --provider vast reads, and those a run on this machine has no use for.
VAST_ONLY = ("nodes", "gpu_name", "max_price", "min_reliability", "disk", "down", "max_cost", "max_cost_reserve",
             "ready_timeout")
NOT_LOCAL = ("detach", "stall_timeout", "identity_file", "accept_new_host_keys", "connect_timeout", "rdzv_addr",
             "rdzv_port", "allow_public_rendezvous", "no_probe")


def _given(ctx: typer.Context) -> list[str]:
    """The options the user typed (not defaults), as their flags (`--max-price`), in the command's order."""
    flags = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if param.param_type_name != "option" or source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        if ctx.params.get(param.name or "") is False:  # --no-detach and the like ask for what happens anyway
            continue
        flags.append(max(param.opts, key=len))
    return flags


def _flags(names: tuple[str, ...]) -> set[str]:
    return {"--" + name.replace("_", "-") for name in names}


def _check_options_fit(provider: str, hosts: tuple[HostSpec, ...], runtime: str, given: list[str]) -> None:
    """Refuse options the chosen provider and runtime would silently ignore, and providers that lack hosts."""
    if provider not in ("local", "ssh", "vast"):
        raise SpecError(f"--provider {provider!r}: choose local, ssh or vast")
    if provider == "ssh" and not hosts:
        raise SpecError("--provider ssh needs --host (one per node)")
    if provider != "ssh" and hosts:
        raise SpecError(f"--host is for --provider ssh, not {provider}")
    vast_only = [flag for flag in given if flag in _flags(VAST_ONLY)]
    if provider != "vast" and vast_only:
        raise SpecError(f"{_listed(vast_only, 'is', 'are')} for --provider vast only: add --provider vast to rent "
                        f"machines, or drop {_it(vast_only)}")
    if provider == "vast":
        if runtime != "native":
            raise SpecError("on Vast.ai our image is the machine: the run is native there (drop --runtime)")
        if "--registry" in given:
            raise SpecError("with --provider vast, --image is the registry reference each machine starts from: "
                            "drop --registry")
        return
    image_flags = [flag for flag in given if flag in ("--image", "--registry")]
    if provider == "local":
        not_local = [flag for flag in given if flag in _flags(NOT_LOCAL)] + image_flags
        if not_local:
            foreground = " (a local run stays in the foreground until it ends or Ctrl-C)" if "--detach" in given else ""
            raise SpecError(f"{_listed(not_local, 'has', 'have')} no effect on a run on this machine{foreground}: "
                            f"{_listed(['it'] if len(not_local) == 1 else ['they'], 'is', 'are')} for runs on "
                            f"--host or --provider vast; drop {_it(not_local)}")
    elif runtime == "native" and image_flags:
        raise SpecError(f"{_listed(image_flags, 'names', 'name')} the image of --runtime docker: add --runtime docker "
                        f"(or auto), or drop {_it(image_flags)} for a native run")


def _listed(flags: list[str], singular: str, plural: str) -> str:
    """`--a is`, `--a and --b are`, `--a, --b and --c are`."""
    names = ", ".join(flags[:-1]) + (" and " if len(flags) > 1 else "") + flags[-1]
    return f"{names} {singular if len(flags) == 1 else plural}"


def _it(flags: list[str]) -> str:
    return "it" if len(flags) == 1 else "them"


def _vast_request(provider: str, **vast_options: Any) -> Any:
    """The VastRequest for --provider vast (None for the others)."""
    if provider != "vast":
        return None
    for name, value in vast_options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"--{name.replace('_', '-').removesuffix('-s')} {value}: give a finite number")
    from launcher.providers.vast.request import VastRequest

    return VastRequest(**vast_options)


def finish_up(result: Any, json_out: bool) -> None:
    """Print the plan (dry run), or the summary table / JSON; exit with the run's status."""
    if result.run_dir is None and result.plan is not None:
        print(json.dumps(result.plan.to_json(), indent=2) if json_out else result.plan.describe())
        if result.error:  # the plan above has unknowns: the hosts could not be probed
            raise DdpctlError(f"the plan above was made without probing the hosts (it names what that leaves unknown): "
                              f"{result.error}")
        return
    if json_out:
        print(json.dumps({"run_dir": str(result.run_dir), "exit_code": result.exit_code,
                          "summary": result.summary}, indent=2, sort_keys=True))
    elif result.summary:
        console.print(summary_table(result.summary, f"run {result.run_dir.name}"))
        console.print(f"results in {result.run_dir}")
    if result.exit_code == 130:
        raise Interrupted(f"stopped by Ctrl-C; snapshots and logs are in {result.run_dir}")
    if result.exit_code != 0:
        raise DdpctlError(_failure_message(result))


def _failure_message(result: Any) -> str:
    from launcher.execute.failure_log import failure_tail, without_control_chars

    tail = without_control_chars(failure_tail(str(result.run_dir), 15)) if result.run_dir else ""
    return f"training failed (exit {result.exit_code}); logs in {result.run_dir}" + (f"\n{tail}" if tail else "")


def _register_commands() -> None:
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning our errors and usage errors into one line on stderr."""
    _register_commands()
    try:
        status = app(args=argv, standalone_mode=False)  # click returns an Exit's code instead of raising it
        if isinstance(status, int) and status:
            sys.exit(status)
    except DdpctlError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except _CLICK_ERROR as e:  # a click.ClickException: format_message() and exit_code
        if e.__class__.__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        print(f"error: {e.format_message()} (see --help)", file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(e.exit_code)  # type: ignore[attr-defined]
    except typer.Exit as e:
        sys.exit(e.exit_code)


# typer >= 0.20 vendors its own click; its usage errors share only the class name with click's.
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
