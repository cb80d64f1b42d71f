"""A run on this machine answers the same commands a run on hosts does: `status` measures its state and shows its
epoch while it trains, `logs` shows global rank 0's lines, `down` stops it (nothing of it is left, checked in
/proc), `up --detach` returns and the run outlives the terminal, `--stall-timeout` ends a run that stopped moving
with the line the host path prints. Real torchrun, real trainer or a real script, ddpctl as a process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_runner import ddpctl, ddpctl_argv, ddpctl_env
from tests.faults.fault_support import Terminal, rank_0_hangs_at, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ENV = ddpctl_env()
SMALL = ["--synthetic-train-size", "4096", "--synthetic-test-size", "256"]


def processes_of(place: Path) -> dict[int, str]:
    """Every process (but this one) whose command line or environment names `place`: the run's torchrun, its
    workers (the run's mark, DDPCTL_OUTPUT_DIR=RUN/out), a detached `up` following it. pid -> command line."""
    needle = os.fsencode(str(place))
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{name}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and (needle in cmdline or needle in environ):
            found[int(name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Path]:
    """A folder for the test's runs and scripts; whatever process of it is left when the test ends is killed (and
    fails the test, which must have ended it itself)."""
    yield tmp_path
    left = processes_of(tmp_path)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def the_run(runs: Path) -> Path:
    return wait_for("the run directory", lambda: next((p for p in runs.iterdir() if p.is_dir() and not
                                                       p.name.startswith(".")), None) if runs.exists() else None,
                    timeout=60)


def status_row(runs: Path) -> dict[str, object]:
    result = ddpctl("status", "--runs-dir", str(runs), "--json")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)["nodes"]
    return dict(row)


def rank0_stdout(run: Path) -> str:
    [log] = run.glob("logs/*/attempt_0/0/stdout.log")
    return log.read_text()


def test_status_of_a_training_local_run_shows_it_running_with_its_epoch_and_down_stops_it(place: Path) -> None:
    runs = place / "runs"
    # The lone rank stops at the first step of epoch 2 (1,024 samples: 32 steps an epoch), epoch 1's loss written:
    # the run stays running, without training, while status, logs and down are asked.
    up = subprocess.Popen(ddpctl_argv("up", "--gpus", "1", "--epochs", "500", "--runs-dir", str(runs),
                                      "--synthetic-train-size", "1024", "--synthetic-test-size", "256",
                                      *rank_0_hangs_at(33)),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        run = the_run(runs)
        row = wait_for("status showing a finished epoch",
                       lambda: (r := status_row(runs))["state"] == "running" and r["epoch"] and r["loss"] and r,
                       timeout=180, every=1.0)
        assert isinstance(row["epoch"], int) and 1 <= row["epoch"] < 500 and row["epochs"] == 500
        assert isinstance(row["loss"], float) and row["restarts"] == 0 and row["exit_code"] is None
        table = ddpctl("status", "--runs-dir", str(runs))
        assert table.returncode == 0 and "running" in table.stdout and "/500" in table.stdout, table.stdout

        logs = ddpctl("logs", "--runs-dir", str(runs), "-n", "1000")
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout in rank0_stdout(run)  # rank 0's own lines (the script test below shows them line by line)
        assert "no output yet" not in logs.stderr

        pid = json.loads((run / "run.json").read_text())["local_pid"]
        assert processes_of(run), "the run's processes are found by their marks while it trains"
        down = ddpctl("down", "--runs-dir", str(runs))
        assert down.returncode == 0, down.stderr
        assert down.stderr.startswith(f"stopped run {run.name} on this machine (")
        assert "none left" in down.stderr and "nothing to pull" in down.stderr
        assert processes_of(run) == {}, "nothing of the run is left once `down` returns"
        assert pid not in processes_of(place)

        _, err = up.communicate(timeout=60)
        assert up.returncode == 1
        assert err.strip().splitlines()[-1] == (f"error: run {run.name} was stopped by `ddpctl down` (from another "
                                                f"terminal); what it wrote is in {run}")
        assert status_row(runs)["state"] == "stopped"
        again = ddpctl("down", "--runs-dir", str(runs))
        assert again.returncode == 0 and "has ended: nothing to stop" in again.stderr
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


# Its last epoch waits for the file `go` (written once `logs -f` follows), so that -f has lines still to follow.
LINES = """\
import os, sys, time
rank = os.environ["RANK"]
for epoch in range(1, 31):
    while epoch == 30 and not os.path.exists("go"):
        time.sleep(0.1)
    print(f"rank {rank} epoch {epoch}/30 loss {1 / epoch:.4f}", flush=True)
    print(f"rank {rank} note {epoch}", file=sys.stderr, flush=True)
    time.sleep(0.2)
print(f"rank {rank} done", flush=True)
"""


def test_logs_of_a_local_run_show_rank_0s_lines_while_it_runs_and_follow_them_to_the_end(place: Path) -> None:
    (place / "lines.py").write_text(LINES)
    runs = place / "runs"
    up = subprocess.Popen(ddpctl_argv("up", "--gpus", "2", "--runs-dir", str(runs), "--", "python3", "lines.py"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=place,
                          start_new_session=True)
    try:
        run = the_run(runs)
        wait_for("rank 0's first lines", lambda: list(run.glob("logs/*/attempt_0/0/stdout.log")) and
                 "epoch 2/" in rank0_stdout(run), timeout=120)
        logs = ddpctl("logs", "--runs-dir", str(runs), "-n", "2")
        assert logs.returncode == 0, logs.stderr
        shown = logs.stdout.splitlines()
        assert len(shown) == 2 and all(line.startswith("rank 0 epoch ") for line in shown), logs.stdout
        assert "rank 0 note" in logs.stderr and "rank 1" not in logs.stdout + logs.stderr  # its stderr on stderr

        follow = subprocess.Popen(ddpctl_argv("logs", "--runs-dir", str(runs), "-f", "-n", "1"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        assert follow.stdout is not None
        first = follow.stdout.readline()  # the end so far (the script waits before epoch 30)
        (place / "go").write_text("")
        rest, err = follow.communicate(timeout=60)
        assert follow.returncode == 0, err
        followed = (first + rest).splitlines()
        assert followed[-1] == "rank 0 done" and "rank 0 epoch 30/30 loss 0.0333" in followed
        assert all(line.startswith("rank 0 ") for line in followed)
        up.communicate(timeout=60)
        assert up.returncode == 0
        after = ddpctl("logs", "--runs-dir", str(runs), "-n", "2")
        assert after.stdout == "rank 0 epoch 30/30 loss 0.0333\nrank 0 done\n"
        assert status_row(runs)["state"] == "finished"
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


def test_a_detached_local_run_outlives_the_terminal_it_was_started_from_and_finishes(place: Path) -> None:
    runs = place / "runs"
    terminal = Terminal(place / "up.tty")
    # The terminal's shell: `up --detach`, then the shell waits on, as an interactive one does, until it is closed.
    # 10 epochs of 32 steps, each step followed by a 10 ms pause: the run lasts as long as 10 epochs of 4,096
    # samples did (a few seconds, past the terminal's closing), but mostly sleeps.
    shell = terminal.start(["sh", "-c", '"$@"; echo "up exited $?"; exec sleep 600', "sh",
                            *ddpctl_argv("up", "--detach", "--gpus", "1", "--epochs", "10", "--runs-dir", str(runs),
                                         "--synthetic-train-size", "1024", "--synthetic-test-size", "256",
                                         "--trainer-arg=--step-pause=0.01")], ENV)
    try:
        said = wait_for("`up --detach` to return", lambda: "up exited" in (t := (place / "up.tty").read_text())
                        and t, timeout=120)
        run = the_run(runs)
        assert "up exited 0" in said and f"started run {run.name} on this machine" in said
        for command in (f"status {run.name}", f"logs {run.name} -f", f"down {run.name}"):
            assert f"`ddpctl {command}`" in " ".join(said.split()), said
        assert not any(e["event"] == "exited" for e in events(run)), "up returned before the run ended"
        terminal.close()  # the terminal window closes: its session is hung up
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
        assert status_row(runs)["state"] in ("running", "finished")
        # Its torchrun gone and its summary written, the run reads "finished" a moment before its follower records
        # the exit status: wait for that too.
        row = wait_for("the detached run to finish", lambda: (r := status_row(runs))["state"] != "running"
                       and r["exit_code"] is not None and r, timeout=300, every=1.0)
        assert row["state"] == "finished" and row["exit_code"] == 0 and row["epoch"] == 10
        summary = json.loads((run / "summary.json").read_text())
        assert summary["epochs"] == 10 and summary["world_size"] == 1
        wait_for("the detached follower to end", lambda: not processes_of(place), timeout=30)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()


def events(run: Path) -> list[dict[str, object]]:
    path = run / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


HANGS = """\
import time
print("epoch 1 step 1 loss 0.5", flush=True)  # one training step, then nothing more (a hung collective)
time.sleep(600)
"""


def test_stall_timeout_ends_a_hanging_local_script_with_the_hosts_stall_line(place: Path) -> None:
    (place / "hangs.py").write_text(HANGS)
    runs = place / "runs"
    started = time.monotonic()
    up = ddpctl("up", "--gpus", "2", "--stall-timeout", "4", "--runs-dir", str(runs), "--", "python3", "hangs.py",
                cwd=place, timeout=180)
    assert up.returncode == 1, up.stderr
    run = the_run(runs)
    line = up.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --stall-timeout: no training step for 4 s (a hung collective or data loader): "
                           "ranks 0, 1 are elsewhere, at hangs.py:"), line  # where every rank was, as on hosts
    assert f"; see `ddpctl logs {run.name}`; stopped torchrun and its workers" in line, line
    assert time.monotonic() - started < 120
    kinds = [e["event"] for e in events(run)]
    assert "stop_requested" in kinds and kinds[-1] == "stopped"
    assert processes_of(place) == {}
    assert status_row(runs)["state"] == "stopped"
    assert json.loads((run / "workdir.json").read_text())["workdir"] == str(place.resolve())  # still told


def test_down_stops_a_detached_local_run_and_its_follower_records_it(place: Path) -> None:
    (place / "hangs.py").write_text(HANGS)
    runs = place / "runs"
    up = ddpctl("up", "--detach", "--gpus", "2", "--runs-dir", str(runs), "--", "python3", "hangs.py", cwd=place)
    assert up.returncode == 0, up.stderr
    run = the_run(runs)
    wait_for("the script's line", lambda: list(run.glob("logs/*/attempt_0/0/stdout.log")) and
             "loss 0.5" in rank0_stdout(run), timeout=120)
    assert status_row(runs)["state"] == "running" and processes_of(run)
    down = ddpctl("down", str(run))
    assert down.returncode == 0 and "none left" in down.stderr, down.stderr
    assert processes_of(run) == {}
    wait_for("the follower to end", lambda: not processes_of(place), timeout=30)
    said = (run / "detached.out").read_text().strip().splitlines()[-1]
    assert said == (f"error: run {run.name} was stopped by `ddpctl down` (from another terminal); what it wrote "
                    f"is in {run}")
    assert status_row(runs)["state"] == "stopped"
