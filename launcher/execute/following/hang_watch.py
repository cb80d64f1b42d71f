"""What `up` notices on every poll without being asked: a run that stopped moving (a hang), a node whose disk is
running out, and, once a node has failed, the earliest failure a rank recorded (trainer/failure.py) — each told
as one line per node on the console and as an event in the run directory. All of it comes with the nodes' states
(their failure notes and last logged lines: launcher/remote/node_report.py, read by the poll itself on a host).

The hang rule: a run is hung once no progress record has changed for HANG_FACTOR times the slowest interval seen
between two changes so far (so a run whose validation takes minutes is not called hung when it validates), at
least HANG_FLOOR_SECONDS; before the first change, FIRST_STEP_SECONDS (start-up: rendezvous, data, torch import).
`--stall-timeout` keeps its own meaning (launcher/execute/hosts/run.py: stop every node and pull).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.execute.failures.worker_log import without_control_chars
from launcher.remote import node_report
from launcher.results.peer_loss import lost_a_peer
from launcher.results.progress import console, progress_record
from launcher.results.rundir import RunDir
from launcher.runtimes.native import NodeState

HANG_FACTOR = 5.0
HANG_FLOOR_SECONDS = 60.0
FIRST_STEP_SECONDS = 300.0
# Another floor in seconds (the first-step wait stays FIRST_STEP_SECONDS): for tests, and for users of runs
# whose steps are known to be short.
HANG_FLOOR_ENV = "DDPCTL_HANG_FLOOR"


class HangRule:
    """When a run counts as hung: fed the nodes' progress records, it keeps the last change and the slowest gap."""

    def __init__(self, floor: float = HANG_FLOOR_SECONDS, first_step: float = FIRST_STEP_SECONDS,
                 factor: float = HANG_FACTOR) -> None:
        self.floor, self.first_step, self.factor = floor, first_step, factor
        self.started: float | None = None
        self.last_move: float | None = None
        self.slowest = 0.0
        self.done = False
        self._records: dict[int, dict[str, Any]] = {}

    @classmethod
    def from_env(cls) -> HangRule:
        """The default rule, or the floor DDPCTL_HANG_FLOOR gives (a positive number of seconds)."""
        text = os.environ.get(HANG_FLOOR_ENV, "")
        try:
            floor = float(text)
        except ValueError:
            return cls()
        if not (math.isfinite(floor) and floor > 0):
            return cls()
        return cls(floor=floor)

    def observe(self, node: int, record: object, now: float) -> None:
        """Note node's latest progress record (None: it has none)."""
        if self.started is None:
            self.started = now
        clean = progress_record(record)
        if clean is None or clean == self._records.get(node):
            return
        self._records[node] = clean
        self.done = clean.get("state") == "done"
        if self.last_move is not None:
            self.slowest = max(self.slowest, now - self.last_move)
        self.last_move = now

    def threshold(self) -> float:
        """Seconds without a change after which the run counts as hung."""
        if self.last_move is None:
            return self.first_step
        return max(self.floor, self.factor * self.slowest)

    def idle(self, now: float) -> float:
        """Seconds since the last change (since the first poll before any)."""
        since = self.last_move if self.last_move is not None else self.started
        return 0.0 if since is None else now - since

    def hung(self, now: float) -> bool:
        return not self.done and self.idle(now) > self.threshold()


