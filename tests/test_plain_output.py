"""`up` and `sweep` with their output going to a file (`> run.log 2>&1`, nohup, CI): time-stamped plain lines
appear while the run goes, never a control sequence; failures, restarts and interruptions are told; the final
table is the terminal's. In a terminal (a pty) the live display is unchanged. Local runs, a few seconds each."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.fault_support import Terminal, wait_for
from tests.plain_lines import STAMPED_LINE, unstamped
from tests.testbed_fixtures import REPO

pytestmark = pytest.mark.integration  # local runs, no test bed
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# One rank of one thread: what these tests read is the launcher's output, which the rank count does not change; a
# lone rank's default of one thread per core would spin on a busy machine (a 3-epoch run: 56 s of CPU against 8.5).
ONE_RANK = ["--gpus", "1", "--threads-per-process", "1"]
SMALL = ["--synthetic-train-size", "1024", "--synthetic-test-size", "128", *ONE_RANK]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # ESC and carriage return among them

# Rank 0 prints a burst bigger than the tail's rate allows, colours and a \r-redrawn counter; rank 1 fails in
# both attempts (one restart), after rank 0 has printed.
SCRIPT = """\
import os, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
if rank == 0:
    print(f"attempt {attempt} \\x1b[31mred\\x1b[0m", flush=True)
    print("counter 1%\\r50%\\r100%", flush=True)
    for i in range(120):
        print(f"burst {attempt} {i}", flush=True)
    print(f"waiting {attempt}", flush=True)
    time.sleep(60)
time.sleep(4)
raise ValueError(f"attempt {attempt} fails on purpose")
"""


def start(log: Path, *args: str, cwd: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=ENV, cwd=cwd)


def text_of(log: Path) -> str:
    return log.read_bytes().decode(errors="replace")


def wait_in_log(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    """Until `pattern` is in the log; it must come while the command still runs."""
    wait_for(f"{pattern!r} in {log.name}", lambda: re.search(pattern, text_of(log)) or proc.poll() is not None,
             timeout=timeout)
    assert re.search(pattern, text_of(log)) and proc.poll() is None, f"not while running:\n{text_of(log)[-3000:]}"


def check_plain(text: str) -> None:
    """No control sequence; every line stamped up to the run's end (what follows: the final table, the error)."""
    assert not CONTROL.search(text.replace("\n", "")), repr(text[-2000:])
    lines = text.splitlines()
    ends = [i for i, line in enumerate(lines) if re.search(r"node 0: (torchrun exited|stopped)", line)]
    assert ends, text
    unstamped_lines = [line for line in lines[:ends[-1] + 1] if not STAMPED_LINE.match(line)]
    assert not unstamped_lines, text


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_up_to_a_file_tells_the_run_as_it_goes_and_is_interrupted_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    # Epochs of over a second, several times the 0.5 s poll: each one's end is seen (an epoch shorter than a poll
    # is told with the next one seen, as a terminal's display skips it too). 32 steps of 1,024 samples, each
    # followed by a 30 ms pause: the epochs last that long on any machine while the rank mostly sleeps.
    up = start(log, "up", "--epochs", "30", *SMALL, "--trainer-arg=--step-pause=0.03", "--runs-dir",
               str(tmp_path / "runs"), cwd=tmp_path)
    try:
        wait_in_log(log, r"node 0: torchrun started", up, timeout=60)
        wait_in_log(log, r"node 0 \(local\): epoch 1/30 ended, [\d,]+ samples/s", up)
        wait_in_log(log, r"node 0 \(local\): epoch (?:[2-9]|[12]\d)/30 ended, [\d,]+ samples/s", up)
        up.send_signal(signal.SIGINT)  # Ctrl-C
        assert up.wait(timeout=90) == 130
    finally:
        stop(up)
    text = text_of(log)
    check_plain(text)
    lines = unstamped(text)
    assert "interrupted: Ctrl-C" in lines and "node 0: stopped" in lines, text
    assert "outcome: interrupted by Ctrl-C: stopped torchrun and its workers" in lines, text
    assert text.splitlines()[-1].startswith("error: interrupted by Ctrl-C"), text
    # The epoch lines say what timing.jsonl measured.
    (run,) = (tmp_path / "runs").iterdir()
    first = (run / "timing.jsonl").read_text().splitlines()[0]
    rate = float(re.search(r'"samples_per_s": ([\d.]+)', first).group(1))  # type: ignore[union-attr]
    assert f"epoch 1/30 ended, {rate:,.0f} samples/s" in lines


