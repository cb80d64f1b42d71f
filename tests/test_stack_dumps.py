"""Stacks taken from real processes on this machine: the join hook and the trainer register the same record; the
node program (launcher/remote/rank_stacks.py) signals only a process that registered and catches the signal;
`ddpctl stacks RUN` on a live local `-- CMD` run names where each rank is, and a stalled one's --stall-timeout takes
them again before its stop (one run of the collective case for both: the stall test)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher.remote import rank_stacks
from tests.testbed_fixtures import REPO

pytestmark = pytest.mark.integration

HOOK = REPO / "launcher" / "runtimes" / "join_hook.py"
CASES = REPO / "tests" / "data" / "stacks" / "hang_cases.py"
SLEEPER = "import time\ndef wait_here():\n    time.sleep(600)\nwait_here()\n"


def _wait_for(predicate: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _start_hooked(workspace: Path, rank: int, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A plain Python process that the join hook registers at start, as a torchrun worker (RANK set)."""
    hook = workspace / "hook"
    hook.mkdir(exist_ok=True)
    shutil.copy(HOOK, hook / "sitecustomize.py")
    (workspace / "sleeper.py").write_text(SLEEPER)
    env = {**os.environ, "PYTHONPATH": str(hook), "DDPCTL_JOIN_DIR": str(workspace / "logs" / "joined"),
           "RANK": str(rank), "WORLD_SIZE": "2"}
    env.pop("DDPCTL_STACKS_PID", None)
    proc = subprocess.Popen([sys.executable, str(workspace / "sleeper.py")], env=env)
    started.append(proc)
    return proc


