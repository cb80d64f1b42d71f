"""A stalled `-- CMD` run on two hosts explained rank by rank: before --stall-timeout stops it, every rank's stack is
taken (the join hook registered a faulthandler dump in each), kept in the run directory, and the error names where
each rank is. One run per case of tests/data/stacks/hang_cases.py (rank 1 before a collective, rank 1's DataLoader
worker stuck, rank 1 exited before joining), rank 1 on whichever node torchrun gave it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from tests.test_stack_dumps import NEVER_ENTERED
from tests.testbed_fixtures import REPO, lent, run_ddpctl

STALL_TIMEOUT = 20
CASES = REPO / "tests" / "data" / "stacks" / "hang_cases.py"


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


def stalled(bed: Testbed, tmp_path: Path, case: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    shutil.copy(CASES, tmp_path / "hang_cases.py")
    runs = tmp_path / "runs"
    result = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--host", bed.hosts[1].spec, "--gpus", "1",
                        "--runs-dir", str(runs), "--stall-timeout", str(STALL_TIMEOUT), "--quiet", "--",
                        "python3", "hang_cases.py", case, cwd=tmp_path, timeout=280)
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return result, run


def told(result: subprocess.CompletedProcess[str]) -> str:
    """The error line, which carries the verdict."""
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --stall-timeout: no training step for {STALL_TIMEOUT} s "
                           "(a hung collective or data loader): "), result.stderr
    return last


def kept(run: Path) -> tuple[str, Path]:
    """The verdict recorded in events.jsonl, and the folder that keeps the stacks."""
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    (taken,) = [e for e in events if e["event"] == "stacks"]
    kinds = [e["event"] for e in events]
    assert kinds.index("stacks") < kinds.index("stop_requested"), kinds  # taken before the stop
    folder = run / taken["folder"]
    assert (folder / "verdict.txt").read_text().strip() == taken["verdict"]
    return taken["verdict"], folder


def test_a_rank_that_never_reaches_the_collective(bed: Testbed, tmp_path: Path) -> None:
    result, run = stalled(bed, tmp_path, "collective")
    line = told(result)
    verdict, folder = kept(run)
    stacks_said, _, flight = verdict.partition("; flight recorder: ")
    assert stacks_said == ("rank 0 waits in all_reduce (hang_cases.py:42 in main: `dist.all_reduce(total)`); rank 1 "
                           "is elsewhere, at hang_cases.py:40 in main: `time.sleep(3600)  # rank 1 never reaches the "
                           "all-reduce`: the ranks are not in the same collective"), verdict
    assert re.fullmatch(NEVER_ENTERED.format(line=42), flight), verdict  # the flight records, from each host
    assert verdict in line
    dumps = sorted(p.name for p in folder.glob("node-*-rank-*.txt"))
    assert len(dumps) == 2 and {d.split("-rank-")[1] for d in dumps} == {"0.txt", "1.txt"}, dumps
    assert {d.split("-rank-")[0] for d in dumps} == {"node-0", "node-1"}  # one rank on each host


def test_a_rank_stuck_in_its_data_loader_worker(bed: Testbed, tmp_path: Path) -> None:
    result, run = stalled(bed, tmp_path, "loader")
    told(result)
    verdict, _ = kept(run)
    assert verdict.startswith("rank 0 waits in backward, where DDP all-reduces the gradients (hang_cases.py:27 in "
                              "step"), verdict
    assert ("rank 1 waits for data loading (hang_cases.py:44 in main" in verdict
            and "its DataLoader worker is at hang_cases.py:22 in __getitem__" in verdict), verdict


def test_a_rank_that_exited_is_named_not_called_a_hang(bed: Testbed, tmp_path: Path) -> None:
    result, run = stalled(bed, tmp_path, "exited")
    told(result)
    verdict, _ = kept(run)
    assert verdict == ("rank 0 waits in the rendezvous, init_process_group (hang_cases.py:35 in main: "
                       "`dist.init_process_group(\"gloo\")`); rank 1 has exited (its process is gone): the others "
                       "wait for a rank that has exited (not a hang of the collective)"), verdict


def test_ddpctl_stacks_on_demand_names_where_each_rank_of_a_live_run_waits(bed: Testbed, tmp_path: Path) -> None:
    """`ddpctl stacks RUN` of a detached run on two hosts: the same picture, taken over SSH; the run goes on."""
    shutil.copy(CASES, tmp_path / "hang_cases.py")
    runs = tmp_path / "runs"
    started = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--host", bed.hosts[1].spec, "--gpus", "1",
                         "--runs-dir", str(runs), "--detach", "--", "python3", "hang_cases.py", "collective",
                         cwd=tmp_path, timeout=200)
    assert started.returncode == 0, started.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    try:
        verdict = ""
        for _ in range(30):  # until both ranks registered and rank 0 reached the all-reduce
            asked = run_ddpctl(bed, "stacks", run.name, "--runs-dir", str(runs), cwd=tmp_path, timeout=120)
            assert asked.returncode == 0, asked.stderr
            verdict = asked.stdout.splitlines()[0]
            if "all_reduce" in verdict and "rank 1 is elsewhere" in verdict:
                break
            time.sleep(2)
        stacks_said, _, flight = verdict.partition("; flight recorder: ")
        assert stacks_said == ("rank 0 waits in all_reduce (hang_cases.py:42 in main: `dist.all_reduce(total)`); "
                               "rank 1 is elsewhere, at hang_cases.py:40 in main: `time.sleep(3600)  # rank 1 never "
                               "reaches the all-reduce`: the ranks are not in the same collective"), verdict
        assert re.fullmatch(NEVER_ENTERED.format(line=42), flight), verdict
        status = run_ddpctl(bed, "status", run.name, "--runs-dir", str(runs), "--json", cwd=tmp_path, timeout=120)
        assert [n["state"] for n in json.loads(status.stdout)["nodes"]] == ["running", "running"], status.stdout
    finally:
        run_ddpctl(bed, "down", run.name, "--runs-dir", str(runs), cwd=tmp_path, timeout=200)
