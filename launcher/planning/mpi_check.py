"""What `--launcher mpirun` needs on each host, checked by the probe and named in one line per host: Open MPI's
mpirun, mpi4py importable by the node's python (when the command runs python), and on node 0 of several nodes an
ssh client (mpirun starts the other nodes' processes over SSH)."""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

from launcher.errors import SpecError
from launcher.planning.preflight import Problem
from launcher.remote import shell_text
from launcher.spec.user_command import INTERPRETER_WORDS
from launcher.transport.parallel import raise_for_errors, run_on_hosts

if TYPE_CHECKING:
    from launcher.spec.run_spec import RunSpec
    from launcher.transport.hostsession import HostSession

# Prints what is missing, `|`-separated. Arguments: the python, 1 to check mpi4py, 1 to check ssh.
MPI_CHECK_SCRIPT = shell_text("mpi_check.sh")  # launcher/remote/mpi_check.sh


def needs_mpi4py(spec: RunSpec) -> bool:
    return bool(spec.user_command) and (spec.user_command[0] in INTERPRETER_WORDS
                                        or spec.user_command[0].rsplit("/", 1)[-1].startswith("python"))


def missing_line(missing: str) -> str | None:
    items = [item for item in missing.strip().split("|") if item]
    return f"--launcher mpirun needs {', '.join(items)}" if items else None


def mpi_problems(session: HostSession, spec: RunSpec) -> list[Problem]:
    """One problem per host that lacks what the MPI job needs (none for another launcher)."""
    if spec.launcher != "mpirun":
        return []
    mpi4py = "1" if needs_mpi4py(spec) else "0"

    def check(index: int) -> str:
        ssh = "1" if index == 0 and len(session.targets) > 1 else "0"
        return str(session.conn(index).run(["sh", "-c", MPI_CHECK_SCRIPT, "ddpctl-mpi-check", spec.python, mpi4py,
                                            ssh], timeout=60).stdout)

    found = raise_for_errors(run_on_hosts(list(range(len(session.targets))), check, timeout=90,
                                          label=session.label_of), "MPI check")
    return [Problem(session.labels[i], line) for i, text in enumerate(found) if (line := missing_line(text))]


def check_local_mpi(spec: RunSpec) -> None:
    """The same check on this machine, before anything is written: one line (SpecError)."""
    result = subprocess.run(["sh", "-c", MPI_CHECK_SCRIPT, "ddpctl-mpi-check", spec.python,
                             "1" if needs_mpi4py(spec) else "0", "0"], capture_output=True, text=True, timeout=60,
                            check=False)
    line = missing_line(result.stdout) if shutil.which("sh") else None
    if line:
        raise SpecError(f"this machine: {line}")
