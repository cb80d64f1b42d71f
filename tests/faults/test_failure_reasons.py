"""A failure's reason (issue 22): the exception line of the rank's traceback or the signal, never a line the script
printed before it ended; "failed after node K" only for a node whose ranks lost their peer; hints where ddpctl
knows better than torch (CUDA/NCCL on hosts without GPUs, a file shipping left out). Worked out from node
workspaces recorded here as torchrun leaves them (torchrun.out's ChildFailedError report, each worker's logs,
exit_code), read by the same attribution.node_report that runs on the hosts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from launcher.execute.failures.cause import attribute, cause_text, shown_state
from launcher.execute.failures.hints import RunHints, run_hints
from launcher.execute.failures.restart_causes import restart_cause, restart_line
from launcher.remote.attribution import exception_line, node_report
from launcher.transport import outputs


def child_failed(rank: int, local_rank: int, exitcode: int, pid: int, second: int = 5) -> str:
    """torchrun's ChildFailedError report for one failed worker (seen at 10:00:SECOND), as torch 2.13 prints it."""
    return f"""\
E1125 10:00:{second:02d}.100000 100 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: {exitcode}) local_rank: {local_rank} (pid: {pid}) of binary: /usr/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_10:00:{second:02d}
  host      : h
  rank      : {rank} (local_rank: {local_rank})
  exitcode  : {exitcode} (pid: {pid})
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def workspace(root: Path, name: str, report: str, logs: dict[int, tuple[str, str]], exit_code: int = 1) -> str:
    """A node's workspace as torchrun leaves it: torchrun.out, logs/<rdzv>/attempt_0/<local rank>/{stdout,stderr}.log
    (`logs`: local rank -> (stdout, stderr)), exit_code."""
    ws = root / name
    for local_rank, (stdout, stderr) in logs.items():
        folder = ws / "logs" / "run_abc" / "attempt_0" / str(local_rank)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text(stdout)
        (folder / "stderr.log").write_text(stderr)
    (ws / "torchrun.out").write_text(report)
    (ws / "exit_code").write_text(f"{exit_code}\n")
    return str(ws)


TRACEBACK = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/w/code/train.py", line 20, in <module>
[rank3]:     main()
[rank3]:     ^^^^^^
[rank3]: ValueError: bad batch in epoch 1 on rank 3
[rank3]: and a second line of its message
"""


def test_exception_line_is_the_tracebacks_last_exception_and_never_a_printed_line() -> None:
    assert exception_line(TRACEBACK.splitlines()) == "ValueError: bad batch in epoch 1 on rank 3"
    chained = ["Traceback (most recent call last):", "  File 'a', line 1", "KeyError: 'x'", "",
               "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):", "  File 'b', line 2",
               "torch.distributed.DistBackendError: NCCL error"]
    assert exception_line(chained) == "torch.distributed.DistBackendError: NCCL error"
    assert exception_line(["Traceback (most recent call last):", "  File 'c'", "KeyboardInterrupt"]) == \
        "KeyboardInterrupt"
    assert exception_line(["epoch 1 done", "rank 2 done"]) is None
    assert exception_line(["Error: something printed", "done"]) is None  # no traceback: nothing is an exception


def test_a_rank_that_printed_done_then_exited_1_is_named_by_its_exit_alone(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "n1", child_failed(2, 0, 1, 4242), {0: ("epoch 0\nrank 2 done\n", "")})
    clean = workspace(tmp_path, "n0", "", {0: ("rank 0 done\n", "")}, exit_code=0)
    record = attribute([node_report(clean), node_report(ws)], ["a", "b"])
    assert record is not None
    assert record["summary"] == "rank 2 on node 1 (b) exited with 1", record["summary"]
    assert "rank 2 done" in record["explain"]  # still shown as the end of its log, below the cause
    assert record["nodes"][0]["outcome"] == "finished"


def test_an_exception_is_the_reason_even_with_lines_printed_after_it(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "n1", child_failed(3, 1, 1, 77), {1: ("rank 3 epoch 1\n", TRACEBACK)})
    record = attribute([node_report(ws)], ["b"])
    assert record is not None
    assert record["summary"] == "rank 3 on node 0 (b) exited with 1: ValueError: bad batch in epoch 1 on rank 3"


