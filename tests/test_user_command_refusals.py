"""`ddpctl up ... -- CMD`: another launcher is refused, our trainer's options are refused with it, torchrun-style
option names get the option they mean, and `python`/`python3` as the first word is the node's own interpreter.
Each refusal is checked as a user sees it: the real CLI (its main(), called in this process: nothing here is about a
process boundary), one line on stderr, exit != 0, no run directory. The runs that train start ddpctl as a process,
with the PATH they are about."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import ddpctl_in_process
from tests.cli_runner import ddpctl

REPO = Path(__file__).resolve().parent.parent


def refused(tmp_path: Path, *args: str) -> str:
    """Run `up` (for real, not --dry-run) and check it was refused as one line, with nothing written."""
    runs = tmp_path / "runs"
    result = ddpctl_in_process("up", "--runs-dir", str(runs), *args, cwd=tmp_path)
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not runs.exists()
    return lines[0]


LAUNCHERS = {
    "torchrun": ["torchrun", "--nproc-per-node", "2", "train.py"],
    "python -m torch.distributed.run": ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"],
    "python3 -m torch.distributed.launch": ["python3", "-m", "torch.distributed.launch", "train.py"],
    "a venv's python -u -m torch.distributed.run": ["/opt/venv/bin/python", "-u", "-m", "torch.distributed.run",
                                                    "train.py"],
    "accelerate launch": ["accelerate", "launch", "--num_processes", "2", "train.py"],
    "deepspeed": ["deepspeed", "--num_gpus", "2", "train.py"],
    "/usr/local/bin/torchrun": ["/usr/local/bin/torchrun", "train.py"],
}


@pytest.mark.parametrize("command", LAUNCHERS.values(), ids=LAUNCHERS.keys())
def test_another_launcher_is_refused(tmp_path: Path, command: list[str]) -> None:
    line = refused(tmp_path, "--gpus", "2", "--", *command)
    assert "ddpctl is the launcher" in line
    for option in ("--gpus", "--host", "--max-restarts"):
        assert option in line


@pytest.mark.parametrize("command", [
    ["python", "train.py", "--launcher", "torchrun"],  # a word of the script's own arguments
    ["python", "-m", "mypackage.train"],
    ["python3", "-u", "deepspeed_notes.py"],
    ["./torchrun_wrapper.sh"],
], ids=["torchrun as an argument", "python -m a module", "a script named deepspeed_*", "a script named torchrun_*"])
def test_commands_that_start_no_launcher_are_planned(tmp_path: Path, command: list[str]) -> None:
    result = ddpctl_in_process("up", "--host", "u@10.0.0.1", "--dry-run", "--no-probe", "--", *command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("options, named", [
    (["--epochs", "5"], "--epochs"),
    (["--model", "resnet18", "--batch-size", "64"], "--model, --batch-size"),
    (["--lr", "0.1", "--seed", "3", "--save-every", "2"], "--lr, --save-every, --seed"),  # declaration order
    (["--dataset", "mnist", "--data-dir", "data"], "--dataset, --data-dir"),
    (["--synthetic-train-size", "1024"], "--synthetic-train-size"),
    (["--precision", "bf16"], "--precision"),
    (["--threads-per-process", "2"], "--threads-per-process"),
])
def test_trainer_only_options_are_refused_with_a_command(tmp_path: Path, options: list[str], named: str) -> None:
    line = refused(tmp_path, "--gpus", "2", *options, "--", "python", "train.py")
    assert line.startswith(f"error: {named}: ")
    assert "trainer" in line


def test_trainer_only_options_from_a_config_file_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "exp.toml"
    config.write_text('gpus = 2\nepochs = 10\nmodel = "resnet18"\n')
    line = refused(tmp_path, "--config", str(config), "--", "python", "train.py")
    assert line.startswith("error: --model, --epochs: ")


def test_a_config_that_gives_only_defaults_is_no_request(tmp_path: Path) -> None:
    """A file written by --save-config holds every option at its default: that asks for nothing with `-- CMD`."""
    config = tmp_path / "exp.toml"
    config.write_text("gpus = 2\nepochs = 3\n")  # 3: the default
    result = ddpctl_in_process("up", "--config", str(config), "--dry-run", "--", "python", "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("typed, meant", [
    ("--nproc", "--gpus"), ("--nproc-per-node", "--gpus"), ("--nproc_per_node", "--gpus"), ("--num-gpus", "--gpus"),
    ("--world-size", "--gpus"), ("--NPROC=2", "--gpus"), ("--nnodes", "--nodes (Vast.ai machines) or one --host"),
    ("--master-addr", "--rdzv-addr"), ("--master-port", "--rdzv-port"), ("--master_port", "--rdzv-port"),
])
def test_a_torchrun_option_suggests_the_option_it_means(tmp_path: Path, typed: str, meant: str) -> None:
    line = refused(tmp_path, typed, "2", "--", "python", "train.py")
    assert f"uses {meant}" in line, line
    assert "--epochs" not in line  # the nearest spelling of --nproc, which means something else


def test_an_ordinary_typo_keeps_clicks_suggestion(tmp_path: Path) -> None:
    line = refused(tmp_path, "--epohcs", "2")
    assert "--epochs" in line


def test_no_hint_for_an_option_the_command_lacks(tmp_path: Path) -> None:
    """`status` has no --gpus: `--nproc` gets no suggestion there."""
    result = ddpctl_in_process("status", "--nproc", "2", cwd=tmp_path)
    assert result.returncode != 0
    assert "--gpus" not in result.stderr and "No such option: --nproc" in result.stderr


def planned_command(tmp_path: Path, *args: str) -> list[str]:
    result = ddpctl_in_process("up", "--dry-run", "--json", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (node, *_) = json.loads(result.stdout)["nodes"]
    command: list[str] = node["command"]
    return command[command.index("--no-python") + 1:]


@pytest.mark.parametrize("word", ["python", "python3"])
def test_python_is_the_interpreter_that_runs_torchrun(tmp_path: Path, word: str) -> None:
    hosts = ["--host", "u@10.0.0.1", "--no-probe"]
    assert planned_command(tmp_path, *hosts, "--", word, "train.py", "50") == ["python3", "train.py", "50"]
    venv = "/opt/venv/bin/python"
    assert planned_command(tmp_path, *hosts, "--python", venv, "--", word, "train.py") == [venv, "train.py"]
    assert planned_command(tmp_path, "--", word, "train.py")[0] == sys.executable  # locally: ddpctl's own


def test_a_path_the_user_names_is_used_as_given(tmp_path: Path) -> None:
    other = "/usr/bin/python3.11"
    hosts = ["--host", "u@10.0.0.1", "--no-probe"]
    assert planned_command(tmp_path, *hosts, "--", other, "train.py") == [other, "train.py"]
    assert planned_command(tmp_path, *hosts, "--", "python3.11", "train.py") == ["python3.11", "train.py"]


# The tutorial's DDP script (multigpu_torchrun.py, shrunk): a model in DDP, a few steps, a snapshot in its working
# directory from rank 0, and what interpreter ran it.
TUTORIAL_SCRIPT = """
import gc, os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(16, 4) + rank
for epoch in range(int(sys.argv[1])):
    optimizer.zero_grad()
    model(data).pow(2).mean().backward()
    optimizer.step()
    print(f"[rank{rank}] Epoch {epoch}", flush=True)
