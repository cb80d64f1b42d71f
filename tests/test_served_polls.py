"""A followed run's state polls go to one node program per host, kept running (`node_state.py --serve`,
launcher/runtimes/served_polls.py): its request loop in-process (unit), and the program as a host runs it, `python
-I -S -c AHEAD_LOADER --serve` through a shell with its requests on standard input (integration): one process for
many polls, the same answers a one-shot poll gives, a replacement within the poll when it has ended, and no
process left once the polls are done or the launcher has gone."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import shlex
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from launcher.errors import HostError
from launcher.remote import node_state
from launcher.remote.program import AHEAD_LOADER, ahead_of_input
from launcher.runtimes.native import OutputRequest, node_program, read_state
from launcher.runtimes.served_polls import ServedPolls
from launcher.transport.ssh import CommandResult


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "logs" / "r" / "attempt_0" / "0").mkdir(parents=True)
    (ws / "out").mkdir()
    (ws / "logs" / "r" / "attempt_0" / "0" / "stdout.log").write_text("epoch 1\n")
    (ws / "pid").write_text(f"{os.getpid()}\n")
    return ws


def test_the_request_loop_answers_each_line_until_its_input_ends(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    requests = io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in (
        {"workspace": str(ws), "output": {"local_rank": 0, "attempt": None, "offset": 0}},
        {"workspace": str(tmp_path / "deleted")},
    )) + b"not json\n" + b"[1]\n")
    answers = io.StringIO()
    assert node_state.serve(requests, answers, idle_seconds=60) == 0
    lines = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert len(lines) == 4
    assert lines[0]["pid"] == os.getpid() and lines[0]["alive"] and lines[0]["output"] == "epoch 1\n"
    assert lines[1] == {"gone": True, "now": lines[1]["now"]}
    assert lines[2]["error"].startswith("JSONDecodeError") and lines[3] == {"error": "a request is a JSON object"}


def test_the_program_ahead_of_input_reads_back_as_sent() -> None:
    loader, first = ahead_of_input(node_program())
    assert loader == ["-c", AHEAD_LOADER]
    length, _, packed = first.partition(b"\n")
    assert int(length) == len(packed) and zlib.decompress(packed).decode() == node_program()


class _Channel:
    """A paramiko channel's surface over a local process's pipes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._timeout: float | None = None
        self._stderr_read = False

    def settimeout(self, seconds: float | None) -> None:
        self._timeout = seconds

    def sendall(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self._timeout)
        if not ready:
            raise TimeoutError("timed out")
        return os.read(self.proc.stdout.fileno(), size)

    def recv_stderr_ready(self) -> bool:
        """Once: after the process has ended (its output ended first)."""
        if self._stderr_read:
            return False
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return True

    def recv_stderr(self, size: int) -> bytes:
        assert self.proc.stderr is not None
        self._stderr_read = True
        return self.proc.stderr.read(size)

    def close(self) -> None:
        """As a channel's close: never raises (the process may have gone)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


class Here:
    """A host connection on this machine, as sshd runs a command: through a shell, an isolated python (it cannot
    import launcher: the program carries what it needs). Counts the programs it starts and runs."""

    label = "here"

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.runs = 0

    def open_channel_command(self, argv: list[str]) -> _Channel:
        argv = [argv[0], "-I", *argv[1:]]
        proc = subprocess.Popen(["sh", "-c", "exec " + shlex.join(argv)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started.append(proc)
        return _Channel(proc)

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        self.runs += 1
        done = subprocess.run(["sh", "-c", "exec " + shlex.join([argv[0], "-I", *argv[1:]])], input=stdin or b"",
                              capture_output=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout.decode(), done.stderr.decode())


def _ended(proc: subprocess.Popen[bytes], within: float = 10) -> bool:
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    return True


@pytest.mark.integration
def test_many_polls_one_program_the_same_answers_and_it_ends_with_the_polls(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    log = ws / "logs" / "r" / "attempt_0" / "0" / "stdout.log"
    conn = Here()
    with contextlib.closing(ServedPolls(sys.executable)) as served:
        first = served.read_state(0, conn, str(ws), OutputRequest(0))
        with log.open("a") as f:
            f.write("step 7\n")
        second = served.read_state(0, conn, str(ws), OutputRequest(0, attempt=0, offset=first.output_to or 0))
        (ws / "exit_code").write_text("0\n")
        third = served.read_state(0, conn, str(ws))
        assert len(conn.started) == 1, "one program for every poll"
        one_shot = read_state(conn, str(ws), python=sys.executable)
    assert (first.pid, first.alive, first.output) == (os.getpid(), True, "epoch 1\n")
    assert (second.output, second.output_from) == ("step 7\n", len("epoch 1\n"))
    assert third.exit_code == 0 and third.exit_time is not None
    assert {k: v for k, v in vars(third).items() if k not in ("answered_at", "exit_time", "disk_free")} == \
        {k: v for k, v in vars(one_shot).items() if k not in ("answered_at", "exit_time", "disk_free")}
    assert _ended(conn.started[0]), "the served program outlived its polls"
    assert conn.started[0].returncode == 0


@pytest.mark.integration
def test_a_program_that_ended_is_replaced_within_the_same_poll(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    conn = Here()
    with contextlib.closing(ServedPolls(sys.executable)) as served:
        assert served.read_state(0, conn, str(ws)).alive
        conn.started[0].kill()  # as the host's idle limit, or a connection made anew, would end it
        conn.started[0].wait()
        assert served.read_state(0, conn, str(ws)).alive
        assert len(conn.started) == 2
    assert _ended(conn.started[1])


@pytest.mark.integration
def test_a_program_that_cannot_run_fails_the_poll_with_its_error(tmp_path: Path) -> None:
    conn = Here()
    served = ServedPolls("/nonexistent/python3")
    with pytest.raises(HostError, match=r"here: the node program could not run with /nonexistent/python3: .*not"):
        served.read_state(0, conn, str(tmp_path))
    assert _ended(conn.started[0])


@pytest.mark.integration
def test_a_served_program_nobody_asks_ends_by_itself(tmp_path: Path) -> None:
    """Its launcher may vanish without the host's sshd noticing: after IDLE_SECONDS without a request it ends."""
    loader, first = ahead_of_input(node_program())
    proc = subprocess.Popen([sys.executable, "-I", "-S", *loader, "--serve", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(first + json.dumps({"workspace": str(tmp_path / "none")}).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["gone"] is True
    started = time.monotonic()
    assert _ended(proc, within=20), "still waiting for a request"
    assert time.monotonic() - started < 10 and proc.stdin is not None
    proc.stdin.close()
