"""A node that stops answering while `up` follows a run on hosts: what is known and what is not about every node.

Told once when a node stops answering (since when it is silent, what each other node does by its own poll, how to
stop every node), and again when it answers (how it ended meanwhile: its exit status and the time its exit_code
file was written). Once it has been silent for the lost-contact limit, `up` ends with a stated outcome: the nodes
that can only be waiting for it (torchrun at the rendezvous, or training that stopped moving past the hang rule of
launcher/execute/following/hang_watch.py) are stopped and pulled, since the run cannot go on without the silent node;
otherwise the run is left to go on, and the line says so."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from launcher.errors import DdpctlError
from launcher.execute.following.interruption import OUTCOME_EVENT
from launcher.execute.pull_record import PULL_RECORD
from launcher.results.progress import console, progress_record
from launcher.results.rundir import RunDir, read_json
from launcher.runtimes.native import NodeState

LOST_CONTACT_ENV = "DDPCTL_LOST_CONTACT"  # seconds without an answer before `up` gives up following (tests: fewer)
LOST_CONTACT_SECONDS = 180.0


def lost_contact_limit() -> float:
    """LOST_CONTACT_SECONDS, or the positive number of seconds LOST_CONTACT_ENV gives."""
    try:
        seconds = float(os.environ.get(LOST_CONTACT_ENV, ""))
    except ValueError:
        return LOST_CONTACT_SECONDS
    return seconds if math.isfinite(seconds) and seconds > 0 else LOST_CONTACT_SECONDS


def clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


@dataclass(frozen=True)
class Movement:
    """The run's training as launcher/execute/following/hang_watch.py's rule saw it: when a progress record last changed
    (time.monotonic(); None before any), the slowest gap between two changes, and whether the rule calls it hung."""

    last_move: float | None = None
    slowest: float = 0.0
    hung: bool = False

    def stopped_for(self, now: float) -> float | None:
        """Seconds since training last moved (None: it never did)."""
        return None if self.last_move is None else now - self.last_move


@dataclass(frozen=True)
class GiveUp:
    """How `up` ends once a node has been silent for the limit: `line` (what is known), `waiting` (the reachable
    nodes that can only be waiting for it: to stop and pull; empty: the run is left as it is)."""

    node: int
    line: str
    waiting: list[int]


class ContactWatch:
    """Fed every poll's states (None: a node that did not answer); tells when a node goes silent and when it
    answers again, and says when one has been silent for the limit."""

    def __init__(self, run_dir: RunDir, labels: Sequence[str], limit: float, launcher: str,
                 exit_time: Callable[[int], float | None]) -> None:
        self.run_dir, self.labels, self.limit, self.launcher = run_dir, list(labels), limit, launcher
        self.exit_time = exit_time
        now, wall = time.monotonic(), time.time()
        self.answered = [now] * len(labels)  # monotonic, for the limit
        self.answered_at = [wall] * len(labels)  # this machine's clock, for what is told
        self.silent: set[int] = set()
        self.found_silent: dict[int, float] = {}  # the poll (monotonic) that found each silent node so

    def observe(self, states: Sequence[NodeState | None], now: float, moving: Movement) -> None:
        """Tell what changed: a node that stopped answering, or one that answers again."""
        wall = time.time()
        for index, state in enumerate(states):
            if state is not None:
                if index in self.silent:
                    self._answers_again(index, state, wall - self.answered_at[index])
                self.answered[index], self.answered_at[index] = now, wall
        for index, state in enumerate(states):
            if state is None and index not in self.silent:
                self.silent.add(index)
                self.found_silent[index] = now
                others = self.others(index, states, moving, now)
                self.run_dir.event("contact_lost", node=index, since=self.answered_at[index], others=others)
                _say(f"node {index} ({self.labels[index]}) does not answer (silent since "
                     f"{clock(self.answered_at[index])}): what it does since then is unknown"
                     + "".join(f"; {text}" for text in others.values())
                     + f"; `up` waits for it up to {self.limit:.0f} s in all; `ddpctl down {self.run_dir.run_id}` "
                       "stops every node")

    def _answers_again(self, index: int, state: NodeState, silent_for: float) -> None:
        self.silent.discard(index)
        self.found_silent.pop(index, None)
        ended = self.exit_time(index) if state.exit_code is not None else None
        if state.exit_code is not None:
            when = f" at {clock(ended)}" if ended is not None else ""
            how = "finished (exit 0)" if state.exit_code == 0 else f"exited {state.exit_code}"
            what = f"it had {how}{when} while out of reach (its recorded exit)"
        else:
            what = f"it is {state.label}"
        self.run_dir.event("contact_back", node=index, silent_seconds=round(silent_for), state=state.label,
                           exit_code=state.exit_code, exit_time=ended)
        _say(f"node {index} ({self.labels[index]}) answers again after {silent_for:.0f} s: {what}")

    def past_limit(self, now: float) -> int | None:
        """The first node silent for longer than the limit, or None."""
        return next((i for i in sorted(self.silent) if now - self.answered[i] > self.limit), None)

    def give_up(self, node: int, states: Sequence[NodeState | None], moving: Movement, now: float) -> GiveUp:
        """The stated end for a node silent past the limit."""
        run_id, label = self.run_dir.run_id, self.labels[node]
        running = [i for i, s in enumerate(states) if s is not None and not s.finished]
        waiting = [i for i in running if self._waits(node, states[i], moving, now)]
        silent = f"lost contact with node {node} ({label}): no answer since {clock(self.answered_at[node])} " \
                 f"({self.limit:.0f} s), so what it does is unknown"
        others = "".join(f"; {text}" for text in self.others(node, states, moving, now).values())
        if running and waiting == running:
            return GiveUp(node, f"{silent}{others}: the run cannot go on without node {node}", waiting)
        goes_on = " (it may have ended, or run on)" + (f"{others}: the run may go on without `up` seeing node {node}"
                                                       if running else others)
        return GiveUp(node, f"{silent}{goes_on}; see `ddpctl status {run_id}`, fetch what was written with "
                            f"`ddpctl pull {run_id}`, or stop every node with `ddpctl down {run_id}`", [])

    def stopped_line(self, give_up: GiveUp, stop_errors: dict[int, str], pulled: str) -> str:
        """The line `up` ends with after stopping the nodes that waited for a silent node."""
        node, run_id = give_up.node, self.run_dir.run_id
        stopped = [i for i in give_up.waiting if i not in stop_errors]
        names = ", ".join(f"node {i} ({self.labels[i]})" for i in stopped)
        text = (f"lost contact with node {node} ({self.labels[node]}) since {clock(self.answered_at[node])}: "
                f"{self.limit:.0f} s without an answer")
        if stopped:
            text += f"; {names} waited for it and {'was' if len(stopped) == 1 else 'were'} stopped by ddpctl"
        for index, why in stop_errors.items():
            text += f"; node {index} ({self.labels[index]}) could not be stopped ({why})"
        return (f"{text}; {pulled}; node {node}'s state is unknown: once it answers, `ddpctl status {run_id}` tells "
                f"how it ended and `ddpctl down {run_id}` stops it if it still runs")

    def _waits(self, node: int, state: NodeState | None, moving: Movement, now: float) -> bool:
        """Whether a running node can only be waiting for the silent `node`: torchrun at the rendezvous (no worker
        started yet), or training that has not moved for longer than the hang rule allows, or not since `node`
        went silent (and for longer than any gap between two changes so far)."""
        if state is None:
            return False
        if self.launcher == "torchrun" and state.alive and state.attempt is None:
            return True
        stopped = moving.stopped_for(now)
        return moving.hung or (self._quiet(node, moving, now) and stopped is not None and stopped > moving.slowest)

    def _quiet(self, node: int, moving: Movement, now: float) -> bool:
        """Whether no training step was seen since `node` was found silent."""
        found = self.found_silent.get(node)
        if moving.last_move is None or found is None:
            return False
        return moving.last_move < found or (now > found and moving.last_move <= found)

    def others(self, node: int, states: Sequence[NodeState | None], moving: Movement, now: float) -> dict[int, str]:
        """What each other node does, by its own poll (or since when it is silent too)."""
        told = {}
        for index, state in enumerate(states):
            if index == node:
                continue
            where = f"node {index} ({self.labels[index]})"
            if state is None:
                told[index] = f"{where} is silent too (since {clock(self.answered_at[index])})"
            else:
                doing = self._doing(state, moving, now, self._quiet(node, moving, now))
                told[index] = f"{where}, polled at {clock(self.answered_at[index])}, {doing}"
        return told

    def _doing(self, state: NodeState, moving: Movement, now: float, quiet: bool) -> str:
        if state.finished:
            if state.exit_code is None:
                return "has ended without recording its exit status"
            return "has finished (exit 0)" if state.exit_code == 0 else f"has exited {state.exit_code}"
        if not state.alive:
            return f"is {state.label}"
        if state.attempt is None:
            return "waits at the rendezvous (no worker started yet)" if self.launcher == "torchrun" else \
                "has not started its workers yet"
        record = progress_record(state.progress) or {}
        where = ", ".join(f"{name} {record[name]}/{record[total]}" for name, total in
                          (("epoch", "epochs"), ("step", "steps_per_epoch")) if record.get(name) and record.get(total))
        where = f" ({where})" if where else ""
        stopped = moving.stopped_for(now)
        if stopped is not None and (moving.hung or quiet):
            return f"has made no training step since {clock(time.time() - stopped)}{where}"
        return f"is training{where}" if record else "runs its workers"


def end_following(contact: ContactWatch, give_up: GiveUp, stop: Callable[[list[int]], dict[int, str]],
                  pull: Callable[[], Any]) -> NoReturn:
    """End `up` for a node silent past the limit: stop and pull the nodes that wait for it (`stop` gives the
    error of each it could not stop), record the outcome, and raise the line that states it."""
    run_dir = contact.run_dir
    run_dir.event("lost_contact", node=give_up.node, seconds=round(contact.limit), waiting=give_up.waiting)
    if not give_up.waiting:
        raise DdpctlError(give_up.line)
    names = ", ".join(f"node {i}" for i in give_up.waiting)
    _say(f"{give_up.line}: stopping {names}, then pulling what the nodes wrote to {run_dir.path}")
    errors = stop(give_up.waiting)
    with contextlib.suppress(DdpctlError):  # named below from the pull record: the silent node's pull fails
        pull()
    record = read_json(run_dir.path / PULL_RECORD) or {}
    failed = [f"node {n['node']}" for n in record.get("nodes", [])
              if isinstance(n, dict) and n.get("error") and n.get("node") != give_up.node]
    pulled = (f"the pull failed for {', '.join(failed)}: `ddpctl pull {run_dir.run_id}` fetches it" if failed else
              f"what {names} wrote is pulled to {run_dir.path}")
    line = contact.stopped_line(give_up, errors, pulled)
    silent = contact.labels[give_up.node]
    run_dir.event(OUTCOME_EVENT, text=line, stopped=False, pulled=not failed,
                  left_running=[f"{silent} (unknown: no answer)"] + [
                      f"{contact.labels[i]} ({why})" for i, why in errors.items()])
    raise DdpctlError(line)


def _say(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)