def test_the_hook_and_the_trainer_register_the_same_record_and_both_dump(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    hooked = _start_hooked(tmp_path, 0, processes)
    trainer_side = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); from pathlib import Path\n"
                    f"from trainer import stack_dumps\nstack_dumps.register(1, 2, Path({str(tmp_path)!r}))\n"
                    + SLEEPER)
    env = {k: v for k, v in os.environ.items() if k != "DDPCTL_JOIN_DIR"}
    processes.append(subprocess.Popen([sys.executable, "-c", trainer_side], env=env))
    stacks = tmp_path / "logs" / "stacks"
    _wait_for(lambda: (stacks / "rank-0.json").exists() and (stacks / "rank-1.json").exists(), 60, "both records")
    records = [json.loads((stacks / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert sorted(records[0]) == sorted(records[1]) == ["dump", "pid", "rank", "signal", "start", "time",
                                                        "world_size"]
    assert records[0]["signal"] == records[1]["signal"] == signal.SIGRTMIN + 5
    assert records[0]["pid"] == hooked.pid and records[1]["pid"] == processes[1].pid
    answers: list[dict[str, Any]] = []

    def both_wait_here() -> bool:  # registered before their last lines ran: on a loaded machine, ask again
        answers.append(rank_stacks.take(str(tmp_path)))
        return all("in wait_here" in entry.get("dump", "") for entry in answers[-1]["ranks"])

    _wait_for(both_wait_here, 60, "both processes dumped in wait_here")
    assert [(r["rank"], r["state"]) for r in answers[-1]["ranks"]] == [(0, "dumped"), (1, "dumped")]
    assert all([(r["rank"], r["state"]) for r in a["ranks"]] == [(0, "dumped"), (1, "dumped")] for a in answers)
    assert all(p.poll() is None for p in processes)  # a dump does not end the process


def test_a_process_that_does_not_catch_the_signal_is_never_sent_it(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    """A registration whose process no longer catches the signal (another process under a reused pid, or one
    that exec'd) is reported, and that process lives on: the signal's default action would have ended it."""
    plain = subprocess.Popen([sys.executable, "-c", SLEEPER])
    processes.append(plain)
    stacks = tmp_path / "logs" / "stacks"
    stacks.mkdir(parents=True)
    time.sleep(0.5)
    start = Path(f"/proc/{plain.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    record = {"rank": 0, "world_size": 2, "pid": plain.pid, "start": start, "signal": int(signal.SIGRTMIN) + 5,
              "dump": "rank-0.txt"}
    (stacks / "rank-0.json").write_text(json.dumps(record))
    (stacks / "rank-1.json").write_text(json.dumps({**record, "rank": 1, "start": "1"}))  # another process's pid
    (stacks / "rank-2.json").write_text("{half")  # written when the rank was stopped
    answer = rank_stacks.take(str(tmp_path))
    assert [(r["rank"], r["state"]) for r in answer["ranks"]] == [(0, "no handler"), (1, "exited")]
    time.sleep(0.3)
    assert plain.poll() is None


LOCAL_VERDICTS = {
    "collective": ("all_reduce", "rank 0 waits in all_reduce (hang_cases.py:42 in main: `dist.all_reduce(total)`); "
                   "rank 1 is elsewhere, at hang_cases.py:40 in main: `time.sleep(3600)  # rank 1 never reaches the "
                   "all-reduce`: the ranks are not in the same collective"),
    "loader": ("its DataLoader worker", "rank 0 waits in backward, where DDP all-reduces the gradients "
               "(hang_cases.py:27 in step: `model(batch).sum().backward()`); rank 1 waits for data loading "
               "(hang_cases.py:44 in main: `for batch in DataLoader(Samples(), batch_size=8, num_workers=1):`; its "
               "DataLoader worker is at hang_cases.py:22 in __getitem__: `time.sleep(3600)  # a worker stuck "
               "reading a sample`): the ranks are not in the same collective"),
    "exited": ("has exited", "rank 0 waits in the rendezvous, init_process_group (hang_cases.py:35 in main: "
               "`dist.init_process_group(\"gloo\")`); rank 1 has exited (its process is gone): the others wait for a "
               "rank that has exited (not a hang of the collective)"),
}


# What torch's flight recorder adds: the collective rank 0 entered last, which rank 1 never entered (its number
# counts DDP's own collectives at its construction, so it is read, not assumed); nothing before a process group.
NEVER_ENTERED = (r"rank 0 entered all_reduce \(gloo\) #(\d+) \(hang_cases\.py:{line}\); rank 1 entered up to "
                 r"#\d+ and never #\1: collective #\1 waits for the ranks that never entered it")
LOCAL_FLIGHTS = {"collective": NEVER_ENTERED.format(line=42), "loader": NEVER_ENTERED.format(line=27), "exited": ""}


@dataclass
class LiveStacks:
    """What `ddpctl stacks` said of a local run of hang_cases.py while it hung, and the run's state then."""

    verdict: str
    kept: Path  # the folder `ddpctl stacks` named
    run: Path
    stacks_events: list[str]  # the verdicts of the run's `stacks` events, then
    stacks_folders: set[Path]  # the run's stacks/ folders, then (one per asking)
    running_after: bool  # the run still ran once its stacks were taken


def _start_up(workdir: Path, case: str, *options: str) -> subprocess.Popen[str]:
    shutil.copy(CASES, workdir / "hang_cases.py")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "launcher", "up", "--gpus", "2", "--runs-dir", str(workdir / "runs"),
                             "--quiet", *options, "--", "python3", "hang_cases.py", case], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ask_until_settled(workdir: Path, up: subprocess.Popen[str], settled: str) -> LiveStacks:
    runs = workdir / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def registered() -> bool:
        return len(list(runs.glob("*/logs/stacks/rank-*.json"))) == 2

    _wait_for(registered, 150, "both ranks to register")
    for _ in range(15):  # a rank may still be setting up on a busy machine: asked again until it waits
        asked = subprocess.run([sys.executable, "-m", "launcher", "stacks", "--runs-dir", str(runs)],
                               cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        assert asked.returncode == 0, asked.stderr
        verdict, kept = asked.stdout.splitlines()
        if settled in verdict and "rank 0 waits" in verdict:
            break
        time.sleep(2)
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return LiveStacks(verdict, Path(kept.split(": ", 1)[1]), run,
                      [e["verdict"] for e in events if e["event"] == "stacks"],
                      {p.parent for p in run.glob("stacks/*/verdict.txt")}, up.poll() is None)


def _end(up: subprocess.Popen[str]) -> None:
    """Ctrl-C for a run still going, as a user stops it; killed if that does not end it."""
    if up.poll() is not None:
        return
    up.send_signal(signal.SIGINT)
    try:
        up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def _check_live_stacks(live: LiveStacks, case: str) -> None:
    stacks_said, _, flight = live.verdict.partition("; flight recorder: ")
    assert stacks_said == LOCAL_VERDICTS[case][1]
    assert re.fullmatch(LOCAL_FLIGHTS[case], flight), flight  # the ranks' flight records (gloo's, real dumps)
    assert (live.kept / "verdict.txt").read_text().strip() == live.verdict
    assert sorted(p.name for p in live.kept.glob("node-0-rank-*.txt")) == (
        ["node-0-rank-0.txt"] if case == "exited" else ["node-0-rank-0.txt", "node-0-rank-1.txt"])
    assert live.stacks_events[-1] == live.verdict
    assert live.running_after  # taking the stacks did not end the run


# The collective case runs once, in the stall test below: its stacks are asked while it hangs, as for these cases.
@pytest.mark.parametrize("case", sorted(set(LOCAL_VERDICTS) - {"collective"}))
def test_ddpctl_stacks_names_where_each_rank_of_a_local_run_waits(tmp_path: Path, case: str) -> None:
    up = _start_up(tmp_path, case)
    try:
        live = _ask_until_settled(tmp_path, up, LOCAL_VERDICTS[case][0])
    finally:
        _end(up)
    _check_live_stacks(live, case)


def test_ddpctl_stacks_of_a_run_that_is_not_running_is_one_line(tmp_path: Path) -> None:
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    runs = tmp_path / "runs"
    RunDir.create(runs, RunSpec(run_id="ended-run"), {"provider": "local"})  # no torchrun pid: never started
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    asked = subprocess.run([sys.executable, "-m", "launcher", "stacks", "ended-run", "--runs-dir", str(runs)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert asked.returncode == 1
    assert asked.stderr.strip().splitlines() == [
        "error: run ended-run is not running (no stacks to take): `ddpctl status ended-run` says how it ended"]


# Long enough to ask for the stacks first on a loaded machine: in a whole suite's run, the stacks test of the
# collective case took 10 s from `up` to its end; in a run on 5 workers (2 cores), rank 0 was still in DDP's
# constructor at the last of the 15 asks, with 45 s here.
STALL_SECONDS = 75


def test_a_stalled_local_run_names_where_each_rank_waits_before_it_is_stopped(tmp_path: Path) -> None:
    """The collective case: `ddpctl stacks` names where each rank waits while the run hangs (as for the cases
    above); then the local stall watch takes the stacks again before its stop, as on hosts
    (tests/faults/test_hang_stacks.py)."""
    up = _start_up(tmp_path, "collective", "--stall-timeout", str(STALL_SECONDS))
    try:
        live = _ask_until_settled(tmp_path, up, LOCAL_VERDICTS["collective"][0])
        _, stderr = up.communicate(timeout=STALL_SECONDS + 180)
    finally:
        _end(up)
    _check_live_stacks(live, "collective")
    assert up.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --stall-timeout: no training step for {STALL_SECONDS} s (a hung collective or "
                           "data loader): "), last
    assert ("rank 0 waits in all_reduce (hang_cases.py:42 in main: `dist.all_reduce(total)`); rank 1 is elsewhere, at "
            "hang_cases.py:40 in main") in last, last
    kept = {p.parent for p in live.run.glob("stacks/*/verdict.txt")}
    assert kept - live.stacks_folders, "the stall watch's stacks were not kept in the run directory"
