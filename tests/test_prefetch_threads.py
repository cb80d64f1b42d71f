"""paramiko's read-ahead thread failing as its connection closes (launcher/transport/prefetch_threads.py): its
traceback is dropped, since the copy that asked for the data says the same in its one line; any other thread's
failure is shown as before. A real one, Ctrl-C during a pull: tests/faults/test_interrupt_prompt.py."""

from __future__ import annotations

import sys
import threading
from types import TracebackType

import pytest

from launcher.transport.prefetch_threads import is_prefetch_failure, quiet_prefetch_failures

# A function of paramiko's name, in a file of paramiko's name: its traceback is what the prefetch thread's is.
PARAMIKO_LIKE = compile("def _prefetch_thread():\n    raise EOFError('closed')\n", "paramiko/sftp_file.py", "exec")


def failure_of(code: object, name: str) -> tuple[type[BaseException], BaseException, TracebackType | None]:
    space: dict[str, object] = {}
    exec(code, space)  # noqa: S102 - our own two lines above
    try:
        space[name]()  # type: ignore[operator]
    except BaseException:  # noqa: BLE001
        kind, value, tb = sys.exc_info()
        assert kind is not None and value is not None
        return kind, value, tb
    raise AssertionError("did not raise")


def test_the_prefetch_threads_failure_is_recognised_and_no_other() -> None:
    kind, _value, tb = failure_of(PARAMIKO_LIKE, "_prefetch_thread")
    assert is_prefetch_failure(kind, tb)
    other = compile("def _prefetch_thread():\n    raise EOFError('closed')\n", "mine.py", "exec")
    assert not is_prefetch_failure(*failure_of(other, "_prefetch_thread")[::2])
    assert not is_prefetch_failure(KeyboardInterrupt, tb)


def test_the_hook_drops_only_the_prefetch_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: shown.append(args.exc_type))
    monkeypatch.setattr("launcher.transport.prefetch_threads._done", [])
    quiet_prefetch_failures()
    quiet_prefetch_failures()  # once: not wrapped twice
    kind, value, tb = failure_of(PARAMIKO_LIKE, "_prefetch_thread")
    threading.excepthook(threading.ExceptHookArgs((kind, value, tb, None)))  # type: ignore[call-arg]
    threading.excepthook(threading.ExceptHookArgs((ValueError, ValueError("x"), None, None)))  # type: ignore[call-arg]
    assert shown == [ValueError]
