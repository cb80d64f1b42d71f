"""Failures named right (issue 11): the first failure in time across nodes, by global rank, node and cause (signal
by name, exit code, the exception's line from that rank's traceback); nodes ddpctl stopped are "stopped"; a run
whose training finished but whose teardown failed exits 0 with a note; a script without torch gets a hint naming
its interpreter. On the SSH test bed (two hosts, real torchrun and gloo) and locally, with a tutorial-style
script written here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed
from launcher.execute.failures.cause import attribute, cause_exit_code, shown_state
from launcher.remote.attribution import explaining_lines, parse_failures
from tests.testbed_fixtures import REPO, TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent, run_ddpctl

needs_testbed = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)

# The classic torchrun tutorial loop, cut down: DDP over gloo, a few epochs, one line printed per epoch; in epoch 1
# rank FAIL_RANK fails as MODE says. In the SIGKILL and agent cases the other ranks are busy elsewhere (a long
# validation) at that moment, so only ddpctl's stop ends them.
TUTORIAL = """\
import gc, os, signal, sys, time, warnings
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(mode, fail_rank):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        if epoch == 1 and rank == fail_rank:
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "agent":
                os.kill(os.getppid(), signal.SIGKILL)  # torchrun's agent: this worker's parent
            if mode == "raise":
                warnings.warn("a warning printed before the failure")
                raise ValueError(f"bad batch in epoch {epoch} on rank {rank}")
        if epoch == 1 and mode in ("sigkill", "agent") and rank != fail_rank:
            time.sleep(300)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"Epoch {epoch} | loss {loss.item():.4f}", flush=True)
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive as the interpreter ends aborts it (SIGABRT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
"""
# Loaded first by every Python of a node that has it on PYTHONPATH: global rank 1 ends with status 3 once its
# program is done (after the trainer wrote every result), as a crash in a library's exit handler would, whether
# the program ends through its atexit handlers or through os._exit: both ways end with 3.
TEARDOWN_FAILS = """\
import atexit, os
if os.environ.get("RANK") == "1":
    _exit = os._exit
    os._exit = lambda code: _exit(code or 3)
    atexit.register(lambda: _exit(3))
"""


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """Two hosts, each its own login user, with this machine's python and torch."""
    yield from lent(two_hosts)


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A folder every test host's user can read (pytest's tmp_path is closed to them)."""
    path = Path(tempfile.mkdtemp(prefix="ddpblame-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def project(shared_dir: Path) -> Path:
    folder = shared_dir / "project"
    folder.mkdir(mode=0o755)
    (folder / "train.py").write_text(TUTORIAL)
    (folder / "train.py").chmod(0o644)
    return folder


def up_on_bed(bed: Testbed, runs: Path, project: Path, *args: str, nodes: int = 2) -> tuple[
        subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    """`up` on the bed's first `nodes` hosts, in the project folder."""
    hosts = [a for h in bed.hosts[:nodes] for a in ("--host", h.spec)]
    result = run_ddpctl(bed, "up", *hosts, "--runs-dir", str(runs), *args, cwd=project, timeout=400)
    print(result.stderr)  # shown when a test fails
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return result, run, json.loads((run / "run.json").read_text())


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return [x for x in result.stderr.splitlines() if x.startswith("error:")][-1]


def no_process_left(bed: Testbed) -> None:
    """End what a killed agent may have left (its orphaned worker), so the next test starts clean."""
    for host in bed.hosts:
        found = host.run_as_user(["pgrep", "-u", host.user, "-f", "train.py"], check=False)
        for pid in found.stdout.split():
            subprocess.run(["kill", "-9", pid.decode()], check=False)


