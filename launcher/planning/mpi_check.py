"""What `--launcher mpirun` needs on each host, checked by the probe and named in one line per host: Open MPI's
mpirun, mpi4py importable by the node's python (when the command runs python), and on node 0 of several nodes an
ssh client (mpirun starts the other nodes' processes over SSH)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING

from launcher.errors import SpecError
from launcher.planning.preflight import Problem
from launcher.spec.user_command import INTERPRETER_WORDS

if TYPE_CHECKING:
    from launcher.spec.run_spec import RunSpec

# Prints what is missing, `|`-separated. Arguments: the python, 1 to check mpi4py, 1 to check ssh.
MPI_CHECK_SCRIPT = r"""
py=$1; missing=""
if ! command -v mpirun >/dev/null 2>&1; then missing="$missing|openmpi (no mpirun on PATH: install openmpi-bin)"
elif ! mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  missing="$missing|Open MPI (the mpirun on PATH is not Open MPI's)"
fi
if [ "$2" = 1 ] && ! "$py" -c "import mpi4py" >/dev/null 2>&1; then
  missing="$missing|mpi4py ($py cannot import it: $py -m pip install mpi4py, or install python3-mpi4py)"
fi
if [ "$3" = 1 ] && ! command -v ssh >/dev/null 2>&1; then
  missing="$missing|ssh (node 0 starts the other nodes' processes over SSH: install openssh-client)"
fi
printf '%s\n' "$missing"
"""


def needs_mpi4py(spec: RunSpec) -> bool:
    return bool(spec.user_command) and (spec.user_command[0] in INTERPRETER_WORDS
                                        or spec.user_command[0].rsplit("/", 1)[-1].startswith("python"))


def missing_line(missing: str) -> str | None:
    items = [item for item in missing.strip().split("|") if item]
    return f"--launcher mpirun needs {', '.join(items)}" if items else None


def mpi_check_argv(spec: RunSpec, index: int, nnodes: int) -> list[str] | None:
    """What host `index` runs (within its probe round trip) to say what it lacks for the MPI job; None for
    another launcher. Node 0 of several also needs ssh: it starts the others' processes."""
    if spec.launcher != "mpirun":
        return None
    return ["sh", "-c", MPI_CHECK_SCRIPT, "ddpctl-mpi-check", spec.python, "1" if needs_mpi4py(spec) else "0",
            "1" if index == 0 and nnodes > 1 else "0"]


def mpi_problems(labels: Sequence[str], outputs: Sequence[str]) -> list[Problem]:
    """One problem per host whose check (mpi_check_argv's, its output in `outputs`) found something missing."""
    return [Problem(labels[i], line) for i, text in enumerate(outputs) if (line := missing_line(text))]


def check_local_mpi(spec: RunSpec) -> None:
    """The same check on this machine, before anything is written: one line (SpecError)."""
    result = subprocess.run(["sh", "-c", MPI_CHECK_SCRIPT, "ddpctl-mpi-check", spec.python,
                             "1" if needs_mpi4py(spec) else "0", "0"], capture_output=True, text=True, timeout=60,
                            check=False)
    line = missing_line(result.stdout) if shutil.which("sh") else None
    if line:
        raise SpecError(f"this machine: {line}")
