"""A second launcher wrapped once (or more) inside `-- CMD` is refused as the bare one is: programs that only run
another (`env`, `nice`, `nohup`, `time`, `stdbuf`, `taskset`, `ionice`, `timeout`, ...) with their options, a
shell's `-c` string, python's own options before `-m`; and what only looks like a launcher is still planned."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.spec.command_wrappers import inner_commands
from launcher.spec.user_command import check_user_command, found_launcher
from tests.cli_in_process import ddpctl_in_process

WRAPPED = {
    "env torchrun x.py": ("torchrun", "env torchrun"),
    "/usr/bin/env -i PATH=/usr/bin HOME=/root torchrun x.py": ("torchrun", "env torchrun"),
    "env -u CUDA_VISIBLE_DEVICES -C /tmp torchrun x.py": ("torchrun", "env torchrun"),
    "env -S 'torchrun --nproc-per-node 2' x.py": ("torchrun", "env torchrun"),
    "nice torchrun x.py": ("torchrun", "nice torchrun"),
    "nice -n 10 torchrun x.py": ("torchrun", "nice torchrun"),
    "nice -5 torchrun x.py": ("torchrun", "nice torchrun"),
    "nice --adjustment=3 torchrun x.py": ("torchrun", "nice torchrun"),
    "nohup torchrun x.py": ("torchrun", "nohup torchrun"),
    "time -p -o t.txt torchrun x.py": ("torchrun", "time torchrun"),
    "stdbuf -oL -e 0 torchrun x.py": ("torchrun", "stdbuf torchrun"),
    "taskset -c 0-3 torchrun x.py": ("torchrun", "taskset torchrun"),
    "taskset 0x3 torchrun x.py": ("torchrun", "taskset torchrun"),
    "ionice -c 2 -n 7 nice -n 1 torchrun x.py": ("torchrun", "ionice nice torchrun"),
    "timeout --signal=INT 10m torchrun x.py": ("torchrun", "timeout torchrun"),
    "numactl --cpunodebind=0 --membind 0 torchrun x.py": ("torchrun", "numactl torchrun"),
    "sh -c 'torchrun --nproc-per-node 2 x.py'": ("torchrun", "sh -c 'torchrun"),
    "bash -ec 'cd /work && OMP_NUM_THREADS=1 exec torchrun x.py'": ("torchrun", "bash -c 'exec torchrun"),
    "bash -o pipefail -c 'torchrun x.py | tee log'": ("torchrun", "bash -c 'torchrun"),
    "sh -c 'env nice torchrun x.py'": ("torchrun", "sh -c 'env nice torchrun"),
    "python -X dev -m torch.distributed.run x.py": ("python -m torch.distributed.run",) * 2,
    "python3 -W ignore -u -m torch.distributed.launch x.py": ("python3 -m torch.distributed.launch",) * 2,
    "python -um torch.distributed.run x.py": ("python -m torch.distributed.run",) * 2,
    "python -Xfrozen_modules=off -mtorch.distributed.run x.py": ("python -m torch.distributed.run",) * 2,
    "env python -m accelerate.commands.launch x.py": ("python -m accelerate.commands.launch",
                                                       "env python -m accelerate.commands.launch"),
    "env accelerate launch x.py": ("accelerate launch", "env accelerate launch"),
    "nice deepspeed x.py": ("deepspeed", "nice deepspeed"),
    "env mpiexec -n 2 python x.py": ("mpiexec", "env mpiexec"),
    "sh -c 'mpirun -np 2 python x.py'": ("mpirun", "sh -c 'mpirun"),
}


@pytest.mark.parametrize("command", WRAPPED)
def test_a_wrapped_launcher_is_found_with_how_it_is_reached(command: str) -> None:
    assert found_launcher(tuple(shlex.split(command))) == WRAPPED[command]


PLAIN = [
    "python train.py torchrun", "env python train.py", "env -u torchrun python x.py", "taskset 0x3 python x.py",
    "sh -c 'python train.py --launcher torchrun'", "sh -c 'echo torchrun'", "sh train.sh torchrun",
    "nice ./torchrun_wrapper.sh", "python -X dev train.py", "python -W error::DeprecationWarning x.py",
    "python -c 'import torch.distributed.run'", "sh -c \"'torchrun unclosed\"", "env", "nice", "bash -c",
    "time -f '%e torchrun' python x.py",
]


@pytest.mark.parametrize("command", PLAIN)
def test_a_command_that_only_mentions_a_launcher_starts_none(command: str) -> None:
    assert found_launcher(tuple(shlex.split(command))) is None


def test_wrappers_inside_wrappers_end() -> None:
    """A command of wrappers alone (no program at the end) or nested past any real depth ends, finding nothing."""
    assert found_launcher(tuple(["env"] * 50 + ["python", "x.py"])) is None
    assert inner_commands(()) == [("", ())]


@pytest.mark.parametrize(("command", "shown"), [
    ("env torchrun x.py", "`-- env torchrun ...`"),
    ("sh -c 'torchrun x.py'", "`-- sh -c 'torchrun ...'`"),
    ("python -X dev -m torch.distributed.run x.py", "`-- python -m torch.distributed.run ...`"),
])
def test_the_refusal_is_the_existing_line_naming_the_wrapped_launcher(command: str, shown: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_user_command(tuple(shlex.split(command)), [])
    assert str(refused.value).startswith(f"{shown} would start a second launcher inside ddpctl's torchrun")
    assert "ddpctl is the launcher" in str(refused.value)


def test_a_wrapped_mpi_launcher_gets_the_mpi_advice() -> None:
    with pytest.raises(SpecError, match=r"^`-- env mpiexec \.\.\.` would start a whole MPI job.*--launcher mpirun"):
        check_user_command(("env", "mpiexec", "-n", "2", "python", "x.py"), [])


@pytest.mark.parametrize("command", ["env torchrun x.py", "sh -c 'torchrun x.py'", "nice -n 5 accelerate launch x.py"])
def test_up_refuses_a_wrapped_launcher_in_one_line_writing_nothing(tmp_path: Path, command: str) -> None:
    runs = tmp_path / "runs"
    result = ddpctl_in_process("up", "--runs-dir", str(runs), "--", *shlex.split(command), cwd=tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: `-- ") and "second launcher" in line, line
    assert not runs.exists()
