"""The login node's session opened in a thread of its own while `up --provider slurm` imports the rest
(launcher/places/slurm/login_session.py): it is the session HostSession.open gives, or its error as it raised it,
handed over once, and a session nobody takes is closed, also one that finishes opening after it was abandoned."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from launcher.errors import HostError
from launcher.places.slurm import login_session
from launcher.places.slurm.login_session import LoginSession


class Opened:
    """What HostSession.open returned, counting its closes."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def opening(monkeypatch: pytest.MonkeyPatch, result: Any, gate: threading.Event | None = None) -> list[dict[str, Any]]:
    """HostSession.open answering `result` (raised when an exception) once `gate` is set; its calls' keywords."""
    calls: list[dict[str, Any]] = []

    def open_(options: object, **kwargs: Any) -> Any:
        calls.append(kwargs)
        if gate is not None:
            gate.wait(10)
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(login_session.HostSession, "open", open_)
    return calls


def test_the_session_is_handed_over_once_and_then_the_callers_to_close(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = Opened()
    calls = opening(monkeypatch, opened)
    login = LoginSession(object())  # type: ignore[arg-type]
    assert login.session() is opened
    assert calls == [{"sftp": False}]  # SFTP opens beside the probe
    login.abandon()
    assert opened.closed == 0
    with pytest.raises(RuntimeError):
        login.session()


def test_an_error_opening_it_is_raised_as_opening_it_inline_raised_it(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = HostError("login", "authentication as u failed")
    opening(monkeypatch, refused)
    with pytest.raises(HostError) as raised:
        LoginSession(object()).session()  # type: ignore[arg-type]
    assert raised.value is refused


def test_a_session_abandoned_while_it_opens_is_closed_when_it_has_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    opened, gate = Opened(), threading.Event()
    opening(monkeypatch, opened, gate)
    login = LoginSession(object())  # type: ignore[arg-type]
    login.abandon()
    assert opened.closed == 0
    gate.set()
    login._thread.join(10)
    assert opened.closed == 1