def test_an_exception_then_an_abort_on_the_way_out_names_both(tmp_path: Path) -> None:
    """The rank raised, then aborted while exiting (a process-group thread still ran: "terminate called without an
    active exception", SIGABRT): the exception is still the reason, after the signal."""
    aborted = TRACEBACK + "terminate called without an active exception\n"
    ws = workspace(tmp_path, "n1", child_failed(3, 1, -6, 77), {1: ("rank 3 epoch 1\n", aborted)})
    record = attribute([node_report(ws)], ["b"])
    assert record is not None
    assert record["summary"] == ("rank 3 on node 0 (b) was killed by SIGABRT as it exited after raising "
                                 "ValueError: bad batch in epoch 1 on rank 3"), record["summary"]
    assert record["explain"][-1] == "terminate called without an active exception"  # the log's own end, as written
    assert record["hint"] is None, "the exception explains it: no hint about torch's abort at exit"
    # a signal with no traceback names the signal alone
    ws = workspace(tmp_path, "n2", child_failed(3, 1, -6, 78), {1: ("rank 3 epoch 1\n", "abort\n")})
    record = attribute([node_report(ws)], ["b"])
    assert record is not None and record["summary"] == "rank 3 on node 0 (b) was killed by SIGABRT"
    assert record["hint"] is None


def test_a_rank_that_raised_and_was_still_exiting_when_torchrun_stopped_it_is_the_cause(tmp_path: Path) -> None:
    """As seen on the test bed: rank 3 raised; rank 2 on the same node lost it ("Connection closed by peer"), raised
    too and aborted on its way out, first; torchrun then SIGTERMed rank 3, still exiting. The cause is rank 3 and its
    exception, named with the signal that ended it; rank 2's lost peer is not the cause."""
    torchrun_out = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
python3 FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-26_19:30:37
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 15503)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 15503
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_19:30:37
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : -6 (pid: 15501)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 15501
=======================================================
"""
    lost = ("[rank2]: Traceback (most recent call last):\n[rank2]:   File \"/w/train.py\", line 30, in <module>\n"
            "[rank2]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:38290. "
            "This is typically caused by a remote worker crashing.\nterminate called without an active exception\n")
    raised = TRACEBACK.replace("[rank3]: and a second line of its message\n", "")
    ws = workspace(tmp_path, "n1", torchrun_out, {0: ("Epoch 0\n", lost), 1: ("Epoch 0\n", raised)})
    (tmp_path / "n0").mkdir()
    stopped = workspace(tmp_path, "n0", "", {}, exit_code=143)  # node 0: stopped by ddpctl
    record = attribute([node_report(stopped), node_report(ws)], ["a", "b"], stopped=[0], stop_time=1e12)
    assert record is not None
    assert record["summary"] == ("rank 3 on node 1 (b) was killed by SIGTERM as it exited after raising "
                                 "ValueError: bad batch in epoch 1 on rank 3"), record["summary"]
    assert [n["outcome"] for n in record["nodes"]] == ["stopped", "failed: the cause"]


def test_torchs_abort_as_a_rank_exits_with_no_python_error_gets_its_hint(tmp_path: Path) -> None:
    """A DDP script on gloo that returned with its model still alive: torch 2.13 aborts the process as it exits
    (SIGABRT, "terminate called without an active exception", no traceback). The summary names the signal, and the
    hint what torch did and the two lines that avoid it."""
    ws = workspace(tmp_path, "n1", child_failed(1, 1, -6, 77),
                   {1: ("Epoch 1 | Training snapshot saved at snapshot.pt\n",
                        "terminate called without an active exception\n")})
    record = attribute([node_report(ws)], ["b"])
    assert record is not None and record["summary"] == "rank 1 on node 0 (b) was killed by SIGABRT"
    assert record["hint"] is not None and "torch 2.13 does so as a process exits while a DDP model is still alive" \
        in record["hint"] and "`del model; gc.collect()`" in record["hint"]
    assert f"hint: {record['hint']}" in cause_text(record)


def test_a_rank_that_raised_is_the_cause_before_its_neighbour_that_lost_the_group() -> None:
    """Seen on a fresh Ubuntu root: node 1's torchrun saw rank 2 end first (aborted once rank 3's exception broke
    the group: its log says a peer closed the connection), rank 3 (the ValueError) second; node 0's rank 1 lost its
    peer earlier than both. The cause is rank 3 on node 1."""
    peer = ["RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.3]:48779. This is typically caused by a "
            "remote worker crashing."]
    node0 = {"exit_code": 1, "failures": [{"rank": 1, "local_rank": 1, "exitcode": 1, "signal": None, "time": 9.0,
                                           "explain": peer}]}
    node1 = {"exit_code": 1, "failures": [
        {"rank": 2, "local_rank": 0, "exitcode": -6, "signal": "SIGABRT", "time": 10.0, "explain": peer},
        {"rank": 3, "local_rank": 1, "exitcode": 1, "signal": None, "time": 10.5, "explain": TRACEBACK.splitlines()}]}
    record = attribute([node0, node1], ["a", "b"])
    assert record is not None
    assert record["summary"] == "rank 3 on node 1 (b) exited with 1: ValueError: bad batch in epoch 1 on rank 3"
    assert [n["outcome"] for n in record["nodes"]] == ["failed after node 1: rank 1 (exit 1)", "failed: the cause"]


def test_only_a_node_that_lost_its_peer_failed_after_the_cause(tmp_path: Path) -> None:
    """Node 1's rank 3 raised first; node 0's rank 0 raised its own error a little later (not about a peer), node
    2's rank 4 failed because its peer went away: node 0 failed by itself, node 2 failed after node 1."""
    own = workspace(tmp_path, "n0", child_failed(0, 0, 1, 10, second=7), {0: (
        "", "Traceback (most recent call last):\n  File 'train.py'\nRuntimeError: CUDA out of memory\n")})
    cause = workspace(tmp_path, "n1", child_failed(3, 1, 1, 11, second=5), {1: ("", TRACEBACK)})
    peer = workspace(tmp_path, "n2", child_failed(4, 0, 1, 12, second=4), {0: (
        "", "Traceback (most recent call last):\n  File 'train.py'\n"
            "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234\n")})
    reports: list[dict[str, Any] | None] = [node_report(ws) for ws in (own, cause, peer)]
    record = attribute(reports, ["a", "b", "c"])
    assert record is not None and (record["node"], record["rank"]) == (1, 3), record
    outcomes = [n["outcome"] for n in record["nodes"]]
    assert outcomes[0].startswith("failed by itself: rank 0") and "after node" not in outcomes[0], outcomes
    assert outcomes[2].startswith("failed after node 1: rank 4"), outcomes
    assert shown_state(record, 0, "failed (exit 1)") == "failed by itself"
    assert "node 0 (a): failed by itself" in cause_text(record)