total = torch.tensor([1.0])
dist.all_reduce(total)
if rank == 0:
    torch.save(model.module.state_dict(), "snapshot.pt")
    with open("ran.txt", "w") as f:
        f.write(f"{int(total.item())} {os.path.realpath(sys.executable)}")
del model
gc.collect()  # torch 2.13, gloo: a DDP model alive as the interpreter ends aborts it (SIGABRT)
dist.destroy_process_group()
"""


def test_python_on_a_path_without_torch_still_trains(tmp_path: Path) -> None:
    """A PATH whose `python` lacks torch: `-- python train.py` runs on ddpctl's interpreter, as torchrun would."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "train.py").write_text(TUTORIAL_SCRIPT)
    path = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
    result = ddpctl("up", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--", "python", "train.py", "3",
                    cwd=tmp_path, env={"PATH": path})
    assert result.returncode == 0, result.stderr
    world, interpreter = (tmp_path / "ran.txt").read_text().split(" ", 1)
    assert world == "2"
    assert interpreter == os.path.realpath(sys.executable)
    assert (tmp_path / "snapshot.pt").stat().st_size > 0
    # The same script named with the PATH's `python` by path is used as given: it is the one without torch.
    (tmp_path / "ran.txt").unlink()
    named = ddpctl("up", "--gpus", "2", "--runs-dir", str(tmp_path / "runs2"), "--", str(fake), "train.py", "1",
                   cwd=tmp_path, env={"PATH": path})
    assert named.returncode != 0
    assert not (tmp_path / "ran.txt").exists()
