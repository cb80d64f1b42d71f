"""Progress as plain lines with a time stamp, for a log file, a pipe, `nohup` or CI: what `up` and `sweep` show
when stderr is not a terminal, or with `--progress plain`.

Each line is written whole, stamped and flushed as it happens: the phases (the run directory's events), each
node's state, every epoch's end with its samples/s, a progress line every HEARTBEAT_SECONDS, restarts, warnings,
and the live tail of global rank 0's output (at most TAIL_LINES_PER_SECOND lines a second on average; what is
held back is counted, and all of it is in the run directory's logs/). No escape sequence or carriage return
reaches the output. On a terminal the live display (launcher.results.progress.RunProgress) stays as it is."""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import IO, Any, cast

from launcher.execute.failures.worker_log import without_control_chars
from launcher.results.progress import RunProgress, console, progress_record, script_status
from launcher.results.rundir import add_event_listener, remove_event_listener

STYLES = ("auto", "live", "plain")
HEARTBEAT_SECONDS = 30.0
TAIL_LINES_PER_SECOND = 5.0
TAIL_BURST = 40  # lines shown at once before the rate applies (a traceback comes whole)


def stamp() -> str:
    """This moment as the lines show it: local time with its UTC offset, to the second."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


def plain_line(text: str) -> str:
    """One line of text as a log file should hold it: what a terminal would leave after its last carriage
    return, without escape sequences or other control characters."""
    return without_control_chars(text.rsplit("\r", 1)[-1]).rstrip()


class StampedLines(io.TextIOBase):
    """A text stream that writes each whole line to stderr (the one of the moment) with a time stamp in front,
    cleaned of control sequences, and flushes it at once. `stamping` False writes the lines cleaned only."""

    def __init__(self, target: Callable[[], Any] = lambda: sys.stderr) -> None:
        super().__init__()
        self._target = target
        self._partial = ""
        self.stamping = True

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        pieces = (self._partial + text).split("\n")
        self._partial = pieces.pop()
        out = self._target()
        for piece in pieces:
            line = plain_line(piece)
            out.write(f"{stamp()} {line}\n" if self.stamping else f"{line}\n")
        out.flush()
        return len(text)

    def flush(self) -> None:
        self._target().flush()


_style = {"plain": False}


def plain_output() -> bool:
    """True inside `output_style` when the run is shown as plain lines."""
    return _style["plain"]


@contextlib.contextmanager
def output_style(style: str) -> Iterator[bool]:
    """For one command: with `style` plain (auto: when stderr is not a terminal, or a dumb one), everything the
    launcher's console prints becomes stamped plain lines, the run directory's events are told as they happen, and
    stdout is line-buffered (a sweep's lines reach a file as they come). Yields whether the output is plain."""
    if style not in STYLES:
        from launcher.errors import SpecError

        raise SpecError(f"--progress {style!r} is not one of {', '.join(STYLES)}")
    # A terminal that cannot redraw in place (TERM=dumb: an editor's shell, some CI runners) gets the plain lines
    # too: the live display would show nothing there until the run ends.
    plain = style == "plain" or (style == "auto" and not (console.is_terminal and not console.is_dumb_terminal))
    if not plain or plain_output():
        yield plain_output()
        return
    previous, previous_wrap = console._file, console.soft_wrap  # None: the stderr of the moment
    console.file = cast("IO[str]", StampedLines())
    console.soft_wrap = True  # a long line (a path) stays one line
    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    add_event_listener(tell_event)
    _style["plain"] = True
    try:
        yield True
    finally:
        _style["plain"] = False
        remove_event_listener(tell_event)
        console.file, console.soft_wrap = previous, previous_wrap  # type: ignore[assignment]


@contextlib.contextmanager
def unstamped() -> Iterator[None]:
    """Lines printed meanwhile (a final table) go out as on a terminal, without time stamps."""
    stream = console.file
    if not isinstance(stream, StampedLines):
        yield
        return
    stream.stamping = False
    try:
        yield
    finally:
        stream.stamping = True


def say(text: str) -> None:
    console.print(plain_line(text), markup=False, highlight=False, soft_wrap=True)


# Events whose news another line already gives (the hang watch's, a restart's with its cause, the provider's own;
# a node's failure: its state line, "node K (HOST): failed (exit N)", comes from the same poll, just before).
_TOLD_ELSEWHERE = ("rank_failed", "hang", "low_disk", "teardown_failed", "failure_attributed", "restarted",
                   "contact_lost", "contact_back", "lost_contact", "node_failed",
                   "stacks", "world_differs")  # the stall's stop and the run's last line carry these


# Records for ddpctl's own use, not news: the measured world is in the summary table (its warning, if any, is
# printed by `up` itself); a Slurm job's state has its own line as the job is followed (launcher/places/slurm/up.py).
_INTERNAL = ("world_measured", "job_state")


def describe_event(event: dict[str, Any]) -> str | None:
    """An event of events.jsonl as a line for the log, or None for one another line tells."""
    kind = str(event.get("event") or "")
    if not kind or kind in _TOLD_ELSEWHERE or kind.startswith("vast."):
        return None
    if kind in _INTERNAL:
        return None
    if kind == "exited" and event.get("error") is not None:
        return None  # torchrun could not be started: the run ends with one error line that says so
    node = event.get("node")
    where = f"node {node}: " if isinstance(node, int) else ""
    phrases: dict[str, Callable[[], str]] = {
        "run_created": lambda: f"run {event.get('run')} (its directory: {event.get('path')})",
        "planned": lambda: f"planned {len(event.get('nodes') or [])} node(s)",
        "shipped": lambda: "code shipped",
        "image": lambda: f"image {event.get('image')} in place",
        "started": lambda: f"{_program(event)} started (pid {event.get('pid')})",
        "exited": lambda: f"{_program(event)} exited with status {event.get('exit_code')}",
        "finished": lambda: f"every node ended (exit statuses {_listed(event.get('exit_codes'))})",
        "stalled": lambda: f"no training step for {event.get('seconds')} s",
        "stop_requested": lambda: f"stopping: {event.get('reason')}",
        "stopping": lambda: f"stopping node(s) {_listed(event.get('nodes'))}: {event.get('reason')}",
        "stopped": lambda: "stopped" + (f" (exit status {event['exit_code']})" if "exit_code" in event else ""),
        "pulled": lambda: (f"results pulled, {event['verified']} file(s) verified" if event.get("verified")
                           else "nothing came back (no file to pull)"),
        "pull_failed": lambda: f"pull failed: {_pull_reason(event.get('error'))}",
        "interrupted": lambda: f"interrupted: {event.get('reason')}",
        "stop_abandoned": lambda: "the stop was abandoned: nodes may still be running",
        "pull_abandoned": lambda: "the pull was abandoned",
        "outcome": lambda: f"outcome: {event.get('text')}",
        "requeued": lambda: (f"job {event.get('job_id')} requeued ({event.get('requeues')}/"
                             f"{event.get('max_requeues')}) at the time limit"),
    }
    phrase = phrases.get(kind)
    if phrase is not None:
        return where + phrase()
    details = ", ".join(f"{k} {v}" for k, v in sorted(event.items()) if k not in ("event", "time", "node")
                        and isinstance(v, (str, int, float)) and len(str(v)) <= 80
                        and v not in ("", "None"))  # Slurm says "None" for no reason: nothing to tell
    return where + kind.replace("_", " ") + (f" ({details})" if details else "")


def _pull_reason(error: object) -> str:
    """A pull's error in words: paramiko's "Server connection dropped: " says nothing after its colon."""
    text = " ".join(str(error or "").split()).removesuffix(":")
    if text == "Server connection dropped":
        return "the SSH connection dropped (the host's sshd ended or the network failed)"
    return text or "no reason given"


def _listed(values: object) -> str:
    """[0, 1] as `0, 1` (never a Python list in a line for people)."""
    return ", ".join(str(v) for v in values) if isinstance(values, (list, tuple)) else str(values)


def _program(event: dict[str, Any]) -> str:
    """What a node started, by the run's --launcher: spawn runs the command itself."""
    launcher = str(event.get("launcher") or "torchrun")
    return "the command" if launcher == "spawn" else launcher


def tell_event(event: dict[str, Any]) -> None:
    """An event listener (launcher.results.rundir): the event as a line, as it is recorded."""
    line = describe_event(event)
    if line:
        say(line)


class PlainProgress:
    """RunProgress's plain counterpart: lines when something changes, never a redraw."""

    def __init__(self, node_labels: list[str], enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self._names = [f"node {i} ({label})" for i, label in enumerate(node_labels)]
        self._clock = clock
        self._states: dict[int, str] = {}
        self._notes: dict[int, str] = {}
        self._records: dict[int, dict[str, Any]] = {}
        self._epoch_told: dict[int, int] = {}
        self._status_at: dict[int, float] = {}
        self._budget = float(TAIL_BURST)
        self._budget_at = clock()
        self._held_back = 0

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tell_held_back()

    def show_output(self, title: str, lines: list[str], stream: list[str]) -> None:
        """Rank 0's new lines (`stream`), each once, at a rate a log can hold."""
        if not self.enabled:
            return
        now = self._clock()
        self._budget = min(float(TAIL_BURST), self._budget + (now - self._budget_at) * TAIL_LINES_PER_SECOND)
        self._budget_at = now
        if self._held_back and self._budget >= 1:
            self._tell_held_back()
        for line in stream:
            if self._budget >= 1:
                self._budget -= 1
                say(f"{title} {line}")
            else:
                self._held_back += 1

    def _tell_held_back(self) -> None:
        if self._held_back:
            say(f"({self._held_back} line(s) of rank 0's output not shown here: every line is in the run "
                "directory's logs/ and `ddpctl logs`)")
            self._held_back = 0

    def update(self, node: int, record: object, state: str | None = None, extra: str = "") -> None:
        """A node's latest progress record and state: told when they change (see the module's docstring)."""
        if not self.enabled:
            return
        name = self._names[node]
        clean = progress_record(record) or None
        shown = state or ("running" if clean else "starting")
        if shown != self._states.get(node):
            self._states[node] = shown
            say(f"{name}: {shown}")
        if clean:
            self._progress(node, name, clean)
        if extra != self._notes.get(node, ""):
            self._notes[node] = extra
            if extra:
                say(f"{name}: {extra}")

    def _progress(self, node: int, name: str, record: dict[str, Any]) -> None:
        previous = self._records.get(node)
        self._records[node] = record
        now = self._clock()
        if record.get("source"):  # a script's record: what it says, when its epoch changes or now and then
            status, _ = script_status(record)
            if previous is None or previous.get("epoch") != record.get("epoch") or self._due(node, now):
                self._status_at[node] = now
                say(f"{name}: {status}")
            return
        epoch, epochs = int(record.get("epoch") or 0), int(record.get("epochs") or 0)
        told = self._epoch_told.get(node, 0)
        if epoch <= told - 1:  # an attempt after a restart resumed from an earlier epoch
            told = self._epoch_told[node] = epoch - 1
        rate = float(record.get("samples_per_s") or 0.0)
        steps = record.get("steps_per_epoch")
        if previous and not previous.get("source") and told < int(previous.get("epoch") or 0) < epoch:
            # The epoch's last record was missed between two polls: its last rate seen, said as such.
            last = int(previous.get("epoch") or 0)
            say(f"{name}: epoch {last}/{epochs} ended ({float(previous.get('samples_per_s') or 0):,.0f} samples/s "
                f"at step {previous.get('step')}/{steps}, the last seen)")
            told = self._epoch_told[node] = last
        if record.get("state") in ("validating", "done") and epoch > told:
            say(f"{name}: epoch {epoch}/{epochs} ended, {rate:,.0f} samples/s")
            self._epoch_told[node] = epoch
            self._status_at[node] = now
        elif record.get("state") == "training" and self._due(node, now):
            self._status_at[node] = now
            say(f"{name}: epoch {epoch}/{epochs} step {record.get('step')}/{steps}, {rate:,.0f} samples/s")

    def _due(self, node: int, now: float) -> bool:
        return now - self._status_at.setdefault(node, now) >= HEARTBEAT_SECONDS


def run_progress(node_labels: list[str], enabled: bool = True) -> RunProgress | PlainProgress:
    """The display for a run being followed: plain lines inside a plain `output_style`, else the live one."""
    return PlainProgress(node_labels, enabled) if plain_output() else RunProgress(node_labels, enabled)