@needs_testbed
def test_sigkill_of_rank_1_on_node_1_names_it_and_node_0_is_stopped(bed: Testbed, project: Path,
                                                                     tmp_path: Path) -> None:
    result, run, record = up_on_bed(bed, tmp_path / "runs", project, "--gpus", "1", "--", "python", "train.py",
                                    "sigkill", "1")
    assert result.returncode != 0 and result.returncode != 143, result.stderr
    line = last_line(result)
    assert "rank 1 on node 1" in line and "SIGKILL" in line, result.stderr
    assert "node 0 (" in result.stderr and ": stopped" in result.stderr, result.stderr
    assert "exit 143" not in result.stderr  # ddpctl's own stop of node 0 is shown as "stopped", not as a failure
    failure = record["failure"]
    assert (failure["rank"], failure["node"], failure["signal"]) == (1, 1, "SIGKILL")
    assert not any("c10d" in x for x in failure["explain"])  # a warning before the kill explains nothing
    assert [n["outcome"] for n in failure["nodes"]] == ["stopped", "failed: the cause"]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    attributed = [e for e in events if e["event"] == "failure_attributed"]
    assert len(attributed) == 1 and attributed[0]["rank"] == 1
    status = run_ddpctl(bed, "status", str(run), "--json")
    assert json.loads(status.stdout)["failure"]["summary"] == failure["summary"], status.stderr
    shown = run_ddpctl(bed, "status", str(run))
    said = shown.stdout + shown.stderr  # the table goes to the terminal's error stream
    assert "failure: rank 1 on node 1" in said and "SIGKILL" in said, said


@needs_testbed
def test_exception_on_rank_3_names_rank_node_and_the_traceback_line(bed: Testbed, project: Path,
                                                                     tmp_path: Path) -> None:
    result, run, record = up_on_bed(bed, tmp_path / "runs", project, "--gpus", "2", "--", "python", "train.py",
                                    "raise", "3")
    assert result.returncode == 1, result.stderr
    line = last_line(result)
    assert "rank 3 on node 1" in line and "ValueError: bad batch in epoch 1 on rank 3" in line, result.stderr
    failure = record["failure"]
    assert failure["explain"][0].endswith("Traceback (most recent call last):")
    tail = [line for line in failure["explain"] if "terminate called without an active exception" not in line]
    assert tail[-1].endswith("ValueError: bad batch in epoch 1 on rank 3"), failure["explain"]  # then the abort, if any
    # the exception; at times the process then aborts on its way out (a thread of the process group still runs
    # at exit: "terminate called without an active exception"), and the summary says so after the exception
    # (or torchrun's SIGTERM, when its neighbour, which lost it, ended first while it was still exiting)
    assert re.search(r"rank 3 on node 1 \(.*\) (exited with 1: |was killed by SIG(ABRT|TERM) as it exited after "
                     r"raising )ValueError: bad batch in epoch 1 on rank 3$", failure["summary"]), failure["summary"]
    assert not any("warning printed before" in x for x in failure["explain"])
    assert failure["nodes"][0]["outcome"] != "failed: the cause"
    # The lines named come from rank 3's own log, which came back with node 1's files.
    assert (run / "nodes" / "1" / failure["log"]).is_file()


@needs_testbed
def test_a_killed_torchrun_agent_is_named_on_its_node(bed: Testbed, project: Path, tmp_path: Path) -> None:
    try:
        result, _, record = up_on_bed(bed, tmp_path / "runs", project, "--gpus", "1", "--", "python", "train.py",
                                      "agent", "1")
    finally:
        no_process_left(bed)
    line = last_line(result)
    assert "torchrun's agent on node 1" in line and "SIGKILL" in line, result.stderr
    assert result.returncode == 1 and record["failure"]["exit_code"] == 137
    assert record["failure"]["nodes"][0]["outcome"] == "stopped"


@needs_testbed
def test_teardown_failure_after_training_finished_exits_0_with_a_note(bed: Testbed, shared_dir: Path,
                                                                       tmp_path: Path) -> None:
    hook = shared_dir / "teardown_hook"
    hook.mkdir(mode=0o755)
    (hook / "sitecustomize.py").write_text(TEARDOWN_FAILS)
    (hook / "sitecustomize.py").chmod(0o644)
    hosts = [a for h in bed.hosts for a in ("--host", h.spec)]
    result = run_ddpctl(bed, "up", *hosts, "--runs-dir", str(tmp_path / "runs"), "--gpus", "1", "--epochs", "1",
                        "--synthetic-train-size", "256", "--synthetic-test-size", "64", "--env",
                        f"PYTHONPATH={hook}", timeout=400)
    assert result.returncode == 0, result.stderr
    assert "training finished and every result was written; the teardown after it failed" in result.stdout \
        + result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    failure = json.loads((run / "run.json").read_text())["failure"]
    assert failure["teardown_only"] and failure["rank"] == 1 and failure["exit_code"] == 3
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1


