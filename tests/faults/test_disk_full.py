"""Fault: a disk fills up. On the SSH test bed, host 1's ~/.ddpctl/runs is a small tmpfs of its own (mounted
by the test, unmounted at the end); locally, --runs-dir is one. Each test asserts the outcome, the one line the
user sees, that what was written before comes back intact, and that nothing is left running."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, TestHost
from tests.plain_lines import unstamped
from tests.testbed_fixtures import REPO, lent, run_ddpctl

MIB = 1 << 20
# 32 steps per epoch per rank (a second or so an epoch on an idle machine), 30 epochs: the disk is filled between
# two snapshots, and the run fails long before it would end.
TRAIN = ["--synthetic-train-size", "2048", "--synthetic-test-size", "256"]
# The local run's: one process (what fills is the runs directory, not a rank's), the same 32 steps per epoch.
LOCAL_TRAIN = ["--gpus", "1", "--synthetic-train-size", "1024", "--synthetic-test-size", "256"]


class SmallDisk:
    """A tmpfs of `size_mib` mounted at `path` (owned by `owner`'s uid/gid), for one test module."""

    def __init__(self, path: Path, size_mib: int, uid: int = 0, gid: int = 0) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,uid={uid},gid={gid},mode=0755", "tmpfs",
                        str(path)], check=True, capture_output=True)  # fmt: skip
        self.filler = path / ".filler"

    def resize(self, size_mib: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size_mib}m", str(self.path)], check=True, capture_output=True)

    def free(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Take every free byte but `leave` (a filler file the run cannot remove)."""
        with open(self.filler, "ab") as f:
            for chunk in (MIB, 4096):
                try:
                    while self.free() - chunk >= leave:
                        f.write(b"\0" * chunk)
                        f.flush()
                except OSError:
                    pass

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
            # still busy (a test that failed left a process there): detach it now, it goes when they do
            subprocess.run(["umount", "-l", str(self.path)], check=True, capture_output=True)


def wait_for(what: str, found: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.1)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def events(run: Path) -> list[dict[str, object]]:
    path = run / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trainer_processes(host: TestHost) -> str:
    left = host.run_as_user(["pgrep", "-a", "-u", host.user, "-f", "torch.distributed.run|trainer"], check=False)
    out = left.stdout
    return (out.decode() if isinstance(out, bytes) else out).strip()


# --- on the SSH test bed ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


@pytest.fixture(scope="module")
def host1_disk(bed: Testbed) -> Iterator[SmallDisk]:
    """Host 1's run workspaces on a tmpfs of their own."""
    host = bed.hosts[1]
    host.run_as_user(["mkdir", "-p", f"{host.home}/.ddpctl/runs"])
    owner = os.stat(host.home)
    disk = SmallDisk(Path(host.home, ".ddpctl", "runs"), 96, owner.st_uid, owner.st_gid)
    try:
        yield disk
    finally:
        disk.unmount()


def test_preflight_refuses_a_host_without_room_and_writes_nothing(bed: Testbed, host1_disk: SmallDisk,
                                                                  tmp_path: Path) -> None:
    host1_disk.resize(8)
    try:
        result = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--host", bed.hosts[1].spec, "--gpus", "1",
                            "--runs-dir", str(tmp_path / "runs"), "--epochs", "2", *TRAIN)  # fmt: skip
    finally:
        host1_disk.resize(96)
    assert result.returncode != 0
    lines = [line.strip() for line in result.stderr.splitlines() if "needs" in line]
    assert len(lines) == 1, result.stderr
    assert re.search(r"needs [\d.]+ MiB free in ~/.ddpctl/runs .* but [\d.]+ MiB is free", lines[0]), lines[0]
    assert bed.hosts[1].spec.split("@")[-1].split(":")[0] in lines[0] or "2222" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    assert not list(host1_disk.path.iterdir())  # nothing started there


