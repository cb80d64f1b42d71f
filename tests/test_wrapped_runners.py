"""The programs that run a command in another environment or as another user (`uv run`, `poetry run`, `pipenv run`,
`conda run`, `sudo`, `srun`) are wrappers like `env`: a launcher inside them is refused as the bare one is, and a
script inside them is planned (`-- uv run train.py` is an ordinary command)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.spec.user_command import check_user_command, found_launcher
from tests.cli_in_process import ddpctl_in_process

WRAPPED = {
    "uv run torchrun --nproc-per-node 2 x.py": ("torchrun", "uv run torchrun"),
    "uv run --with numpy --python 3.11 torchrun x.py": ("torchrun", "uv run torchrun"),
    "uv --directory /work -q run --frozen -- torchrun x.py": ("torchrun", "uv run torchrun"),
    "uv run -p 3.12 python -m torch.distributed.run x.py": ("python -m torch.distributed.run",
                                                            "uv run python -m torch.distributed.run"),
    # uv run's own -m runs a module: the launcher's module, here.
    "uv run -m torch.distributed.run x.py": ("python -m torch.distributed.run",
                                             "uv run python -m torch.distributed.run"),
    "uv run --module=accelerate.commands.launch x.py": ("python -m accelerate.commands.launch",
                                                        "uv run python -m accelerate.commands.launch"),
    "poetry run torchrun x.py": ("torchrun", "poetry run torchrun"),
    "poetry -C /work run accelerate launch x.py": ("accelerate launch", "poetry run accelerate launch"),
    "poetry run python -m torch.distributed.run x.py": ("python -m torch.distributed.run",
                                                        "poetry run python -m torch.distributed.run"),
    "pipenv run deepspeed x.py": ("deepspeed", "pipenv run deepspeed"),
    "pipenv run mpiexec -n 2 python x.py": ("mpiexec", "pipenv run mpiexec"),
    "conda run -n torch torchrun x.py": ("torchrun", "conda run torchrun"),
    "conda run --no-capture-output --prefix /opt/env python3 -m torch.distributed.launch x.py": (
        "python3 -m torch.distributed.launch", "conda run python3 -m torch.distributed.launch"),
    "micromamba run -n ml accelerate launch x.py": ("accelerate launch", "micromamba run accelerate launch"),
    "sudo torchrun x.py": ("torchrun", "sudo torchrun"),
    "sudo -E torchrun x.py": ("torchrun", "sudo torchrun"),
    "sudo -E -u bob OMP_NUM_THREADS=4 torchrun x.py": ("torchrun", "sudo torchrun"),
    "sudo --preserve-env=PATH --user=bob mpirun -np 2 python x.py": ("mpirun", "sudo mpirun"),
    "srun torchrun x.py": ("torchrun", "srun torchrun"),
    "srun -N 2 --ntasks-per-node 1 -l --export=ALL torchrun x.py": ("torchrun", "srun torchrun"),
    "srun -N2 -c 8 --kill-on-bad-exit python -m torch.distributed.run x.py": (
        "python -m torch.distributed.run", "srun python -m torch.distributed.run"),
    "srun --mpi=pmix -n 4 mpiexec python x.py": ("mpiexec", "srun mpiexec"),
    # wrapped twice or more: each looked through in turn
    "sudo -E uv run torchrun x.py": ("torchrun", "sudo uv run torchrun"),
    "srun --nodes 2 conda run -n torch env nice torchrun x.py": ("torchrun", "srun conda run env nice torchrun"),
    "bash -c 'poetry run torchrun x.py'": ("torchrun", "bash -c 'poetry run torchrun"),
    "uv run sh -c 'sudo -E accelerate launch x.py'": ("accelerate launch", "uv run sh -c 'sudo accelerate launch"),
}


@pytest.mark.parametrize("command", WRAPPED)
def test_a_launcher_inside_a_runner_is_found_with_how_it_is_reached(command: str) -> None:
    assert found_launcher(tuple(shlex.split(command))) == WRAPPED[command]


PLAIN = [
    "uv run train.py", "uv run python train.py --epochs 2", "uv run --with numpy -- python train.py torchrun",
    "uv run -p 3.11 python train.py", "uv run -m mypkg.train", "poetry run python train.py",
    "poetry -C /work run python -m mypkg.train", "pipenv run python train.py", "conda run -n torch python train.py",
    "conda run -p /opt/env --cwd /work python3 train.py", "sudo -E python train.py", "sudo -u bob ./train.sh",
    "srun -N 1 python train.py", "srun --export=ALL,TORCHRUN=1 python train.py",
    # other subcommands of a runner run nothing of ours: what follows them is not a command
    "uv pip install torchrun", "poetry add accelerate", "conda install torchrun", "pipenv install deepspeed",
    # an option's value that only names a launcher
    "uv run --with torchrun python train.py", "conda run -n torchrun python train.py",
    "sudo -u torchrun python train.py", "srun -J torchrun python train.py", "srun --job-name torchrun python x.py",
    "uv", "uv run", "sudo", "srun", "conda run -n",
]


@pytest.mark.parametrize("command", PLAIN)
def test_a_script_inside_a_runner_starts_no_launcher(command: str) -> None:
    assert found_launcher(tuple(shlex.split(command))) is None
    check_user_command(tuple(shlex.split(command)), [])


def test_a_runner_wrapping_mpi_gets_the_mpi_advice() -> None:
    with pytest.raises(SpecError, match=r"^`-- sudo mpirun \.\.\.` would start a whole MPI job.*--launcher mpirun"):
        check_user_command(("sudo", "-E", "mpirun", "-np", "2", "python", "x.py"), [])


@pytest.mark.parametrize("command", ["uv run torchrun x.py", "poetry run python -m torch.distributed.run x.py",
                                     "sudo -E torchrun x.py", "srun -N 2 torchrun x.py",
                                     "conda run -n torch accelerate launch x.py", "pipenv run deepspeed x.py"])
def test_up_refuses_a_launcher_inside_a_runner_in_one_line_writing_nothing(tmp_path: Path, command: str) -> None:
    runs = tmp_path / "runs"
    result = ddpctl_in_process("up", "--runs-dir", str(runs), "--", *shlex.split(command), cwd=tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: `-- {command.split()[0]} ") and "second launcher" in line, line
    assert not runs.exists()


@pytest.mark.parametrize("command", ["uv run train.py", "poetry run python train.py", "sudo -E python train.py"])
def test_up_plans_a_script_inside_a_runner(tmp_path: Path, command: str) -> None:
    """What the nodes would run, printed by a dry run that asks no host: the user's command as given."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    result = ddpctl_in_process("up", "--dry-run", "--no-probe", "--host", "10.9.9.1", "--host", "10.9.9.2",
                               "--runs-dir", str(tmp_path / "runs"), "--", *shlex.split(command), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    node_lines = [line for line in result.stdout.splitlines() if "ddpctl_torchrun.py" in line]
    assert len(node_lines) == 2 and all(line.endswith(f"--no-python {command}") for line in node_lines), node_lines