@needs_testbed
def test_a_script_run_by_a_python_without_torch_gets_a_hint(bed: Testbed, project: Path, shared_dir: Path,
                                                            tmp_path: Path) -> None:
    """On one SSH host: what is checked (the hint naming the interpreter, the node's last state, the preflight's
    refusal of it as --python) is each node's own."""
    venv = shared_dir / "venv-without-torch"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   env={**os.environ, **bed.host_env})
    result, _, record = up_on_bed(bed, tmp_path / "runs", project, "--gpus", "1", "--", f"{venv}/bin/python",
                                  "train.py", "raise", "9", nodes=1)
    assert result.returncode == 1
    hint = record["failure"]["hint"]
    assert f"{venv}/bin/python on node" in hint and "--python" in hint
    assert "No module named 'torch'" in result.stderr and f"hint: {venv}/bin/python on node" in result.stderr
    assert "failed (the first failure)" in result.stderr  # the display's last state of the failing node
    # The same interpreter as --python (it would run torchrun) is refused by the preflight, naming it.
    refused = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--runs-dir", str(tmp_path / "runs2"), "--python",
                         f"{venv}/bin/python", "--", "python", "train.py", "raise", "9", cwd=project)
    assert refused.returncode == 1 and f"torch is not importable by {venv}/bin/python" in refused.stderr
    assert "--python PATH" in refused.stderr and not (tmp_path / "runs2").exists()