# Each needs CUDA or NCCL; torch's CPU build (this machine's) fails each with its own error.
NEEDS_CUDA = {
    "set_device": "import torch\ntorch.cuda.set_device(0)\n",
    "nccl": "import os, torch.distributed as dist\nos.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='0')\n"
            "dist.init_process_group(backend='nccl', rank=0, world_size=1)\n",
    "cuda_tensor": "import torch\ntorch.zeros(1).cuda()\n",
}


def test_a_script_needing_cuda_on_a_host_without_gpus_gets_one_hint(tmp_path: Path) -> None:
    """Real torch errors (this machine's CPU build), as a rank's stderr on a node the probe found without GPUs."""
    cpu_hosts = RunHints(gpus=(0, 0))
    for name, script in NEEDS_CUDA.items():
        ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert ran.returncode != 0, name
        ws = workspace(tmp_path, name, child_failed(1, 1, 1, 9), {1: ("", ran.stderr)})
        reports: list[dict[str, Any] | None] = [{"exit_code": 143, "failures": []}, node_report(ws)]
        record = attribute(reports, ["a", "b"], stopped=[0], stop_time=1e12, hints=cpu_hosts)
        assert record is not None and record["node"] == 1, name
        assert record["hint"] is not None and "node 1 (b) has no GPU (the probe found none)" in record["hint"], name
        assert "gloo" in record["hint"] and "hint: node 1 (b) has no GPU" in cause_text(record)
        # The same failure on a GPU host (or one not probed) is torch's to explain: no hint.
        assert attribute(reports, ["a", "b"], [0], 1e12, hints=RunHints(gpus=(0, 1)))["hint"] is None  # type: ignore[index]
        assert attribute(reports, ["a", "b"], [0], 1e12)["hint"] is None  # type: ignore[index]


