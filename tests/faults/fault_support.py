"""What the fault-matrix tests share: `up` started as a user starts it (a subprocess), waiting for what a run
writes on its hosts, the checks every fault ends with (nothing lost, nothing left running)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import select
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed, TestHost
from tests.cli_runner import ddpctl_on_bed
from tests.testbed_fixtures import REPO

TINY_TRAIN_SIZE, BATCH_SIZE = 1024, 32  # TINY's training samples, the trainer's default batch per rank
# Tiny runs: one worker per node, a small model, 16 steps of 32 samples per epoch per rank; every snapshot kept,
# so that what a host wrote before a fault is still there to compare with what was pulled.
TINY = ["--gpus", "1", "--model", "mnist-cnn-small", "--synthetic-train-size", str(TINY_TRAIN_SIZE),
        "--synthetic-test-size", "64", "--trainer-arg=--keep-snapshots", "--trainer-arg=1000"]


def tiny_steps_per_epoch(ranks: int) -> int:
    """Steps per epoch of a TINY run over `ranks` ranks (one per node)."""
    return TINY_TRAIN_SIZE // ranks // BATCH_SIZE


def rank_0_hangs_at(step: int) -> list[str]:
    """`up` arguments for a run that must outlast what a test does to it without training all that while: global
    rank 0 stops responding at global step `step` (the trainer's --fault-hang) and the other ranks wait for it in
    the collective, asleep. It still runs (status says so) and a stop still ends it (the hung rank sleeps in
    Python, which SIGTERM interrupts; the others' collective fails once it is gone)."""
    return ["--trainer-arg=--fault-hang", f"--trainer-arg=0:{step}"]


# Processes a run leaves on a host if it is not stopped: the node's command and what it started.
RUN_PROCESSES = "torchrun|trainer|ddpctl-node|fault_script"


def wait_for(what: str, condition: Callable[[], Any], timeout: float = 120, every: float = 0.1) -> Any:
    """Poll until `condition()` is truthy; return its value (fail naming `what` after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Up:
    """One `ddpctl up --host ... --host ...` as a subprocess, its output in files beside the runs directory."""

    def __init__(self, bed: Testbed, hosts: list[TestHost], runs: Path, *args: str, cwd: Path | None = None,
                 terminal: bool = False) -> None:
        """`terminal`: in a terminal of its own (a pseudo-terminal, its controlling one), as a user runs it."""
        self.bed, self.hosts, self.runs = bed, hosts, runs
        runs.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = runs.parent / f"{runs.name}.out", runs.parent / f"{runs.name}.err"
        host_args = [a for h in hosts for a in ("--host", h.spec)]
        env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path), "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "launcher", "up", "-i", bed.client_key_path, *host_args, "--runs-dir",
                str(runs), *args]
        self.terminal: Terminal | None = None
        STARTED.append(self)
        if terminal:
            self.terminal = Terminal(self.err_path)
            self.proc = self.terminal.start(argv, env)
            return
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    @property
    def run(self) -> Path:
        return wait_for("the run directory", lambda: next((p for p in self.runs.iterdir() if p.is_dir()
                                                           and not p.name.startswith(".")), None))  # not staging

    def workspace(self, node: int) -> Path:
        """Node `node`'s workspace on its host (hosts share this machine's file system)."""
        return Path(self.hosts[node].home, ".ddpctl", "runs", self.run.name)

    def events(self) -> list[dict[str, Any]]:
        path = self.run / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_snapshots(self, count: int = 1, timeout: float = 150) -> dict[str, str]:
        """Wait until every node has written `count` snapshots; return what they hold: {node/name: sha256}."""
        def written() -> dict[str, str] | None:
            found = {k: sorted((self.workspace(k) / "out" / "snapshots").glob("*.pt")) for k in range(len(self.hosts))}
            if all(len(files) >= count for files in found.values()):
                return {f"{k}/{p.name}": sha256(p) for k, files in found.items() for p in files}
            return None

        try:
            return dict(wait_for(f"{count} snapshot(s) on every node", written, timeout, every=0.2))
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.nodes_told()}") from None

    def nodes_told(self, most: int = 3000) -> str:
        """What a failed wait shows: `up`'s stderr so far and each node's workspace files and the end of its
        torchrun.out (the supervisor's own traceback, if it failed, is there)."""
        told = [f"up's stderr:\n{self.err_path.read_text(errors='replace')[-most:]}"]
        for k in range(len(self.hosts)):
            workspace = self.workspace(k)
            names = sorted(p.name for p in workspace.iterdir()) if workspace.is_dir() else "no workspace"
            out = workspace / "torchrun.out"
            tail = out.read_text(errors="replace")[-most:] if out.is_file() else "(none)"
            told.append(f"node {k}: {names}; torchrun.out ends:\n{tail}")
        return "\n".join(told)

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        """Wait for `up` to end; its exit status and stderr."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, self.err_path.read_text(errors="replace")

    def stop_if_running(self) -> None:
        """After its test: an `up` still running (the test failed before it ended it) is stopped as a user stops
        it (SIGTERM: every node stopped and pulled), killed if that takes over a minute; then whatever of the run
        is still on a host is killed, so that one failing test does not fail the next ones on the shared bed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.terminal is not None and not self.terminal.closed.is_set():
            self.terminal.close()
        for host in self.hosts:
            if running_processes(host):
                host.run_as_user(["pkill", "-KILL", "-u", host.user, "-f", RUN_PROCESSES], check=False)

    def node_pid(self, node: int) -> int:
        """The pid of the node's command wrapper (the `pid` file): torchrun is its child."""
        return int(wait_for("the node's pid file", lambda: _read(self.workspace(node) / "pid")))

    def agent_pid(self, node: int) -> int:
        """torchrun's pid on a node."""
        wrapper = self.node_pid(node)
        return int(wait_for("torchrun", lambda: _children(wrapper)))


# Every `up` a test started, stopped after the test if it still runs (`stop_leftover_ups`).
STARTED: list[Up] = []


@pytest.fixture(autouse=True)
def stop_leftover_ups() -> Iterator[None]:
    """An `up` a test left running (it failed half-way) is stopped before the next test."""
    yield
    while STARTED:
        STARTED.pop().stop_if_running()


class Terminal:
    """A pseudo-terminal that a command runs in as its controlling terminal; what it shows is copied to a file.
    `close()` is the terminal window closing: the kernel hangs up (SIGHUP) and every later write fails."""

    def __init__(self, copy_to: Path) -> None:
        self.master, self.slave = pty.openpty()
        self.copy_to = copy_to
        copy_to.write_bytes(b"")  # there from the start: a reader may look before the terminal shows anything
        self.closed = threading.Event()
        self.reader = threading.Thread(target=self._copy, daemon=True)

    def start(self, argv: list[str], env: dict[str, str], term: str = "xterm-256color") -> subprocess.Popen[bytes]:
        """`term`: the terminal's TERM, as a terminal window sets it (the suite's own, dumb under `env -i
        TERM=dumb` or none under cron, is not the terminal's)."""
        def take_terminal() -> None:  # runs in the child after setsid(): the terminal becomes its controlling one
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = {**env, "TERM": term}
        proc = subprocess.Popen(argv, env=env, stdin=self.slave, stdout=self.slave, stderr=self.slave,
                                start_new_session=True, preexec_fn=take_terminal)
        os.close(self.slave)
        self.reader.start()
        return proc

    def _copy(self) -> None:
        with open(self.copy_to, "ab") as out:
            while not self.closed.is_set():
                if select.select([self.master], [], [], 0.1)[0]:
                    try:
                        data = os.read(self.master, 65536)
                    except OSError:
                        return
                    if not data:
                        return
                    out.write(data)
                    out.flush()

    def close(self) -> None:
        self.closed.set()
        self.reader.join()
        os.close(self.master)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _children(pid: int) -> int | None:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_nothing_lost(up: Up, before: dict[str, str]) -> None:
    """Every file written on the hosts before the fault was pulled, byte for byte; and every snapshot the hosts
    hold now equals the pulled copy."""
    for key, digest in before.items():
        node, name = key.split("/")
        pulled = up.run / "nodes" / node / "out" / "snapshots" / name
        assert pulled.exists() and sha256(pulled) == digest, f"{key} lost or changed"
    for k in range(len(up.hosts)):
        for remote in (up.workspace(k) / "out" / "snapshots").glob("*.pt"):
            pulled = up.run / "nodes" / str(k) / "out" / "snapshots" / remote.name
            assert pulled.exists() and sha256(pulled) == sha256(remote), f"node {k}: {remote.name} not pulled"


def running_processes(host: TestHost) -> str:
    """The run processes still on a host (`pgrep -a`), or '' when none."""
    result = host.run_as_user(["pgrep", "-a", "-u", host.user, "-f", RUN_PROCESSES], check=False)
    return result.stdout.decode(errors="replace").strip()


def assert_nothing_left_running(hosts: list[TestHost], timeout: float = 10) -> None:
    """No torchrun, trainer or node command on any host (a few seconds allowed for exits already under way)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: running_processes(h) for h in hosts}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert not any(left.values()), f"left running: {left}"


def last_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else ""


def ddpctl(bed: Testbed, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Another ddpctl command (status, pull, down) on a run, trusting the bed's host keys."""
    return ddpctl_on_bed(bed, *args, timeout=timeout)


