"""Every interruption of `up` ends in a stated outcome: Ctrl-C (once or several times), SIGTERM, SIGHUP (the
terminal closing) stop every node and pull what they wrote, or say which nodes were left running and how to
reattach; the outcome is printed and recorded as an `outcome` event.

Signal handlers are process-wide, so the state is too: `catch_stop_signals` makes SIGTERM and SIGHUP behave as
Ctrl-C (torchrun runs detached on hosts and in a session of its own here: the launcher's default death by
SIGTERM would leave it running, unannounced). While the nodes are being stopped, one more signal only says that
the stop goes on (and that another leaves them running); a further one abandons the stop on hosts. While pulling,
a signal ends the pull: the nodes are already stopped and `ddpctl pull` fetches the rest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.errors import DdpctlError, HostsFailed
from launcher.execute.following.plain_progress import plain_output, stamp
from launcher.results.rundir import RunDir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
OUTCOME_EVENT = "outcome"
# How long a stop signal may wait for nodes being started (their start times out after 60 s); past it a signal
# raises again, so that a deferral nobody ended (a detached run, a failed start) never swallows Ctrl-C.
DEFER_LIMIT_SECONDS = 90.0


class StopAbandoned(BaseException):
    """The user interrupted the stop of the nodes again: they are left as they are."""


class PullAbandoned(BaseException):
    """The user interrupted the pull: the nodes are stopped, what they wrote stays on them."""


@dataclass
class _SignalState:
    # raise: a signal raises KeyboardInterrupt; defer: it is remembered and acted on later (nodes starting);
    # stopping / pulling: the stop-and-pull below is under way.
    mode: str = "raise"
    received: list[str] = field(default_factory=list)
    pending: bool = False
    during_stop: int = 0
    abandonable: bool = True
    installed: bool = False
    defer_until: float = 0.0


_state = _SignalState()


def _say(text: str) -> None:
    """One line on stderr, safe inside a signal handler and when the terminal is gone (SIGHUP): os.write, no
    buffered stream to re-enter, and a closed terminal is not an error here (the event is the record)."""
    if plain_output():  # a log's lines carry the time
        text = f"{stamp()} {text}"
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode(errors="replace"))


def _handle(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    _state.received.append(name)
    if _state.mode == "defer" and time.monotonic() < _state.defer_until:
        _state.pending = True
        _say(f"{_cause(name)}: the nodes are starting; ddpctl stops them as soon as they have started")
        return
    if _state.mode == "stopping":
        _state.during_stop += 1
        if not _state.abandonable:
            _say(f"{_cause(name)}: still stopping the run; it is not left running (this takes a few seconds)")
        elif _state.during_stop == 1:
            _say(f"{_cause(name)}: still stopping every node; {_cause(name)} again leaves the nodes running")
        else:
            raise StopAbandoned
        return
    if _state.mode == "pulling":
        raise PullAbandoned
    raise KeyboardInterrupt


def _cause(name: str) -> str:
    return "Ctrl-C" if name == "SIGINT" else name


def catch_stop_signals() -> dict[int, Any]:
    """From now on SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt (recording which came), so that every one
    reaches the code that stops the run; returns the handlers they had. A signal ignored when ddpctl started
    stays ignored (`nohup ddpctl ...`: the user asked to outlive the terminal). Only the main thread can set
    handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {sig: signal.signal(sig, _handle) for sig in STOP_SIGNALS
                                if signal.getsignal(sig) is not signal.SIG_IGN}
    _state.installed = True
    _state.mode = "raise"
    _state.received.clear()
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    """Give the signals back the handlers `catch_stop_signals` returned."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if previous and all(h is not _handle for h in previous.values()):
        _state.installed = False


def defer_signals() -> None:
    """Until `act_on_deferred`, a stop signal is remembered, not raised: nodes being started are never left
    half-started by an interruption (the start is short: the stop follows once every node has started)."""
    catch_stop_signals()
    _state.pending = False
    _state.received.clear()
    if _state.installed:
        _state.mode = "defer"
        _state.defer_until = time.monotonic() + DEFER_LIMIT_SECONDS


def act_on_deferred() -> None:
    """Signals raise again; one that came while deferred raises KeyboardInterrupt now."""
    _state.mode = "raise"
    if _state.pending:
        _state.pending = False
        raise KeyboardInterrupt


def interrupted_by(exc: BaseException) -> bool:
    """Whether `exc` ended the run because of an interruption: Ctrl-C itself, or whatever a stop signal caused
    on its way (a write to the closed terminal after SIGHUP)."""
    return isinstance(exc, KeyboardInterrupt) or (bool(_state.received) and not isinstance(exc, DdpctlError))


def last_cause() -> str:
    """What interrupted the run, as the user knows it: Ctrl-C, SIGTERM or SIGHUP."""
    return _cause(_state.received[-1]) if _state.received else "Ctrl-C"


@dataclass
class Outcome:
    """How an interrupted or stopped run ended: `text` is the one line the user reads."""

    text: str
    stopped: bool  # every node is known to be stopped
    pulled: bool  # and what they wrote is in the run directory
    left_running: list[str] = field(default_factory=list)


def stop_and_pull(run_dir: RunDir, stop_nodes: Callable[[], None], pull: Callable[[], Any] | None,
                  cause: str | None = None, abandonable: bool = True) -> Outcome:
    """Stop every node, then pull (`pull` None: the nodes write into the run directory themselves); print what
    is being done, then the outcome, and record it. `cause` names a stop the launcher decided (e.g.
    --stall-timeout); None: an interruption, named by the signal that came."""
    reattach = f"reattach with `ddpctl status {run_dir.run_id}`, `ddpctl logs {run_dir.run_id}`, " \
               f"`ddpctl down {run_dir.run_id}`"
    signalled = cause is None
    said = f"interrupted by {last_cause()}: " if signalled else ""
    if signalled:
        run_dir.event("interrupted", reason=last_cause(), signals=list(_state.received))
    what = f"every node, then pulling what they wrote to {run_dir.path}" if pull else "torchrun and its workers"
    _say(f"{last_cause() if signalled else cause}: stopping {what}")
    _state.mode, _state.during_stop, _state.abandonable = "stopping", 0, abandonable
    try:
        try:
            stop_nodes()
        except StopAbandoned:
            run_dir.event("stop_abandoned")
            return _record(run_dir, Outcome(f"{said}left running: the stop was abandoned, so the nodes may still be "
                                            f"running; {reattach}", stopped=False, pulled=False))
        left = _not_stopped(run_dir)
        if pull is None:
            return _record(run_dir, Outcome(f"{said}stopped torchrun and its workers; what they wrote is in "
                                            f"{run_dir.path}", stopped=True, pulled=True))
        _state.mode = "pulling"
        try:
            pull()
            pull_error = ""
        except PullAbandoned:
            run_dir.event("pull_abandoned")
            pull_error = "the pull was interrupted"
        except DdpctlError as e:
            pull_error = "the pull failed (" + " ".join(str(e).split())[:300] + ")"
    finally:
        _state.mode = "raise" if _state.installed else _state.mode
    if left:
        return _record(run_dir, Outcome(
            f"{said}left running: could not stop {'; '.join(left)}; {reattach}; what the other nodes wrote is in "
            f"{run_dir.path}", stopped=False, pulled=not pull_error, left_running=left))
    if pull_error:
        return _record(run_dir, Outcome(f"{said}stopped every node; {pull_error}: `ddpctl pull {run_dir.run_id}` "
                                        f"fetches what they wrote into {run_dir.path}", stopped=True, pulled=False))
    from launcher.execute.pull_record import files_not_pulled

    missing = files_not_pulled(run_dir.path)
    note = f" ({missing} file(s) could not be pulled: see pull.json there)" if missing else ""
    return _record(run_dir, Outcome(f"{said}stopped every node and pulled what they wrote to {run_dir.path}{note}",
                                    stopped=True, pulled=True))


def pull_after_run(run_dir: RunDir, pull: Callable[[], Any]) -> None:
    """The pull at the end of a run: an interruption there ends it with a stated outcome (the nodes have ended)."""
    try:
        pull()
    except KeyboardInterrupt:
        text = (f"interrupted by {last_cause()}: the run had ended on every node; the pull was interrupted: "
                f"`ddpctl pull {run_dir.run_id}` fetches what they wrote into {run_dir.path}")
        run_dir.event("interrupted", reason=last_cause(), signals=list(_state.received))
        _record(run_dir, Outcome(text, stopped=True, pulled=False))
        from launcher.errors import Interrupted

        raise Interrupted(text) from None
    except HostsFailed as e:  # the nodes have ended: the training's outcome is known, only the copy is missing
        text = f"{_how_it_ended(run_dir)}, but the pull did not: {_pull_reasons(e)}; `ddpctl pull {run_dir.run_id}` " \
               f"fetches what the nodes wrote into {run_dir.path} once the host answers again"
        _record(run_dir, Outcome(text, stopped=True, pulled=False))
        raise DdpctlError(text) from None


def _how_it_ended(run_dir: RunDir) -> str:
    """What the `finished` event says of the nodes' exit statuses, as the first half of the pull's outcome."""
    finished = [e for e in run_dir.events() if e.get("event") == "finished"]
    codes = finished[-1].get("exit_codes") if finished else None
    if isinstance(codes, list) and codes and all(code == 0 for code in codes):
        return "the training finished on every node (exit status 0)"
    if isinstance(codes, list) and codes:
        return f"the run ended on every node (exit statuses {', '.join(str(c) for c in codes)})"
    return "the run ended on every node"


def _pull_reasons(error: HostsFailed) -> str:
    """The failing hosts' lines of a HostsFailed, on one line; a reason left empty (paramiko's "Server connection
    dropped: ") said in words."""
    lines = [" ".join(line.split()) for line in str(error).splitlines()[1:]] or [" ".join(str(error).split())]
    return "; ".join(line.replace("Server connection dropped:", "the SSH connection dropped (the host's sshd "
                                  "ended or the network failed)").rstrip(": ") for line in lines)[:600]


def _not_stopped(run_dir: RunDir) -> list[str]:
    """The nodes the last stop could not reach, with why (stop_all records them in its `stopped` event)."""
    stops = [e for e in run_dir.events() if e.get("event") == "stopped"]
    errors = stops[-1].get("errors") or {} if stops else {}
    return [f"{label} ({' '.join(str(why).split())[:200]})" for label, why in errors.items()]


def _record(run_dir: RunDir, outcome: Outcome) -> Outcome:
    run_dir.event(OUTCOME_EVENT, text=outcome.text, stopped=outcome.stopped, pulled=outcome.pulled,
                  left_running=outcome.left_running)
    return outcome


def recorded_outcome(run_dir_path: os.PathLike[str] | str, default: str) -> str:
    """The last outcome recorded in a run directory (what the user is told when `up` ends interrupted)."""
    from pathlib import Path

    from launcher.results.rundir import read_jsonl

    events = read_jsonl(Path(run_dir_path) / "events.jsonl")
    texts = [e.get("text") for e in events if e.get("event") == OUTCOME_EVENT]
    return str(texts[-1]) if texts and texts[-1] else default