def test_up_to_a_file_shows_rank_0_restarts_and_the_failure_at_a_sane_rate(tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(SCRIPT)
    log = tmp_path / "run.log"
    up = start(log, "up", "--gpus", "2", "--max-restarts", "1", "--runs-dir", str(tmp_path / "runs"), "--",
               "python", "failing.py", cwd=tmp_path)
    try:
        wait_in_log(log, r"rank 0: attempt 0 red\n.*rank 0: 100%", up, timeout=90)
        wait_in_log(log, r"torchrun restarted the workers \(attempt 1\)", up, timeout=90)
        code = up.wait(timeout=180)
    finally:
        stop(up)
    text = text_of(log)
    check_plain(text)
    lines = unstamped(text)
    assert code == 1, text
    assert "rank 0 (1 restart): attempt 1 red\nrank 0 (1 restart): 100%" in lines
    # The burst came faster than the tail's rate: some lines held back and counted, never all shown.
    shown = len(re.findall(r"rank 0.*: burst 0 \d+$", lines, re.M))
    assert 0 < shown < 120, text
    assert re.search(r"\(\d+ line\(s\) of rank 0's output not shown here", lines), text
    assert "node 0 (local): failed" in lines
    assert not re.search(r"^node 0: failed \(exit status", lines, re.M), text  # once is enough: the state line
    assert "│ restarts" in text and "│ 1" in text  # the summary table, as on a terminal
    assert re.search(r"^error: training failed: rank 1 .*ValueError: attempt 1 fails on purpose", text, re.M), text


def test_sweep_to_a_file_tells_each_run_as_it_goes(tmp_path: Path) -> None:
    log = tmp_path / "sweep.log"
    # Epochs of about a second on an idle 2-core machine (4,096 samples): each is seen while the sweep runs on.
    # One thread per rank: the 1x1 run's default of two spun on a busy machine (this test: 58 s of CPU, 23 s with one).
    sweep = start(log, "sweep", "--gpus", "1,2", "--threads-per-process", "1", "--epochs", "3",
                  "--synthetic-train-size", "4096", "--synthetic-test-size", "128",
                  "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    try:
        wait_in_log(log, r"ddp: layout 1x1 .*: run ", sweep, timeout=60)
        wait_in_log(log, r"node 0 \(local\): epoch [12]/3 ended", sweep)
        wait_in_log(log, r"ddp: layout 1x2 .*: run ", sweep)
        assert sweep.wait(timeout=300) == 0, text_of(log)
    finally:
        stop(sweep)
    text = text_of(log)
    check_plain(text)
    lines = unstamped(text)
    assert lines.count("epoch 3/3 ended") == 2, text
    assert "report: " in text and "samples/s" in text


def test_up_in_a_terminal_keeps_the_live_display(tmp_path: Path) -> None:
    terminal = Terminal(tmp_path / "up.tty")
    up = terminal.start([sys.executable, "-m", "launcher", "up", "--epochs", "2", *SMALL, "--runs-dir",
                         str(tmp_path / "runs")], {**ENV, "COLUMNS": "120"}, term="xterm")
    try:
        assert up.wait(timeout=180) == 0
    finally:
        stop(up)
        time.sleep(0.5)
        terminal.close()
    shown = (tmp_path / "up.tty").read_bytes().decode(errors="replace")
    assert "\x1b[" in shown and "\r" in shown  # redrawn in place
    assert "epoch 2/2 step" in shown and "validation accuracy" in shown
    assert not STAMPED_LINE.search(shown) and "epoch 1/2 ended" not in shown


def test_up_in_a_dumb_terminal_prints_plain_lines_as_it_goes(tmp_path: Path) -> None:
    """TERM=dumb (an editor's shell, a CI runner's pseudo-terminal): no redrawing, so the lines of a log file,
    while the run goes, not one table at the end."""
    terminal = Terminal(tmp_path / "up.tty")
    up = terminal.start([sys.executable, "-m", "launcher", "up", "--epochs", "30", *SMALL, "--runs-dir",
                         str(tmp_path / "runs")], {**ENV, "COLUMNS": "120"}, term="dumb")
    try:
        wait_in_log(tmp_path / "up.tty", r"node 0 \(local\): epoch \d+/30 ended", up)
        assert up.poll() is None  # told while it runs
    finally:
        stop(up)
        time.sleep(0.5)
        terminal.close()
    shown = (tmp_path / "up.tty").read_bytes().decode(errors="replace")
    assert "\x1b[" not in shown and STAMPED_LINE.search(shown)
