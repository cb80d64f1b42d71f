"""Every rank's Python stacks on demand: faulthandler dumps all threads of this process into
<logs>/stacks/rank-R.txt when it gets STACK_SIGNAL, and rank-R.json records which process registered (pid, start
time, signal), so ddpctl sends the signal only to a process that catches it (`ddpctl stacks RUN`, and a stalled
run's stop: launcher/remote/rank_stacks.py). The same files as a `-- CMD` run's join hook writes
(launcher/runtimes/join_hook.py, which cannot be imported here: it is shipped alone, as a script's
sitecustomize); tests/test_stack_dumps.py checks that both write the same record. Both also write the rank's
flight record on request (launcher/remote/flight_records.py): the process group's last collectives.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO

JOIN_DIR_ENV = "DDPCTL_JOIN_DIR"
STACK_SIGNAL_OFFSET = 5  # SIGRTMIN + 5: a real-time signal that neither torch nor the trainer uses
_open: dict[int, IO[str]] = {}  # pid -> the dump file, open while the process lives (faulthandler writes to it)


def stacks_dir(out_dir: Path) -> Path:
    """Beside the node's logs/joined/ where the node has one (on hosts), else <out_dir>/logs/stacks (a run on
    this machine: its out_dir is the run directory)."""
    joined = os.environ.get(JOIN_DIR_ENV)
    return Path(joined).parent / "stacks" if joined else out_dir / "logs" / "stacks"


def register(rank: int, world_size: int, out_dir: Path) -> None:
    """Dump this process's stacks on STACK_SIGNAL from now on (once per process); never fails the run."""
    if os.getpid() in _open:
        return
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        folder = stacks_dir(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        number = int(signal.SIGRTMIN) + STACK_SIGNAL_OFFSET
        dump = open(folder / f"rank-{rank}.txt", "a")  # noqa: SIM115 - open for the process's lifetime
        faulthandler.register(number, file=dump, all_threads=True)
        _open[os.getpid()] = dump
        record = {"rank": rank, "world_size": world_size, "pid": os.getpid(), "start": _start_time(),
                  "signal": number, "dump": f"rank-{rank}.txt", "time": time.time()}
        part = folder / f".rank-{rank}.json.{os.getpid()}"
        part.write_text(json.dumps(record))
        os.replace(part, folder / f"rank-{rank}.json")
        threading.Thread(target=_dump_flight_records, args=(folder, rank), name="ddpctl-flight-record",
                         daemon=True).start()


def _dump_flight_records(folder: Path, rank: int) -> None:
    """A thread: whenever <stacks>/fr-request is touched (launcher/remote/flight_records.py), write this rank's
    flight record (its process group's last collectives) to fr-rank-R.pkl. A thread, because the main thread may
    be waiting inside the very collective that the record is asked about."""
    request = folder / "fr-request"
    seen = _mtime(request)
    while True:
        time.sleep(0.5)
        asked = _mtime(request)
        if asked <= seen:
            continue
        seen = asked
        with contextlib.suppress(Exception):  # a torch without a flight recorder: the stacks are still taken
            import torch.distributed as dist
            from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

            if dist.is_initialized():
                part = folder / f".fr-rank-{rank}.pkl.{os.getpid()}.tmp"
                part.write_bytes(_dump_fr_trace())
                os.replace(part, folder / f"fr-rank-{rank}.pkl")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _start_time() -> str:
    """/proc/self/stat's start time (clock ticks after boot): with the pid, the process's identity."""
    try:
        return Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