class RunWatch:
    """Polled with every node's state; prints and records hangs, low disk and the first rank failure."""

    def __init__(self, labels: Sequence[str], run_dir: RunDir, low_disk_floor: int,
                 rule: HangRule | None = None) -> None:
        self.labels = list(labels)
        self.run_dir = run_dir
        self.low_disk_floor = low_disk_floor
        self.rule = rule or HangRule.from_env()
        self.hang_told = False
        self.low_disk_told: set[int] = set()
        self.failure_told = False

    @classmethod
    def for_run(cls, labels: Sequence[str], run_dir: RunDir) -> RunWatch:
        """For a run whose nodes are `labels` (on hosts, or this machine's one)."""
        return cls(labels, run_dir, low_disk_floor(run_dir))

    def poll(self, states: Sequence[NodeState | None], now: float) -> None:
        """Look at this poll's states (None: a node not reached) and tell what is new."""
        for index, state in enumerate(states):
            if state is not None:
                self.rule.observe(index, state.progress, now)
        self._check_disk(states)
        # A node whose torchrun ended without recording its status (no room left to write it) failed too.
        if any(s is not None and s.finished and s.exit_code != 0 for s in states):
            self._tell_failure(states)
        self._check_hang(states, now)

    def poll_here(self, running: bool, exit_code: int | None, record: object, now: float) -> None:
        """poll() for the local node: its state from the process and the run directory."""
        free = _free_bytes(self.run_dir.path)
        workspace = str(self.run_dir.path)  # this machine's run: its workspace is the run directory
        self.poll([NodeState(None, exit_code, running, record if isinstance(record, dict) else None, free,
                             failures=tuple(node_report.failure_notes(workspace)),
                             last_logged=node_report.last_logged(workspace))], now)

    def _say(self, index: int, text: str) -> None:
        console.print(without_control_chars(f"node {index} ({self.labels[index]}): {text}"), markup=False,
                      highlight=False, soft_wrap=True)

    def _check_disk(self, states: Sequence[NodeState | None]) -> None:
        for index, state in enumerate(states):
            free = state.disk_free if state is not None else None
            if free is None or free >= self.low_disk_floor or index in self.low_disk_told:
                continue
            self.low_disk_told.add(index)
            self._say(index, f"only {_size(free)} free in its run directory (below {_size(self.low_disk_floor)}): "
                             "the run fails once the disk is full; free space there")
            self.run_dir.event("low_disk", node=index, free=free, floor=self.low_disk_floor)

    def _tell_failure(self, states: Sequence[NodeState | None]) -> None:
        if self.failure_told:
            return
        self.failure_told = True
        first: tuple[bool, float, int, str] | None = None  # a lost peer after any other failure
        for index, state in enumerate(states):
            # an unreachable node (None): its note comes back when the run is pulled
            for note in state.failures if state is not None else ():
                text = str(note["text"])
                candidate = (lost_a_peer([text]), float(note["time"]), index, text)
                first = candidate if first is None or candidate < first else first
        if first is not None:
            self._say(first[2], first[3])
            self.run_dir.event("rank_failed", node=first[2], error=first[3])

    def _check_hang(self, states: Sequence[NodeState | None], now: float) -> None:
        if not self.rule.hung(now):
            self.hang_told = False  # moving again: a later stall is told again
            return
        if self.hang_told:
            return
        self.hang_told = True
        idle, slowest = self.rule.idle(now), self.rule.slowest
        pace = f"the slowest step so far took {slowest:.1f} s" if self.rule.last_move is not None else "none yet"
        stopped: dict[str, str] = {}
        for index, state in enumerate(states):
            if state is None or state.finished:
                continue
            stopped[str(index)] = state.last_logged or "nothing"
        # Recorded before it is told: a Ctrl-C right after the user reads it must not leave the record without it.
        self.run_dir.event("hang", seconds=round(idle), threshold=round(self.rule.threshold(), 1), nodes=stopped)
        for node, last in stopped.items():
            self._say(int(node), f"no training step for {idle:.0f} s ({pace}): it may be hung; last logged: {last}")


def low_disk_floor(run_dir: RunDir) -> int:
    """Free bytes below which a node is warned about: the run's own snapshot writes need room (preflight's figure)."""
    from launcher.planning.preflight import low_space_floor

    try:
        return low_space_floor(run_dir.spec())
    except Exception:  # a record without a readable spec: the plain floor
        return low_space_floor(None)


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _size(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB" if count < (1 << 30) else f"{count / (1 << 30):.2f} GiB"
