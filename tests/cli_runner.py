"""ddpctl run as its users run it, for every test that needs a process of its own: `python -m launcher ARGS` of this
checkout (whatever the working directory: elsewhere `-m launcher` would find an installed copy), its output captured.
One helper for the suite; a test module that always passes the same options wraps it in one line.
(tests/cli_in_process.py calls the same command line in the test's own process, where no process boundary is tested.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.testbed import Testbed

REPO = Path(__file__).resolve().parent.parent


def ddpctl_argv(*args: str) -> list[str]:
    """The command line of `ddpctl ARGS` (this Python, this checkout's launcher)."""
    return [sys.executable, "-m", "launcher", *args]


def ddpctl_env(env: Mapping[str, str] | None = None, *, known_hosts: Path | str | None = None) -> dict[str, str]:
    """The environment of a ddpctl process: this process's with `env` set over it, this checkout first on PYTHONPATH,
    and DDPCTL_KNOWN_HOSTS (the only host keys trusted) when `known_hosts` is given."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full.get("PYTHONPATH")]))
    if known_hosts is not None:
        full["DDPCTL_KNOWN_HOSTS"] = str(known_hosts)
    return full


def ddpctl(*args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
           known_hosts: Path | str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ddpctl ARGS` in `cwd`, to its end (TimeoutExpired past `timeout`): its exit status, stdout and stderr."""
    return subprocess.run(ddpctl_argv(*args), capture_output=True, text=True, cwd=cwd,
                          env=ddpctl_env(env, known_hosts=known_hosts), timeout=timeout)


def ddpctl_on_bed(bed: Testbed, *args: str, known_hosts: Path | None = None, cwd: Path | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ddpctl COMMAND -i BED_KEY ARGS...` trusting the test bed's host keys (or `known_hosts`). Past `timeout` the
    nodes' torchrun.out tails are printed (what they were doing) before TimeoutExpired is raised."""
    command, *rest = args  # the key option goes before any `-- CMD...`
    try:
        return ddpctl(command, "-i", bed.client_key_path, *rest, cwd=cwd,
                      known_hosts=known_hosts or bed.known_hosts_path, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        print(f"ddpctl {command} ran over {timeout}s; stderr:\n{e.stderr!r}")
        for host in bed.hosts:
            for out in Path(host.home, ".ddpctl", "runs").glob("*/torchrun.out"):
                print(f"== {out}\n" + "\n".join(out.read_text(errors="replace").splitlines()[-30:]))
        raise
