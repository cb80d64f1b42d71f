"""A static look at the `-- CMD` script before the run, for what would make it run as something other than the
launcher planned: a script that starts its own processes (`mp.spawn`, `torch.multiprocessing.spawn` /
`start_processes`), an MPI script (`mpi4py`), or one that pins its process group to this machine (MASTER_ADDR set
to localhost, `init_method="tcp://localhost:..."`), which on several nodes makes one world per node.

Only the script named on the command line is read (what it imports is not): a finding is certain, its absence is
not; the join records (launcher/results/joined_worlds.py) catch what this cannot see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_SPAWNS = re.compile(r"\b(?:mp|multiprocessing|torch\.multiprocessing)\.(?:spawn|start_processes)\s*\("
                     r"|\bfrom\s+torch\.multiprocessing\s+import\b.*\b(?:spawn|start_processes)\b")
_MPI = re.compile(r"^\s*(?:import\s+mpi4py\b|from\s+mpi4py\b)")
_LOCALHOST = r"""['"](?:tcp://)?(?:localhost|127\.0\.0\.1)(?::\d+)?['"]"""
_PINNED = re.compile(r"""MASTER_ADDR['"]\s*\]\s*=\s*""" + _LOCALHOST
                     + r"""|MASTER_ADDR['"]\s*,\s*""" + _LOCALHOST
                     + r"""|init_method\s*=\s*['"]tcp://(?:localhost|127\.0\.0\.1)""")


@dataclass(frozen=True)
class Finding:
    """What was found (`spawns`, `mpi`, `localhost`), where (file:line) and the line itself."""

    kind: str
    path: str
    line_number: int
    line: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line_number}: `{self.line.strip()[:80]}`"


def script_of(command: tuple[str, ...], cwd: Path) -> Path | None:
    """The Python file `command` runs (`python [opts] train.py ...`), if it names one that exists under `cwd`."""
    if not command or not re.fullmatch(r"python[0-9.]*", Path(command[0]).name):
        return Path(cwd, command[0]) if command and command[0].endswith(".py") else None
    for word in command[1:]:
        if word.startswith("-"):
            if word in ("-m", "-c"):
                return None  # a module or inline code: nothing to read here
            continue
        return Path(cwd, word)
    return None


def look(command: tuple[str, ...], cwd: Path) -> list[Finding]:
    """Every finding in the command's script (empty when there is no script to read)."""
    path = script_of(command, cwd)
    if path is None or not path.is_file():
        return []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    findings = []
    shown = str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        for kind, pattern in (("spawns", _SPAWNS), ("mpi", _MPI), ("localhost", _PINNED)):
            if pattern.search(code):
                findings.append(Finding(kind, shown, number, line))
    return findings


def first(findings: list[Finding], kind: str) -> Finding | None:
    return next((f for f in findings if f.kind == kind), None)
