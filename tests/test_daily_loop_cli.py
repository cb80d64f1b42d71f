"""What a new user reads first: `--version`, the top-level help, `up --help` on one screen, option errors that name
every place taking the option, and `--save-config` files that plan the same run (`-- CMD` included)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from launcher.cli.app import up
from launcher.cli.brief_help import COMMON_OPTIONS
from launcher.cli.config import config_text, read_config
from launcher.cli.options import LaunchOption, declared_options
from tests.cli_in_process import ddpctl_in_process

UP_OPTIONS = declared_options(up)


def test_version_is_the_installed_packages() -> None:
    shown = ddpctl_in_process("--version")
    assert shown.returncode == 0 and shown.stdout == f"ddpctl {metadata.version('ddpctl')}\n", shown


def test_top_level_help_names_every_place() -> None:
    shown = " ".join(ddpctl_in_process("--help", env={"COLUMNS": "100"}).stdout.split())
    for place in ("this machine", "SSH hosts", "Docker", "Slurm", "Vast.ai"):
        assert place in shown, place


def test_up_help_fits_80_lines_of_100_columns_and_says_how_to_see_the_rest() -> None:
    shown = ddpctl_in_process("up", "--help", env={"COLUMNS": "100"})
    lines = shown.stdout.rstrip().splitlines()
    assert shown.returncode == 0 and len(lines) <= 80 and max(map(len, lines)) <= 100, shown.stdout
    visible = [o for o in UP_OPTIONS.values() if not o.hidden]
    assert f"All {len(visible)}: `ddpctl up --help-all`, or docs/reference/cli.md." in lines[-1]
    for option in visible:  # the common ones shown, the others tucked away (all accepted)
        assert (re.search(rf"{re.escape(option.flag_decl.split('/')[0])}\b", shown.stdout) is not None) == \
            (option.name in COMMON_OPTIONS), option.name


def test_up_help_all_shows_every_option() -> None:
    shown = ddpctl_in_process("up", "--help-all", env={"COLUMNS": "200"})
    assert shown.returncode == 0
    for option in UP_OPTIONS.values():
        flag = option.flag_decl.split("/")[0]
        assert (re.search(rf"{re.escape(flag)}\b", shown.stdout) is not None) != option.hidden, flag


@pytest.mark.parametrize(("args", "said"), [
    (["--nodes", "2"], "error: --nodes is for --provider vast or slurm: add --provider vast to rent machines or "
                       "--provider slurm --host LOGIN_NODE, or drop it"),
    (["--nodes", "2", "--disk", "5"], "--nodes and --disk are for --provider vast (--nodes is also for --provider "
                                      "slurm)"),
    (["--disk", "5"], "--disk is for --provider vast only"),
    (["--rdzv-port", "29555"], "it is for runs on --host or --provider vast; drop it"),
    (["--rdzv-port", "29555", "--no-probe"], "they are for runs on --host or --provider vast; drop them"),
    (["--provider", "slurm", "--host", "login", "--rdzv-port", "29555"],
     "--rdzv-port has no effect on a Slurm job (the batch script decides): it is for runs on --host or "
     "--provider vast; drop it"),
    (["--provider", "slurm", "--host", "login", "--disk", "5", "--max-price", "1"],
     "--max-price and --disk have no effect on a Slurm job (the batch script decides): they are for --provider "
     "vast; drop them"),
])
def test_an_option_of_another_place_is_refused_naming_every_place_that_takes_it(args: list[str], said: str) -> None:
    refused = ddpctl_in_process("up", "--dry-run", *args)
    assert refused.returncode == 1 and said in refused.stderr and len(refused.stderr.splitlines()) == 1, refused


def _other_value(option: LaunchOption) -> Any:
    """A value of the option's kind that is not its default."""
    kind = option.kind
    if kind == "choice":
        return next(c for c in option.choices if c != option.default)
    return {"int": 7, "float": 2.5, "bool": not option.default, "str": "x-1", "path": Path("/some/where"),
            "repeated": ["NAME=1", "b"] if option.name != "env" else None}[kind]


def test_every_option_of_up_comes_back_from_a_saved_config(tmp_path: Path) -> None:
    values = {name: _other_value(o) for name, o in UP_OPTIONS.items() if o.in_config}
    values = {name: value for name, value in values.items() if value is not None}  # --env: names only, below
    values["command"] = ["python", "train.py", "--lr", "0.1"]
    path = tmp_path / "saved.toml"
    path.write_text(config_text(values, UP_OPTIONS))
    assert read_config(path, UP_OPTIONS) == values


def test_a_saved_configs_env_keeps_the_names_only(tmp_path: Path) -> None:
    path = tmp_path / "saved.toml"
    path.write_text(config_text({"env": ["WANDB_API_KEY=s3cr3t-value"]}, UP_OPTIONS))
    assert "s3cr3t-value" not in path.read_text() and "WANDB_API_KEY" in path.read_text()
    assert read_config(path, UP_OPTIONS) == {"env": ["WANDB_API_KEY"]}  # --env NAME: the value from the shell