def test_local_exception_names_rank_and_line_and_status_shows_it(project: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = tmp_path / "runs"
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--gpus", "2", "--runs-dir", str(runs), "--",
                             "python", "train.py", "raise", "1"], cwd=project, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "rank 1 on node 0 (local)" in result.stderr and "ValueError: bad batch in epoch 1 on rank 1" in result.stderr
    assert "Traceback (most recent call last):" in result.stderr and "warning printed before" not in result.stderr
    (run,) = runs.iterdir()
    status = subprocess.run([sys.executable, "-m", "launcher", "status", str(run), "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["failure"]["rank"] == 1, status.stderr


def test_local_python_without_torch_is_named_with_a_hint(shared_dir: Path, project: Path, tmp_path: Path) -> None:
    venv = shared_dir / "local-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--gpus", "1", "--runs-dir",
                             str(tmp_path / "runs"), "--python", f"{venv}/bin/python", "--", "python", "train.py",
                             "raise", "9"], cwd=project, env={**os.environ, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"{venv}/bin/python on node 0 (local) has no torch" in result.stderr, result.stderr
    assert "--python PATH" in result.stderr


# torchrun's ChildFailedError report, as torch 2.13 prints it (two nodes' worth of facts are built from these).
REPORT = """\
E1123 03:08:56.168000 14249 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) \
local_rank: 1 (pid: 14530) of binary: /usr/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_03:08:56
  host      : b
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 14529)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 14529
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_03:08:56
  host      : b
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 14530)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 14530
============================================================
"""


def test_report_parsing_and_ordering_across_nodes() -> None:
    failures = parse_failures(REPORT)
    assert [(f["rank"], f["signal"], f["root_cause"]) for f in failures] == [(3, "SIGKILL", True),
                                                                           (2, "SIGTERM", False)]
    late = {"exit_code": 1, "exit_time": 110.0, "failures": [
        {"rank": 0, "local_rank": 0, "exitcode": 1, "signal": None, "pid": 5, "time": 105.0,
         "explain": ["Traceback (most recent call last):", "RuntimeError: Connection closed by peer"]}]}
    early = {"exit_code": 1, "exit_time": 104.0,
             "failures": [dict(failures[0], time=100.0, oom="Killed process 14530")]}
    record = attribute([late, early], ["a", "b"])
    assert record is not None
    assert (record["node"], record["rank"]) == (1, 3) and "out of memory" in record["summary"]
    assert record["nodes"][0]["outcome"].startswith("failed after node 1")
    # The rank that lost its peer was seen failing first (its torchrun polled sooner): still not the cause.
    raised = {"exit_code": 1, "exit_time": 104.0, "failures": [
        {"rank": 3, "local_rank": 1, "exitcode": 1, "signal": None, "pid": 7, "time": 106.0,
         "explain": ["Traceback (most recent call last):", "ValueError: bad batch in epoch 1 on rank 3"]}]}
    record = attribute([dict(late, failures=[dict(late["failures"][0], time=105.9)]), raised], ["a", "b"])
    assert record is not None and (record["node"], record["rank"]) == (1, 3), record
    record = attribute([late, {"exit_code": 143, "exit_time": 107.0, "failures": []}], ["a", "b"], stopped=[1],
                       stop_time=106.5)
    assert record is not None and record["node"] == 0, "a lost peer is the cause when nothing else failed"
    # A node ddpctl stopped (its exit 143 after the stop) is never the cause, whatever its exit code says.
    stopped = {"exit_code": 143, "exit_time": 130.0, "failures": []}
    record = attribute([stopped, dict(early, failures=[dict(failures[0], time=120.0)])], ["a", "b"], stopped=[0],
                       stop_time=125.0)
    assert record is not None and record["node"] == 1 and record["nodes"][0]["outcome"] == "stopped"
    assert shown_state(record, 0, "failed (exit 143)") == "stopped"
    lost = {"exit_code": None, "exit_time": None, "failures": [], "torchrun_tail": []}
    record = attribute([{"exit_code": 0, "failures": []}, lost], ["a", "b"])
    assert record is not None and record["summary"] == ("torchrun on node 1 (b) ended without recording its exit "
                                                         "status, and no worker of it failed")
    assert shown_state(record, 1, "failed (exit 1)") == "failed (the first failure)"
    # The cause's own node was stopped too while its torchrun tore down: the run's code is not that 143.
    assert cause_exit_code(record, [143, 143]) == 1 and cause_exit_code(record, [143, 137]) == 137
    assert explaining_lines("UserWarning: x\nTraceback (most recent call last):\n  File x\nValueError: y") == [
        "Traceback (most recent call last):", "  File x", "ValueError: y"]
    # A worker killed by a signal: torch's warnings before it explain nothing.
    noise = "[W1123 03:16:02.552191429 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved"
    assert explaining_lines(noise + "\nEpoch 0 | loss 1", errors_only=True) == []
    assert explaining_lines(noise + "\nEpoch 0 | loss 1") == ["Epoch 0 | loss 1"]


def test_out_of_memory_is_named_from_the_kernel_log(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.remote import attribution

    def kernel_log(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        text = ("[  10.1] Out of memory: Killed process 4242 (python3) total-vm:9000000kB\n"
                if argv[0] == "dmesg" else "")
        return subprocess.CompletedProcess(argv, 0, text, "")

    monkeypatch.setattr(subprocess, "run", kernel_log)  # the module killed_for_memory imports when called
    assert "Killed process 4242" in (attribution.killed_for_memory(4242) or "")
    assert attribution.killed_for_memory(4243) is None or "cgroup" in str(attribution.killed_for_memory(4243))


def test_a_detached_runs_failure_is_named_from_what_was_pulled(tmp_path: Path) -> None:
    """`up --detach` follows nothing, so no cause was recorded; once `ddpctl pull` brought back every node's files
    (nodes/<k>/ keeps a workspace's layout) and every node had ended, the cause is named from those copies."""
    from launcher.execute.failures.cause import failure_from_pulled
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    nodes = [{"index": k, "label": label, "workspace": f"ws{k}"} for k, label in enumerate(("a", "b"))]
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="detached", nnodes=2), {"nodes": nodes})
    for k, (code, out) in enumerate(((0, ""), (1, REPORT))):
        copy = run_dir.path / "nodes" / str(k)
        copy.mkdir(parents=True)
        (copy / "torchrun.out").write_text(out)
        if k == 0:
            (copy / "exit_code").write_text(f"{code}\n")
    assert failure_from_pulled(run_dir) is None  # node 1 has not ended (no exit_code pulled): nothing said yet
    (run_dir.path / "nodes" / "1" / "exit_code").write_text("1\n")
    failure = failure_from_pulled(run_dir)
    assert failure is not None and (failure["node"], failure["rank"], failure["signal"]) == (1, 3, "SIGKILL")
    assert run_dir.record()["failure"]["summary"] == failure["summary"]  # where `ddpctl status` reads it
    assert failure_from_pulled(run_dir) is None  # recorded once
