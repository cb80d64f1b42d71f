"""Per-host fan-out: run one function on many hosts at once; each host gets a value or an error, never a hang.

Workers are daemon threads that are never joined: a host stuck in a system call past its timeout is reported
as a HostTimeoutError and abandoned (its thread ends with the process), so one dead host cannot block us.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from launcher.errors import HostError, HostsFailed

T = TypeVar("T")
R = TypeVar("R")


class HostTimeoutError(HostError, TimeoutError):
    """A host's work did not finish within the timeout."""


@dataclass
class HostOutcome(Generic[T, R]):
    """What happened on one host: `value` when `error` is None, else the exception it raised."""

    item: T
    label: str
    value: R | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def default_label(item: object) -> str:
    """An item's `label` attribute (HostSpec, SSHTarget, Connection have one), else str(item)."""
    label = getattr(item, "label", None)
    return label if isinstance(label, str) else str(item)


def run_on_hosts(items: Sequence[T], fn: Callable[[T], R], *, timeout: float, max_workers: int | None = None,
                 label: Callable[[T], str] = default_label) -> list[HostOutcome[T, R]]:
    """Call fn(item) for every item concurrently; outcomes in the order of `items`.

    Each item gets `timeout` seconds from the moment its call starts (with max_workers, calls may queue).
    """
    outcomes = [HostOutcome[T, R](item, label(item)) for item in items]
    if not items:
        return outcomes
    done: queue.Queue[int] = queue.Queue()
    started: dict[int, float] = {}
    finished: set[int] = set()
    lock = threading.Lock()
    pending: queue.Queue[int] = queue.Queue()
    for i in range(len(items)):
        pending.put(i)

    def worker() -> None:
        while True:
            try:
                i = pending.get_nowait()
            except queue.Empty:
                return
            with lock:
                started[i] = time.monotonic()
            try:
                value = fn(items[i])
                with lock:
                    if i not in finished:
                        outcomes[i].value = value
            except BaseException as e:  # noqa: BLE001 - every failure belongs to its host's outcome
                with lock:
                    if i not in finished:
                        outcomes[i].error = e
            with lock:
                finished.add(i)
            done.put(i)

    for _ in range(min(max_workers or len(items), len(items))):
        threading.Thread(target=worker, daemon=True, name="ddpctl-host").start()

    while len(finished) < len(items):
        with lock:
            now = time.monotonic()
            for i, t0 in started.items():
                if i not in finished and now - t0 >= timeout:
                    finished.add(i)  # the late thread's result, if it ever comes, is ignored
                    outcomes[i].error = HostTimeoutError(outcomes[i].label, f"did not finish within {timeout:g} s")
            deadlines = [t0 + timeout for i, t0 in started.items() if i not in finished]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.05
        with contextlib.suppress(queue.Empty):
            done.get(timeout=min(wait, 1.0) + 0.001)
    return outcomes


def raise_for_errors(outcomes: Sequence[HostOutcome[T, R]], what: str) -> list[R]:
    """Return the values if every host succeeded; else raise one HostsFailed with one line per failing host."""
    failed = [o for o in outcomes if o.error is not None]
    if not failed:
        return [o.value for o in outcomes]  # type: ignore[misc]
    lines = [f"{what} failed on {len(failed)} of {len(outcomes)} host(s):"]
    for o in failed:
        lines.append(f"  {o.label}: {_reason(o)}")
    raise HostsFailed("\n".join(lines), tuple(o.error for o in failed if o.error is not None))


def _reason(outcome: HostOutcome[T, R]) -> str:
    error = outcome.error
    if isinstance(error, HostError) and error.host == outcome.label:
        text = error.reason  # the host is already named at the start of the line
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split()) if "\n" in text else text