def test_a_saved_configs_env_takes_its_values_from_the_shell(tmp_path: Path) -> None:
    path = tmp_path / "saved.toml"
    path.write_text(config_text({"env": ["WANDB_API_KEY=s3cr3t-value"]}, UP_OPTIONS))
    argv = ("up", "--dry-run", "--gpus", "1", "--config", str(path))
    unset = ddpctl_in_process(*argv, cwd=tmp_path, env={"WANDB_API_KEY": None})
    assert unset.returncode == 1
    assert "--env WANDB_API_KEY: WANDB_API_KEY is not set in this shell" in unset.stderr
    exported = ddpctl_in_process(*argv, cwd=tmp_path, env={"WANDB_API_KEY": "s3cr3t-value"})
    assert exported.returncode == 0, exported.stderr
    assert "WANDB_API_KEY=***" in exported.stdout and "s3cr3t-value" not in exported.stdout + exported.stderr


RUN_ID = re.compile(r"[A-Za-z0-9_.]+-\d{8}-\d{6}-[0-9a-f]{4}")

# Every option of `up` a config keeps, in one of these dry runs (Vast.ai's need its API: read back above).
PLANNED = [
    ["--provider", "slurm", "--host", "me@login1", "--nodes", "2", "--gpus", "2", "--partition", "gpu", "--time",
     "10", "--account", "acct", "--qos", "q1", "--constraint", "a100", "--workdir", "/scratch/me",
     "--sbatch-option=--mem=1G", "--prelude", "module load cuda", "--max-requeues", "3", "--requeue",
     "-i", "/keys/id", "--connect-timeout", "5", "--accept-new-host-keys", "--python", "/opt/py/bin/python",
     "--launcher", "torchrun", "--detach", "--", "python", "train.py", "--epochs", "9"],
    ["--provider", "slurm", "--host", "login1", "--model", "mnist-cnn-small", "--dataset", "synthetic", "--data-dir",
     "/data", "--epochs", "5", "--batch-size", "8", "--lr", "0.1", "--save-every", "2", "--seed", "3",
     "--max-restarts", "1", "--name", "nm", "--synthetic-train-size", "100", "--synthetic-test-size", "10",
     "--strategy", "local-sgd", "--gpus", "2", "--threads-per-process", "1", "--precision", "bf16",
     "--average-every", "5", "--trainer-arg=--no-cuda-graphs"],
    ["--provider", "slurm", "--host", "login1", "--strategy", "dp", "--devices", "cpu,cpu"],
    ["--host", "a@h1", "--host", "h2:2222", "--runtime", "docker", "--image", "img:1", "--registry",
     "reg.example/img:1", "--rdzv-addr", "10.0.0.1", "--rdzv-port", "29555", "--allow-public-rendezvous",
     "--stall-timeout", "60", "--outputs", "*.csv", "--gpus", "2", "--check-bandwidth", "--", "python", "train.py"],
]


@pytest.mark.parametrize("args", PLANNED)
def test_a_saved_config_plans_the_same_run_as_the_command_line(tmp_path: Path, args: list[str]) -> None:
    project, saved = tmp_path / "project", tmp_path / "saved.toml"  # the file outside the code that is shipped
    project.mkdir()
    (project / "train.py").write_text("import torch.distributed\n")
    given = ddpctl_in_process("up", "--dry-run", "--no-probe", "--save-config", str(saved), *args, cwd=project)
    assert given.returncode == 0, given.stderr
    again = ddpctl_in_process("up", "--dry-run", "--no-probe", "--config", str(saved), cwd=project)
    assert again.returncode == 0, again.stderr
    assert RUN_ID.sub("RUN", again.stdout) == RUN_ID.sub("RUN", given.stdout)
    if "--" in args:
        assert "train.py" in again.stdout and "-m trainer" not in again.stdout


def test_the_dry_runs_and_vast_cover_every_option_a_config_keeps() -> None:
    from launcher.cli.options import VAST_OPTIONS

    named = {word[2:].split("=")[0].replace("-", "_") for args in PLANNED
             for word in (args[:args.index("--")] if "--" in args else args) if word.startswith("--")}
    named |= {"identity_file"} | {o.name for o in VAST_OPTIONS} | {"env"}  # -i; Vast.ai and --env read back above
    kept = {name for name, option in UP_OPTIONS.items() if option.in_config}
    assert kept - named == set(), "add the new option to a dry run of PLANNED (or to the read-back tests)"


@pytest.mark.parametrize(("event", "line"), [
    ({"event": "started", "node": 0, "pid": 5, "launcher": "torchrun"}, "node 0: torchrun started (pid 5)"),
    ({"event": "started", "node": 1, "pid": 6, "launcher": "mpirun"}, "node 1: mpirun started (pid 6)"),
    ({"event": "exited", "node": 0, "exit_code": 0, "launcher": "spawn"}, "node 0: the command exited with status 0"),
    ({"event": "world_measured", "failed": False, "measured": True, "processes": 2}, None),
    ({"event": "job_state", "state": "RUNNING", "reason": "None", "nodes": "n1"}, None),
    ({"event": "requeue_checked", "reason": "None", "state": "RUNNING"}, "requeue checked (state RUNNING)"),
    ({"event": "run_created", "run": "r-1", "path": "/runs/r-1"}, "run r-1 (its directory: /runs/r-1)"),
])
def test_a_plain_log_says_what_started_and_keeps_internal_records_and_reprs_out(event: dict[str, Any],
                                                                               line: str | None) -> None:
    from launcher.execute.following.plain_progress import describe_event

    assert describe_event(event) == line
