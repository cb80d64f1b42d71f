"""`ddpctl up --detach` on this machine, like `nohup`: the run goes on without the terminal that started it.

`up` forks twice. The grandchild leaves the terminal's session (setsid: no controlling terminal, so closing the
terminal sends it no SIGHUP), points its standard streams at the run directory's DETACHED_LOG, and does exactly
what a foreground `up` does after the run directory exists: start torchrun, follow it (the hang, disk and failure
watches; `ddpctl down` from elsewhere), record how it ended (events.jsonl, summary.json, restarts, the first
failure). The middle process exits at once, so the follower is nobody's child (the system reaps it) and `up`
waits on nothing but the start: it returns once torchrun was started (or with the error that kept it from
starting), having said how to follow the run."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from launcher.errors import DdpctlError
from launcher.results.rundir import RunDir, add_event_listener

DETACHED_LOG = "detached.out"  # what the follower printed (its own lines: the run's output is in logs/)
START_WAIT_SECONDS = 120.0
_STARTED, _FAILED = b"s", b"f"


def run_detached(run_dir: RunDir, follow: Callable[[], int]) -> None:
    """Run `follow` (start torchrun, follow the run, record its end; its exit status) in a detached process;
    return once torchrun was started. DdpctlError when it was not (the reason its follower gave)."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - runs in the forked processes, which end with os._exit
        os.close(read_end)
        _middle(run_dir, follow, write_end)
    os.close(write_end)
    os.waitpid(middle, 0)
    try:
        said = _wait_for_start(read_end, START_WAIT_SECONDS)
    finally:
        os.close(read_end)
    if said == _STARTED:
        return
    errors = [e.get("error") for e in run_dir.events() if e.get("event") == "exited" and e.get("error")]
    last = str(errors[-1]) if errors else _last_line(run_dir)
    raise DdpctlError(f"the detached run {run_dir.run_id} did not start" + (f": {last}" if last else "") +
                      f"; see {run_dir.path / DETACHED_LOG}")


def _middle(run_dir: RunDir, follow: Callable[[], int], write_end: int) -> None:  # pragma: no cover
    """The middle process: start the follower in a session of its own, then end (its parent reaps it)."""
    try:
        os.setsid()
        if os.fork() == 0:
            _follower(run_dir, follow, write_end)
    finally:
        os._exit(0)


def _follower(run_dir: RunDir, follow: Callable[[], int], write_end: int) -> None:  # pragma: no cover
    """The detached follower: its streams to the run directory, `follow` run to the end; tells `up` through the
    pipe when torchrun started (or why not, by closing it)."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(run_dir.path / DETACHED_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)

        def tell(event: dict[str, Any]) -> None:
            nonlocal write_end
            if write_end >= 0 and event.get("event") in ("started", "exited"):
                with contextlib.suppress(OSError):
                    os.write(write_end, _STARTED if event["event"] == "started" else _FAILED)
                    os.close(write_end)
                write_end = -1

        add_event_listener(tell)
        code = follow()
    except DdpctlError as e:
        print(f"error: {e}", file=sys.stderr)
        code = int(getattr(e, "exit_code", 1))
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _wait_for_start(read_end: int, seconds: float) -> bytes:
    """What the follower told: _STARTED, _FAILED, or b"" (it ended, or said nothing in time)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([read_end], [], [], left)
        if ready:
            return os.read(read_end, 1)
    return b""


def _last_line(run_dir: RunDir) -> str:
    """The follower's last line: why the run did not start."""
    try:
        lines = (run_dir.path / DETACHED_LOG).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].removeprefix("error: ") if lines else ""
