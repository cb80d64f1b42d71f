"""A tutorial-style training script under `ddpctl up`, on this machine and on two test-bed hosts: its printed lines
appear live under `up` and in `ddpctl logs --rank R [-f]`; a worker SIGKILLed with --max-restarts 1 resumes from
its snapshot and the summary, `status` and events.jsonl count 1 restart; the JSON progress protocol gives the
progress bar and the timing records `ddpctl report` reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.testbed import Testbed
from launcher.results.run_figures import load_run, scaling_table
from tests.cli_runner import ddpctl, ddpctl_env
from tests.plain_lines import unstamped
from tests.testbed_fixtures import lent

EPOCHS = 5
# The classic torchrun tutorial's shape: prints "[GPU<rank>] Epoch N | Batchsize: B | Steps: S" each epoch, keeps a
# snapshot.pt in its working directory (local rank 0 of each node writes it), resumes from it on a restart. Global
# rank 1 kills itself with SIGKILL in epoch 2 of the first attempt, once the file `go` is in its working directory.
# Rank 0 also speaks the progress protocol.
TUTORIAL_SCRIPT = r'''
import json, os, signal, sys, time
import torch
import torch.distributed as dist

total_epochs, save_every = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
start = 0
if os.path.exists("snapshot.pt"):
    start = torch.load("snapshot.pt")["EPOCHS_RUN"]
    print(f"Resuming training from snapshot at Epoch {start}", flush=True)
for epoch in range(start, total_epochs):
    began = time.time()
    total = torch.ones(1)
    dist.all_reduce(total)
    time.sleep(0.4)
    print(f"[GPU{rank}] Epoch {epoch} | Batchsize: 32 | Steps: 8", flush=True)
    if rank == 0:
        print(json.dumps({"ddpctl": "epoch", "epoch": epoch + 1, "epochs": total_epochs, "steps": 8,
                          "seconds": time.time() - began, "samples": 256 * int(total.item())}), flush=True)
    if int(os.environ["LOCAL_RANK"]) == 0 and (epoch + 1) % save_every == 0:
        torch.save({"EPOCHS_RUN": epoch + 1}, "snapshot.pt")
    dist.barrier()
    if rank == 1 and epoch == 2 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        waited = time.time() + 120  # until the test follows this rank (it then makes ./go)
        while not os.path.exists("go") and time.time() < waited:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
'''


@dataclass
class LiveRun:
    """One `up` of the tutorial script, followed as a user would: up's output line by line, and `ddpctl logs
    --rank 1 -f` started once the first epoch line is shown."""

    run_dir: Path
    code: int
    stderr_lines: list[str]
    first_line_while_running: bool
    follow: subprocess.CompletedProcess[str]
    summary: dict[str, object]
    cwd: Path
    env: dict[str, str]
    key_args: list[str]


def run_tutorial(tmp: Path, up_args: list[str], env: dict[str, str], key_args: list[str],
                 workdirs: Callable[[str], list[Path]]) -> LiveRun:
    """Start `up` on the tutorial script, read its stderr as it comes, follow rank 1 with `logs -f` meanwhile;
    once that shows rank 1's first lines, let rank 1 die (`go` in each of `workdirs(run_id)`)."""
    (tmp / "train.py").write_text(TUTORIAL_SCRIPT)
    runs = tmp / "runs"
    up = subprocess.Popen([sys.executable, "-m", "launcher", "up", *key_args, "--runs-dir", str(runs),
                           "--max-restarts", "1", *up_args, "--", "python", "train.py", str(EPOCHS), "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    lines: list[str] = []
    follower, first = None, ""
    live = False
    assert up.stderr is not None
    deadline = time.monotonic() + 300
    try:
        for line in up.stderr:
            lines.append(line.rstrip("\n"))
            if follower is None and re.match(r"rank 0.*: \[GPU0\] Epoch 0 ", unstamped(line)):
                live = up.poll() is None
                (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
                follower = subprocess.Popen([sys.executable, "-m", "launcher", "logs", *key_args, str(run_dir),
                                             "--rank", "1", "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, env=env, cwd=tmp)
                assert follower.stdout is not None
                first = follower.stdout.readline()  # rank 1's output so far: the follow has begun
                for workdir in workdirs(run_dir.name):
                    (workdir / "go").write_text(first)
            assert time.monotonic() < deadline, "\n".join(lines[-30:])
        code = up.wait(timeout=60)
    finally:
        up.kill()
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert follower is not None, "no line of rank 0's output was shown live:\n" + "\n".join(lines[-30:])
    out, err = follower.communicate(timeout=120)  # -f ends by itself once the run has ended
    follow = subprocess.CompletedProcess(follower.args, follower.returncode, first + out, err)
    summary = json.loads((run_dir / "summary.json").read_text())
    return LiveRun(run_dir, code, lines, live, follow, summary, tmp, env, key_args)


def check_live_run(run: LiveRun) -> None:
    """What a user of the tutorial script sees, on any machine."""
    shown = "\n".join(run.stderr_lines)
    assert run.code == 0, shown[-3000:]
    # Printed lines under `up`, as they came (the first while the run was still going), the restart's included.
    assert run.first_line_while_running
    assert "[GPU0] Epoch 2 | Batchsize: 32 | Steps: 8" in shown  # the last line of the killed attempt
    assert re.search(r"rank 0 \(1 restart\): Resuming training from snapshot at Epoch 3", shown), shown[-3000:]
    assert f"[GPU0] Epoch {EPOCHS - 1} |" in shown
    assert '"ddpctl"' not in shown  # the protocol's lines are for ddpctl, not shown
    assert f"epoch {EPOCHS}/{EPOCHS}" in shown  # the protocol's progress bar, at its end
    # logs --rank 1 -f: followed rank 1 across its restart to the end of the run.
    assert run.follow.returncode == 0, run.follow.stderr
    assert f"[GPU1] Epoch {EPOCHS - 1} | Batchsize: 32 | Steps: 8" in run.follow.stdout
    assert "restarted the workers (attempt 1)" in run.follow.stderr
    # Restarts: the summary, events.jsonl, status.
    assert run.summary["restarts"] == 1 and run.summary["epochs"] == EPOCHS
    events = [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]
    restarted = [e for e in events if e["event"] == "restarted"]
    assert restarted and {e["attempt"] for e in restarted} == {1}
    status = ddpctl("status", *run.key_args, str(run.run_dir), "--json", env=run.env, cwd=run.cwd)
    assert status.returncode == 0, status.stderr
    counts = [row["restarts"] for row in json.loads(status.stdout)["nodes"]]
    assert counts == [1] * len(counts) and sum(counts) == len(restarted)  # every node's workers restarted
    # Which rank on which node ended, and how (issue 22): said once under `up`, in each event, in status.
    (node,) = {e["cause"]["node"] for e in restarted}
    said = re.findall(r"torchrun restarted the workers \(attempt 1\): (rank 1 on node \d \(.+\) was killed by SIGKILL)",
                      shown)
    assert len(said) == 1 and {e["cause"]["summary"] for e in restarted} == set(said), shown[-3000:]
    assert [r["cause"]["summary"] for r in json.loads(status.stdout)["restarts"]] == said
    # Each attempt's output is kept: rank 1's first attempt (to its kill in epoch 2), then its second.
    first = ddpctl("logs", *run.key_args, str(run.run_dir), "--rank", "1", "--attempt", "0", env=run.env, cwd=run.cwd)
    assert "[GPU1] Epoch 2 |" in first.stdout and "Resuming" not in first.stdout, first.stdout + first.stderr
    second = ddpctl("logs", *run.key_args, str(run.run_dir), "--rank", "1", "--attempt", "1", env=run.env, cwd=run.cwd)
    assert "Resuming training from snapshot at Epoch 3" in second.stdout, second.stdout + second.stderr
    for logs in sorted(run.run_dir.glob("nodes/*/logs")) or [run.run_dir / "logs"]:  # pulled, or this machine's
        first_attempt = list(logs.glob("*/attempt_0/0/stdout.log"))
        assert len(first_attempt) == 1, sorted(str(p.relative_to(logs)) for p in logs.rglob("*"))
        assert "Epoch 0 |" in first_attempt[0].read_text(), logs
    # The protocol's epoch records: timing.jsonl, one row of `ddpctl report`'s table (its plots are not needed).
    (row,) = scaling_table([load_run(run.run_dir)])
    assert row.epochs == EPOCHS and row.steps_per_epoch == 8 and row.samples_per_s > 0 and row.model == "train.py"


def test_a_tutorial_script_on_this_machine(tmp_path: Path) -> None:
    run = run_tutorial(tmp_path, ["--gpus", "2"], ddpctl_env(), [], lambda run_id: [tmp_path])
    check_live_run(run)
    assert (tmp_path / "snapshot.pt").exists()  # locally the script runs in the current directory
    logs = ddpctl("logs", str(run.run_dir), "--rank", "1", "-n", "2", env=run.env, cwd=tmp_path)
    assert logs.returncode == 0 and logs.stdout.splitlines() == [f"[GPU1] Epoch {e} | Batchsize: 32 | Steps: 8"
                                                                 for e in (EPOCHS - 2, EPOCHS - 1)]
    wrong = ddpctl("logs", str(run.run_dir), "--rank", "2", env=run.env, cwd=tmp_path)
    assert wrong.returncode != 0 and wrong.stderr.strip().splitlines() == ["error: --rank 2: the run has ranks 0-1"]


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """Two hosts with this machine's python and torch, each its own login user."""
    yield from lent(two_hosts)


def test_a_tutorial_script_on_two_hosts(bed: Testbed, tmp_path: Path) -> None:
    key_args = ["-i", bed.client_key_path]
    hosts = [arg for h in bed.hosts for arg in ("--host", h.spec)]
    run = run_tutorial(tmp_path, [*hosts, "--gpus", "1"], ddpctl_env(known_hosts=bed.known_hosts_path), key_args,
                       lambda run_id: [Path(h.home) / ".ddpctl" / "runs" / run_id / "code" for h in bed.hosts])
    check_live_run(run)
    # Every rank's output, each from its node: 2 ranks on 2 nodes (the run on this machine has 2 on one).
    for rank in range(2):
        logs = ddpctl("logs", *key_args, str(run.run_dir), "--rank", str(rank), "-n", "2", env=run.env, cwd=tmp_path)
        assert logs.returncode == 0, logs.stderr
        last = [line for line in logs.stdout.splitlines() if '"ddpctl"' not in line]  # rank 0's protocol lines
        assert last[-1] == f"[GPU{rank}] Epoch {EPOCHS - 1} | Batchsize: 32 | Steps: 8"
    wrong = ddpctl("logs", *key_args, str(run.run_dir), "--rank", "2", env=run.env, cwd=tmp_path)
    assert wrong.returncode != 0 and "the run has ranks 0-1" in wrong.stderr
    # With the hosts gone (their links cut: nothing answers; the bed puts them back for the next module), a
    # finished run's logs come from the pulled copy.
    key = tmp_path / "key"
    key.write_bytes(Path(bed.client_key_path).read_bytes())
    key.chmod(0o600)
    for host in bed.hosts:
        host.link_down()
    gone = ddpctl("logs", "-i", str(key), str(run.run_dir), "--rank", "1", "-n", "1", "--connect-timeout", "2",
                  env=run.env, cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.splitlines() == [f"[GPU1] Epoch {EPOCHS - 1} | Batchsize: 32 | Steps: 8"]
    assert "showing the copy pulled" in gone.stderr
