"""What a host run's preflight checks, for a run on this machine: before anything starts, that torchrun's
rendezvous address resolves and a port can be bound there; while it starts, what torchrun last said when no
training step comes.

A local run is `torchrun --standalone`: its c10d store listens on a free port of `localhost` and every worker
connects to `localhost:PORT`. Where `localhost` does not resolve (a minimal root file system without /etc/hosts)
the workers time out as clients after minutes, and the display would show only "running".
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from launcher.errors import SpecError
from launcher.execute.failures.worker_log import without_control_chars

# A CPU-only machine runs at most this many gloo processes per core (each loads torch: ~0.3 GB, a share of the
# cores); DDPCTL_MAX_CPU_PROCESSES overrides the limit, e.g. to try a large world on a small machine.
CPU_PROCESSES_PER_CORE = 4
MAX_CPU_PROCESSES_ENV = "DDPCTL_MAX_CPU_PROCESSES"
STANDALONE_RDZV_HOST = "localhost"  # torchrun --standalone's rendezvous endpoint is localhost:0
FIRST_STEP_WAIT_SECONDS = 60.0
_SHOWN_CHARS = 100


def check_cpu_processes(processes: int, gpus: int, cores: int | None = None,
                        env: Mapping[str, str] | None = None) -> None:
    """Refuse (SpecError) more training processes than a machine without GPUs can run: CPU_PROCESSES_PER_CORE per
    core, or DDPCTL_MAX_CPU_PROCESSES. A machine with GPUs is checked against its GPUs instead."""
    if gpus:
        return
    env = os.environ if env is None else env
    cores = cores or len(os.sched_getaffinity(0))
    override = env.get(MAX_CPU_PROCESSES_ENV, "")
    if override and not (override.isdigit() and int(override) > 0):
        raise SpecError(f"{MAX_CPU_PROCESSES_ENV}={override!r}: give a whole number of processes >= 1")
    limit = int(override) if override else max(2, cores * CPU_PROCESSES_PER_CORE)
    if processes <= limit:
        return
    if override:
        raise SpecError(f"--gpus {processes}: {MAX_CPU_PROCESSES_ENV} allows {limit} processes on this machine (no "
                        f"GPU, {cores} CPU cores); give --gpus {limit} or less, or raise {MAX_CPU_PROCESSES_ENV}")
    raise SpecError(f"--gpus {processes}: this machine has no GPU and {cores} CPU cores, which run at most {limit} "
                    f"training processes ({CPU_PROCESSES_PER_CORE} per core); give --gpus {limit} or less, or set "
                    f"{MAX_CPU_PROCESSES_ENV}=N to allow more")


def check_local_rendezvous(host: str = STANDALONE_RDZV_HOST) -> None:
    """Refuse a local run whose rendezvous address does not resolve or offers no port to bind (SpecError)."""
    try:
        addresses = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise SpecError(f"this machine cannot resolve {host!r} ({reason}), where torchrun's workers meet: add "
                        f"`127.0.0.1 localhost` to /etc/hosts") from None
    problems = []
    for family, kind, proto, _, sockaddr in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind((sockaddr[0], 0))
                return
        except OSError as e:
            problems.append(f"{sockaddr[0]}: {e.strerror or e}")
    raise SpecError(f"no port can be bound on {host!r} ({'; '.join(problems)}), where torchrun's workers meet: "
                    "check the loopback interface (`ip link set lo up`)")


class FirstStepWatch:
    """The state to show for a local run: "running", or once no progress record came within
    FIRST_STEP_WAIT_SECONDS of torchrun's start, the last line of its output (a rendezvous timeout, a
    connection error), so a run stuck before training says why."""

    def __init__(self, torchrun_out: Path, wait: float = FIRST_STEP_WAIT_SECONDS,
                 started: float | None = None) -> None:
        self._out = torchrun_out
        self._wait = wait
        self._started = time.monotonic() if started is None else started
        self._stepped = False

    def state(self, progress: object, now: float | None = None) -> str:
        """"running", or "no step after N s; torchrun: LAST LINE" while waiting too long for the first step."""
        self._stepped = self._stepped or isinstance(progress, dict) and bool(progress)
        waited = (time.monotonic() if now is None else now) - self._started
        if self._stepped or waited < self._wait:
            return "running"
        last = last_line(self._out)
        said = f"; torchrun: {last}" if last else "; torchrun printed nothing"
        return f"no training step after {int(waited)} s{said}"


def last_line(path: Path, max_bytes: int = 8192) -> str:
    """The last non-blank line of a file (its end only is read), safe to show and cut to fit a display row."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in without_control_chars(tail).splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    if len(line) <= _SHOWN_CHARS:
        return line
    head = _SHOWN_CHARS * 3 // 5  # what went wrong comes first, with whom (address, port) last
    return f"{line[:head]} … {line[-(_SHOWN_CHARS - head - 3):]}"