def test_a_host_disk_filling_up_mid_run(bed: Testbed, host1_disk: SmallDisk, tmp_path: Path) -> None:
    """Snapshot 1 is written; the disk then drops below the warning floor (told by name), then fills up: the
    next write fails, every rank leaves within seconds, `up` names node 1 and "no space left", snapshot 1 comes
    back from both nodes byte for byte, and no torchrun or trainer is left on either host."""
    runs = tmp_path / "runs"
    host1_disk.empty()
    env_runs = host1_disk.path
    filled: dict[str, float] = {}

    def fill_in_two_steps() -> None:
        try:
            wait_for("snapshot 1 on host 1", lambda: any(env_runs.glob("*/out/snapshots/snapshot-epoch-000001.pt")))
            host1_disk.fill(leave=4 * MIB)  # below the 16 MiB floor, room for a few more snapshots
            wait_for("the low-disk event", lambda: any(e["event"] == "low_disk" for r in runs.glob("*")
                                                       for e in events(r)), timeout=60)  # fmt: skip
            host1_disk.fill(leave=0)
            filled["at"] = time.time()
        except AssertionError as exc:
            filled["error"] = str(exc)  # type: ignore[assignment]

    filler = threading.Thread(target=fill_in_two_steps, daemon=True)
    filler.start()
    result = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--host", bed.hosts[1].spec, "--gpus", "1",
                        "--runs-dir", str(runs), "--epochs", "30", *TRAIN, timeout=400)  # fmt: skip
    filler.join(timeout=5)
    print(result.stderr)  # what the user saw (shown with pytest -s)
    assert "error" not in filled, filled
    assert result.returncode != 0, result.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    shown = unstamped(result.stderr)  # the lines as a terminal shows them, without a log's time stamps
    told = [line for line in shown.splitlines() if re.match(r"node 1 \(.*\): rank \d+: .*No space left", line)]
    assert len(told) == 1, result.stderr
    assert any(line.startswith("node 1 (") and "free in its run directory" in line
               for line in shown.splitlines()), result.stderr  # fmt: skip
    kinds = [str(e["event"]) for e in events(run)]
    assert kinds.index("low_disk") < kinds.index("rank_failed") < kinds.index("finished")
    # every rank left within seconds of the failure: the run was over (both nodes ended) soon after the disk filled
    finished = next(float(e["time"]) for e in events(run) if e["event"] == "finished")  # type: ignore[arg-type]
    assert finished - filled["at"] < 60, (finished - filled["at"], result.stderr)
    # what was written before the fault came back intact, from both nodes
    (workspace,) = [p for p in env_runs.iterdir() if p.is_dir()]
    host_files = {0: Path(bed.hosts[0].home, ".ddpctl", "runs", workspace.name), 1: workspace}
    for k, host_ws in host_files.items():
        snapshots = sorted((host_ws / "out" / "snapshots").glob("snapshot-epoch-*.pt"))
        assert snapshots, f"node {k} kept no snapshot"
        for snap in snapshots:
            pulled = run / "nodes" / str(k) / "out" / "snapshots" / snap.name
            assert sha256(pulled) == sha256(snap), snap
        assert not list((host_ws / "out" / "snapshots").glob(".snapshot-*"))  # no half-written snapshot left
    for host in bed.hosts:
        assert trainer_processes(host) == "", host.name
    host1_disk.empty()


# --- the local --runs-dir ------------------------------------------------------------------------------------


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for --runs-dir needs root")


def local_up(runs: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "launcher", "up", "--runs-dir", str(runs), *extra], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


@needs_root
def test_a_full_local_runs_dir_is_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    disk = SmallDisk(runs, 8)
    try:
        # too small from the start: refused before anything is written
        refused = local_up(runs, "--epochs", "2", *LOCAL_TRAIN)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 1
        assert err.strip().count("\n") == 0 and err.startswith(f"error: --runs-dir {runs}: this run needs"), err
        assert "MiB is free" in err and not list(runs.iterdir())
        # room at the start, full during the run
        disk.resize(80)
        proc = local_up(runs, "--epochs", "30", *LOCAL_TRAIN)
        wait_for("snapshot 1", lambda: any(runs.glob("*/snapshots/snapshot-epoch-000001.pt")))
        (run,) = [p for p in runs.iterdir() if p.is_dir()]
        first = run / "snapshots" / "snapshot-epoch-000001.pt"
        digest = sha256(first)
        disk.fill()
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: no space left on device under {runs} (") and " MiB free)" in last, err
        assert "Traceback" not in err and "training failed" not in err, err
        assert sha256(first) == digest  # the last good snapshot was never replaced by a failed write
        assert not list((run / "snapshots").glob(".snapshot-*"))
        left = subprocess.run(["pgrep", "-f", f"--out-dir {run}"], capture_output=True, text=True)
        assert left.stdout.strip() == "", left.stdout
    finally:
        disk.unmount()
