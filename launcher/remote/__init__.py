"""Code that runs on the hosts, kept as modules: standard library only, no `from __future__` (a module's source is
sent ahead of the script that uses it, `python -c SOURCE+SCRIPT`), so it is linted, type-checked and unit-tested
here like any module, and what the hosts run is this file's text (`source_of`), never a second copy.

What must be shell (a node's command, which also runs inside containers; a host that may have no Python, as a
Docker host) is a `.sh` file of this package (package data, checked by shellcheck in tests/test_remote_shell.py),
sent as its text (`shell_text`, run as `sh -c TEXT NAME ARGS...`).

LAZY_IMPORTS: a node's state is asked every second. A followed run asks one program per host for all its polls
(launcher/runtimes/served_polls.py); `status`, `logs` and a failure's report start a new `python -S` on the host
for each question, which loads every module of the node program (launcher/runtimes/native.py), so what these
modules import at their top is paid each time, by the CPUs training there. subprocess, shutil, base64, signal and
typing (~10 ms of CPU together there) are imported by the functions that need them (a start, a copy, a failure's
report, serving), each such import marked `# LAZY: see LAZY_IMPORTS`; tests/test_program_cache.py checks that a
poll imports none of them."""

from pathlib import Path
from types import ModuleType


def source_of(module: ModuleType) -> str:
    """The text of a module of this package, as it is sent to the hosts."""
    return Path(str(module.__file__)).read_text(encoding="utf-8")


def shell_text(name: str) -> str:
    """The text of this package's shell script `name` (e.g. "docker_run.sh"), as it is sent to the hosts."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")
