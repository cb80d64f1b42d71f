"""A terminal that closes under ddpctl (SIGHUP, then EIO on every write), and an interruption before anything
starts: the documented status (130), no traceback, the outcome in events.jsonl, nothing half-written.

No test bed: a local run of a user command, a host behind a ProxyCommand that never answers; the probe and the
ship on hosts are in tests/faults/test_fault_matrix.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.cli_runner import ddpctl_argv
from tests.faults.fault_support import Terminal, wait_for
from tests.testbed_fixtures import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
TICKS = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.2)\n"


def events(run: Path) -> list[dict[str, object]]:
    path = run / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def running(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.strip()


def test_closing_the_terminal_ends_logs_f_and_up_with_130_and_stops_the_run(tmp_path: Path) -> None:
    """`logs -f` then `up` itself, each in a terminal that is closed: both end with 130 (before: `logs -f` died
    of SIGHUP, `up` exited 1 when printing its last line failed); the run is stopped and says so in its events."""
    marker = f"ticks-{uuid.uuid4().hex[:12]}"
    script = tmp_path / "work" / f"{marker}.py"
    script.parent.mkdir()
    script.write_text(TICKS)
    runs = tmp_path / "runs"
    up_terminal = Terminal(tmp_path / "up.tty")
    in_workdir = ["sh", "-c", 'cd "$0" && exec "$@"', str(script.parent)]  # a user command runs from its directory
    up = up_terminal.start([*in_workdir, *ddpctl_argv("up", "--gpus", "1", "--runs-dir", str(runs), "--", "python3",
                                                      script.name)], ENV)
    try:
        run = wait_for("the run directory", lambda: next((p for p in runs.iterdir() if p.is_dir() and not
                                                          p.name.startswith(".")), None)  # not RunDir's staging
                       if runs.exists() else None, timeout=60)
        wait_for("the command to start", lambda: any(e["event"] == "started" for e in events(run)), timeout=60)

        logs_terminal = Terminal(tmp_path / "logs.tty")
        logs = logs_terminal.start(ddpctl_argv("logs", str(run), "--rank", "0", "-f"), ENV)
        wait_for("`logs -f` showing the output", lambda: "tick" in _text(tmp_path / "logs.tty"), timeout=60)
        logs_terminal.close()
        assert logs.wait(timeout=30) == 130, _text(tmp_path / "logs.tty")

        up_terminal.close()
        assert up.wait(timeout=60) == 130
    finally:
        if up.poll() is None:  # a failed check: stop the run as a user would, so no command outlives the test
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
    outcome = [e for e in events(run) if e["event"] == "outcome"][-1]
    assert str(outcome["text"]).startswith("interrupted by SIGHUP: stopped torchrun and its workers")
    assert outcome["stopped"] is True
    wait_for("the command to be gone", lambda: not running(marker), timeout=15)


def test_the_exit_status_survives_output_that_cannot_be_flushed(tmp_path: Path) -> None:
    """stdout on a pipe nobody reads: Python's flush at exit would make any status 120 (sys.exit(130) here exits
    120); exit_with keeps it."""
    code = textwrap.dedent("""
        from launcher.cli.exit_status import exit_with, say
        print("the summary table")
        say("error: interrupted by SIGHUP: stopped every node")
        exit_with(130)
    """)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        buffered = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}  # stdout keeps what it could not write
        result = subprocess.run([sys.executable, "-c", code], stdout=write_end, stderr=write_end, env=buffered,
                                timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 130


def test_sigterm_while_connecting_says_nothing_was_started_and_writes_nothing(tmp_path: Path) -> None:
    """A host behind a ProxyCommand that never answers: SIGTERM while connecting is one line, exit 130, no
    traceback (paramiko's own included), no run directory; the connect is cut short, not waited out (a 120 s
    --connect-timeout here; the process is given 60 s). Started as `nohup` starts it (SIGHUP ignored), a hang-up
    is ignored still."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host silent-host\n  ProxyCommand sleep 60\n")
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text("")
    runs = tmp_path / "runs"
    up = subprocess.Popen(ddpctl_argv("up", "--host", "silent-host", "-i", str(key), "--runs-dir", str(runs),
                                      "--connect-timeout", "120"),
                          env={**ENV, "HOME": str(home), "DDPCTL_KNOWN_HOSTS": str(known)},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        wait_for("the ProxyCommand", lambda: subprocess.run(["pgrep", "-P", str(up.pid), "-f", "sleep 60"],
                                                            capture_output=True).stdout, timeout=60, every=0.05)
        up.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            up.wait(timeout=1)  # still connecting: the hang-up was ignored, as nohup asked
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 130, err
    assert err.strip().splitlines() == ["error: interrupted by SIGTERM while connecting to the hosts: nothing was "
                                        "started on any host; no run directory was made"]
    assert not runs.exists() or not any(runs.iterdir())


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
