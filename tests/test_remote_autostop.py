"""The node's side of Vast.ai autostop (launcher/remote/autostop_watchdog.py) and its address listing
(launcher/remote/interface_addresses.py), run here in process on temporary folders standing in for a node's
workspace, against a stand-in for the API's answers; the watchdog's state report (autostop_state.sh) run as a node
runs it; what the launcher sends is the files' text."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from launcher.places.vast import autostop, overlay, watchdog_state
from launcher.remote import autostop_watchdog, daemon, interface_addresses, shell_text, source_of

SECRET = "vck-0123456789abcdef"


def test_what_the_launcher_sends_is_the_modules_text() -> None:
    assert source_of(autostop_watchdog) == autostop.CONTAINER_KEY_PROBE
    assert source_of(daemon) + source_of(autostop_watchdog) == autostop.WATCHDOG
    assert source_of(interface_addresses) == overlay.ADDRESSES_PY
    assert watchdog_state.watchdog_command(".ddpctl/runs/r1") == [
        "sh", "-c", shell_text("autostop_state.sh"), "ddpctl-autostop", ".ddpctl/runs/r1"]


def environ_file(path: Path, **variables: str) -> str:
    path.write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in variables.items()))
    return str(path)


def test_the_container_key_is_found_in_the_environment_or_process_1s(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTAINER_API_KEY", raising=False)
    first = environ_file(tmp_path / "environ", PATH="/usr/bin", CONTAINER_API_KEY=f" {SECRET}\n")
    assert autostop_watchdog.key_location(first) == "process 1"
    assert autostop_watchdog.key_in_environ_file(first) == SECRET
    empty = environ_file(tmp_path / "empty", CONTAINER_API_KEY=" ")
    assert autostop_watchdog.key_location(empty) == "absent"
    assert autostop_watchdog.key_location(str(tmp_path / "unreadable")) == "absent"
    monkeypatch.setenv("CONTAINER_API_KEY", SECRET)
    assert autostop_watchdog.key_location(empty) == "environment"


def test_where_prints_only_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CONTAINER_API_KEY", raising=False)
    assert autostop_watchdog.main(["where", environ_file(tmp_path / "e", CONTAINER_API_KEY=SECRET)]) == 0
    assert capsys.readouterr() == ("process 1\n", "")


class Api:
    """Answers the stop request with the statuses given, in turn (None: the stop is accepted; "down": no answer)."""

    def __init__(self, *answers: int | str | None) -> None:
        self.answers, self.requests = list(answers), list[Any]()

    def __call__(self, request: Any, timeout: float) -> io.BytesIO:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if answer == "down":
            raise urllib.error.URLError("connection refused")
        if isinstance(answer, int):
            raise urllib.error.HTTPError(request.full_url, answer, "no", {}, None)  # type: ignore[arg-type]
        return io.BytesIO(b"{}")


class Clock:
    """Time that passes only when the watchdog sleeps."""

    def __init__(self) -> None:
        self.now, self.slept = time.time(), list[float]()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def run_watchdog(workspace: Path, api: Api, clock: Clock, *extra: str) -> tuple[int, dict[str, Any], list[str]]:
    answered: list[str] = []
    code = autostop_watchdog.watch([str(workspace), "https://api.example/", "41", "60", "10", *extra],
                                   answered.append, clock, clock.sleep, api)
    return code, json.loads((workspace / ".autostop" / "state.json").read_text()), answered


def test_the_watchdog_waits_for_training_to_end_and_the_idle_time_then_stops_with_the_container_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTAINER_API_KEY", SECRET)
    ws, clock = tmp_path / "ws", Clock()
    ws.mkdir()
    api = Api(None)

    def sleep(seconds: float) -> None:  # training ends after the first poll; the exit code is 0 s old then
        Clock.sleep(clock, seconds)
        if not (ws / "exit_code").exists():
            (ws / "exit_code").write_text("0\n")
            os.utime(ws / "exit_code", (clock.now, clock.now))

    clock.sleep = sleep  # type: ignore[method-assign]
    code, state, answered = run_watchdog(ws, api, clock, "container", "/nonexistent")
    assert code == 0 and answered == ["watching"] and state["state"] == "stopped" and state["pid"] == os.getpid()
    assert clock.slept == [10.0] * 7  # training ended at the 1st poll, idle 60 s by the 7th
    (request,) = api.requests
    assert (request.full_url, request.method, request.data) == (
        "https://api.example/api/v0/instances/41/", "PUT", b'{"state": "stopped"}')
    assert request.get_header("Authorization") == f"Bearer {SECRET}"
    assert oct((ws / ".autostop").stat().st_mode & 0o777) == "0o700"


def test_a_pull_counts_the_idle_time_anew(tmp_path: Path) -> None:
    ws, clock = tmp_path / "ws", Clock()
    (ws / ".autostop").mkdir(parents=True)
    (ws / "exit_code").write_text("0\n")
    os.utime(ws / "exit_code", (clock.now - 3600, clock.now - 3600))
    (ws / ".autostop" / "pulled").write_text("")
    os.utime(ws / ".autostop" / "pulled", (clock.now - 30, clock.now - 30))
    assert autostop_watchdog.idle_seconds(str(ws), clock.now) == pytest.approx(30)
    assert autostop_watchdog.idle_seconds(str(tmp_path / "training"), clock.now) is None


@pytest.mark.parametrize(("answers", "error", "code", "pauses"), [
    ((429, 503, None), None, 0, [1.0, 2.0]),  # what may pass is retried, after a growing pause
    ((403,), "HTTP 403", 1, []),  # a refusal is final
    (("down",) * 12, "no answer from the API", 0, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0] + [60.0] * 6),
])
def test_the_stop_is_retried_or_its_refusal_recorded(tmp_path: Path, answers: tuple[Any, ...], error: str | None,
                                                     code: int, pauses: list[float]) -> None:
    ws, clock = tmp_path / "ws", Clock()
    (ws / ".autostop").mkdir(parents=True)
    (ws / ".autostop" / "key").write_text(SECRET + "\n")
    (ws / "exit_code").write_text("0\n")
    os.utime(ws / "exit_code", (clock.now - 600, clock.now - 600))
    api = Api(*answers)
    got, state, _ = run_watchdog(ws, api, clock)  # no source given: the scoped key file
    assert got == code and state["state"] == ("stopped" if error is None else "failed") and state.get("error") == error
    assert len(api.requests) == len(answers) and api.requests[0].get_header("Authorization") == f"Bearer {SECRET}"
    assert clock.slept[1:] == pauses  # after the one poll that found the machine idle


def test_a_container_key_gone_by_then_is_recorded_as_the_failure(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTAINER_API_KEY", raising=False)
    ws, clock = tmp_path / "ws", Clock()
    ws.mkdir()
    (ws / "exit_code").write_text("0\n")
    os.utime(ws / "exit_code", (clock.now - 600, clock.now - 600))
    code, state, _ = run_watchdog(ws, Api(), clock, "container", environ_file(tmp_path / "e", PATH="/bin"))
    assert code == 1 and state["state"] == "failed" and state["error"] == "CONTAINER_API_KEY is gone from the instance"


def test_anything_else_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert autostop_watchdog.main(["watch", "ws", "url", "1", "60", "10"]) == 2  # watch needs daemon.py's detach
    assert autostop_watchdog.main(["stop"]) == 2 and autostop_watchdog.main(["state", "ws"]) == 2
    assert capsys.readouterr().err.startswith("usage: where ENVIRON_FILE | watch ")


def test_the_address_listing_names_this_machines_loopback() -> None:
    listed = interface_addresses.ipv4_addresses()
    assert ["lo", "127.0.0.1"] in listed
    assert {name for name, _ in listed} <= {name for _, name in socket.if_nameindex()}


@pytest.mark.integration
def test_the_state_script_run_as_the_node_runs_it_tells_a_live_watchdog_from_a_reused_pid(tmp_path: Path) -> None:
    """launcher/remote/autostop_state.sh beside a real process whose arguments hold the workspace (the watchdog's
    place), then one whose arguments do not (the pid reused), then none."""
    ws = tmp_path / "ws"
    argv = watchdog_state.watchdog_command(str(ws))
    assert subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout == ""  # no record
    (ws / ".autostop").mkdir(parents=True)
    labels = []
    for arguments in ([str(ws)], [str(ws) + "-other"]):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *arguments])
        try:
            (ws / ".autostop" / "state.json").write_text(json.dumps({"state": "watching", "pid": process.pid}))
            shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
            labels.append(watchdog_state.parse_watchdog(shown).label)
        finally:
            process.kill()
            process.wait()
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    labels.append(watchdog_state.parse_watchdog(shown).label)
    assert labels == ["watching", "not running (its process ended)", "not running (its process ended)"]