def test_a_missing_file_that_shipping_left_out_names_the_line_that_ships_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "data" / "raw").mkdir(parents=True)
    (project / "data" / "raw" / "train.csv").write_text("1,2\n")
    (project / "labels.txt").write_text("a\n")
    (project / ".gitignore").write_text("data/\n")
    run = tmp_path / "run"
    run.mkdir()
    manifest, left_out = outputs.record_shipped(run, project)  # as `up` does before shipping
    assert "data/raw/train.csv" not in manifest and "labels.txt" in manifest
    hints = run_hints(run, {"run_id": "r1", "node_facts": [{"gpu_names": []}]})
    assert hints.source == project and hints.gpus == (0,)

    def failed_with(stderr: str) -> dict[str, Any]:
        ws = workspace(tmp_path, f"ws{len(list(tmp_path.iterdir()))}", child_failed(0, 0, 1, 5), {0: ("", stderr)})
        record = attribute([node_report(ws)], ["a"], hints=hints)
        assert record is not None
        return record

    def not_found(path: str) -> str:
        return (f"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'\n")

    record = failed_with(not_found("data/raw/train.csv"))
    assert record["summary"].endswith("FileNotFoundError: [Errno 2] No such file or directory: 'data/raw/train.csv'")
    assert record["hint"] == (f"data/raw/train.csv is in {project} but was not shipped (.gitignore/.ddpctlignore or "
                              "ddpctl's defaults left data/ out): a .ddpctlignore line `!data/` ships it")
    # The absolute path on the host (the workspace's shipped copy) means the same file.
    assert failed_with(not_found("/home/u/.ddpctl/runs/r1/code/data/raw/train.csv"))["hint"] == record["hint"]
    # A file the project does not have, or one that was shipped, is not shipping's doing: no hint.
    assert failed_with(not_found("data/raw/test.csv"))["hint"] is None
    assert failed_with(not_found("labels.txt"))["hint"] is None
    (project / ".ddpctlignore").write_text("!data/\n")  # the line the hint gave: shipped now
    manifest, _ = outputs.record_shipped(run, project)
    assert "data/raw/train.csv" in manifest


def test_a_restarts_cause_is_the_first_failure_of_the_attempt_before_across_nodes() -> None:
    """Notes as launcher/spec/attempt_logs.py writes them (attempt_0/ended.json on each node that saw a failure)."""
    raised = {"rank": 3, "local_rank": 1, "exitcode": 1, "pid": 5, "time": 101,
              "stderr_tail": ["[rank3]: Traceback (most recent call last):", "[rank3]:   File 'train.py'",
                              "[rank3]: ValueError: bad batch", "epoch 1 done"]}
    stopped = {"rank": 2, "local_rank": 0, "exitcode": -15, "pid": 4, "time": 101, "stderr_tail": []}
    lost = {"rank": 0, "local_rank": 0, "exitcode": 1, "pid": 3, "time": 100, "stderr_tail": [
        "Traceback (most recent call last):", "RuntimeError: Connection closed by peer [10.0.0.3]:5"]}
    notes = [{0: {"failures": [lost]}}, {0: {"failures": [raised, stopped]}}]
    cause = restart_cause(notes, 1, ["a", "b"])
    assert cause is not None and (cause["node"], cause["rank"], cause["signal"]) == (1, 3, None)
    assert cause["summary"] == "rank 3 on node 1 (b) exited with 1: ValueError: bad batch"
    assert restart_line(1, cause) == ("torchrun restarted the workers (attempt 1): rank 3 on node 1 (b) exited "
                                      "with 1: ValueError: bad batch")
    killed = dict(raised, exitcode=-9)
    assert restart_cause([{}, {0: {"failures": [killed]}}], 1, ["a", "b"])["summary"] == (  # type: ignore[index]
        "rank 3 on node 1 (b) was killed by SIGKILL")
    assert restart_cause(notes, 2, ["a", "b"]) is None  # attempt 1 ended without a note: not known
    assert "was not recorded" in restart_line(2, None)


def test_a_spawn_scripts_printed_line_is_never_its_reason() -> None:
    """A spawn (or mpirun) node's output is the script's own: its last printed line is no reason, its exception is."""
    printed = {"exit_code": 1, "exit_time": 5.0, "failures": [], "torchrun_tail": ["epoch 2", "rank 2 done"]}
    record = attribute([printed], ["a"], launcher="spawn")
    assert record is not None and record["summary"] == "the script on node 0 (a) exited with 1", record["summary"]
    raised = dict(printed, torchrun_tail=["Traceback (most recent call last):", "  File 'x'", "KeyError: 'lr'"])
    assert attribute([raised], ["a"], launcher="spawn")["summary"] == (  # type: ignore[index]
        "the script on node 0 (a) exited with 1: KeyError: 'lr'")
