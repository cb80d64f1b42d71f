"""The node's host-side code (launcher/remote/node_start.py, node_state.py, node_stop.py and what they import) run
on this machine without SSH: against workspaces laid out like a host's, in-process where no process is needed
(unit), and as the hosts run it, `python -c PROGRAM`, with real processes to start, find and stop (integration).
What the hosts are sent is the modules' own text, and a poll or a failure costs one round trip per node."""

from __future__ import annotations

import ast
import base64
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from launcher.execute.failures.cause import report_failure
from launcher.execute.following.hang_watch import RunWatch
from launcher.execute.hosts.node_stops import stop_and_report
from launcher.execute.hosts.run import poll_states
from launcher.remote import attribution, node_report, node_start, node_state, node_stop, proctree, source_of
from launcher.remote.program import STDIN_LOADER
from launcher.results.rundir import RunDir
from launcher.runtimes.native import NodeState, encode_env, node_program, read_state, start_program, stop_node
from launcher.spec.run_spec import RunSpec
from launcher.transport.ssh import CommandResult

NODE_MODULES = (proctree, node_report, attribution, node_start, node_stop, node_state)


def sent_modules(text: str) -> list[tuple[str, str]]:
    """The (name, source) pairs a program built by launcher/remote/program.py defines on the host."""
    first = ast.parse(text.split("\n", 1)[0]).body[0]
    assert isinstance(first, ast.Assign)
    return list(ast.literal_eval(first.value))


def test_what_the_hosts_are_sent_is_the_modules_own_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sent_modules(node_program()) == [(m.__name__, source_of(m)) for m in NODE_MODULES]
    assert sent_modules(start_program()) == [(m.__name__, source_of(m)) for m in (proctree, node_start)]
    # No second copy: a change to a module's file is what the next program sends.
    changed = tmp_path / "node_stop.py"
    changed.write_text(source_of(node_stop) + "\n# changed here\n")
    monkeypatch.setattr(node_stop, "__file__", str(changed))
    assert dict(sent_modules(node_program()))["launcher.remote.node_stop"].endswith("# changed here\n")


class InProcess:
    """A host connection that answers the node program in this process (the unit tier starts no process): it
    checks that the argv is the real program and counts the round trips."""

    label = "here"

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        assert argv[1:4] == ["-S", "-c", STDIN_LOADER] and len(argv) == 5  # a line long, whatever the program
        assert stdin is not None and zlib.decompress(stdin).decode() == node_program()
        self.calls += 1
        # what main() prints (not main itself: the nodes are asked from threads at once, and stdout is shared)
        return CommandResult(0, json.dumps(node_state.answer(json.loads(argv[4]))) + "\n", "")


def _workspace(root: Path, exit_code: str | None, out_line: str = "") -> Path:
    ws = root
    (ws / "out" / "failures").mkdir(parents=True)
    (ws / "logs" / "r" / "attempt_0" / "0").mkdir(parents=True)
    (ws / "logs" / "r" / "attempt_0" / "0" / "stdout.log").write_text("epoch 1\nstep 7\n")
    (ws / "torchrun.out").write_text(out_line + "\n")
    if exit_code is not None:
        (ws / "exit_code").write_text(exit_code + "\n")
    return ws


def test_the_state_of_a_workspace_laid_out_like_a_hosts(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "ws", None)
    (ws / "pid").write_text(f"{os.getpid()}\n")
    (ws / "pid_start").write_text(f"{proctree.start_time(os.getpid())}\n")
    (ws / "out" / "progress.json").write_text('{"epoch": 1, "step": 7}')
    (ws / "out" / "failures" / "rank-00001.txt").write_text("1700000000.5 rank 1: ValueError: bad batch")
    (ws / "logs" / "r" / "attempt_0" / "ended.json").write_text('{"time": 1.0}')
    state = read_state(InProcess(), str(ws))
    assert (state.pid, state.alive, state.exit_code, state.label) == (os.getpid(), True, None, "running")
    assert state.progress == {"epoch": 1, "step": 7} and state.attempt == 0 and state.ended == {0: {"time": 1.0}}
    assert state.failures == ({"time": 1700000000.5, "text": "rank 1: ValueError: bad batch"},)
    assert state.last_logged.endswith("stdout.log: step 7") and state.disk_free and state.disk_free > 0
    (ws / "pid_start").write_text("1\n")  # the pid now names a process that started at another time: not ours
    assert read_state(InProcess(), str(ws)).alive is False
    assert read_state(InProcess(), str(tmp_path / "deleted")).workspace_gone


def test_an_environment_file_reads_back_exactly() -> None:
    env = (("A", "x'; $(touch y) `z`"), ("B", "line 1\nline 2 \\n \\\\ \\0101 %s \\"), ("C", ""))
    assert node_start.decode_env(encode_env(env)) == [(k.encode(), v.encode()) for k, v in env]


def _two_node_run(tmp_path: Path) -> tuple[RunDir, Any, list[InProcess]]:
    failed = _workspace(tmp_path / "ws0", "1", "RuntimeError: the data loader died")
    running = _workspace(tmp_path / "ws1", None)
    (running / "pid").write_text(f"{int(Path('/proc/sys/kernel/pid_max').read_text()) + 1}\n")  # no such process
    nodes = [{"index": i, "label": f"h{i}", "workspace": str(ws)} for i, ws in enumerate((failed, running))]
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="rt", nnodes=2, python=sys.executable),
                            {"provider": "ssh", "runtime": "native", "nodes": nodes})
    conns = [InProcess(), InProcess()]

    class Session:
        labels = ["h0", "h1"]

        def conn(self, index: int) -> InProcess:
            return conns[index]

        def label_of(self, index: int) -> str:
            return self.labels[index]

        def drop(self, index: int) -> None:
            pass

    return run_dir, Session(), conns


def test_one_round_trip_per_node_per_poll_and_per_failure(tmp_path: Path) -> None:
    """A poll brings everything the watch tells (failure notes, last lines); a failure stops the nodes still
    running and asks each how it ended in one more round trip per node (before: a poll, a node report, a stop
    and an attribution report, four per node)."""
    run_dir, session, conns = _two_node_run(tmp_path)
    states = poll_states(session, run_dir)  # type: ignore[arg-type]
    assert [c.calls for c in conns] == [1, 1]
    ended = (tmp_path / "ws0" / "exit_code").stat().st_mtime  # when node 0 ended comes with the poll too
    assert states[0] is not None and states[0].exit_time is not None and abs(states[0].exit_time - ended) < 5
    watch = RunWatch.for_run(session.labels, run_dir)
    still = [states[0], NodeState(1, None, True, None)]  # node 1 still running when the failure was seen
    watch.poll(still, time.monotonic())
    assert [c.calls for c in conns] == [1, 1]  # the watch asks nothing more
    record = report_failure(session, run_dir, still, stop_and_report)  # type: ignore[arg-type]
    assert [c.calls for c in conns] == [2, 2]
    assert record is not None and record["node"] == 0
    assert "exited with 1" in record["summary"] and "the data loader died" in record["summary"]
    assert [n["outcome"] for n in record["nodes"]] == ["failed: the cause", "stopped"]
    assert (tmp_path / "ws1" / "exit_code").read_text() == "143\n"  # the stop of node 1, in that round trip


def test_a_node_ending_between_the_two_reads_is_never_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: a node writes exit_code and then ends. Whichever of the liveness check and the exit_code read
    comes first, the node ends right after it; read in the right order it is "finished", never "lost"."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pid").write_text(f"{os.getpid()}\n")
    living = [True]

    def end_node() -> None:
        if living[0]:
            living[0] = False
            (ws / "exit_code").write_text("0\n")

    def alive(pid: int | None, started: str) -> bool:
        was = living[0]
        end_node()
        return was

    real_read = node_state._read

    def read(path: str) -> str:
        text = real_read(path)
        if path.endswith("exit_code"):
            end_node()
        return text

    monkeypatch.setattr(node_state, "_alive", alive)
    monkeypatch.setattr(node_state, "_read", read)
    state = read_state(InProcess(), str(ws))
    assert (state.exit_code, state.label) == (0, "finished")


# --- as the hosts run it: python -c PROGRAM, real processes ---------------------------------------------------------


class HomeHere:
    """Runs argv on this machine as sshd would on a host: through a shell, in `home` as the user's home."""

    label = "here"

    def __init__(self, home: Path, isolated: bool = False) -> None:
        self.home, self.isolated = home, isolated

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        if self.isolated:  # a python that cannot import launcher: the program must carry all it needs
            argv = [argv[0], "-I", "-S", *argv[1:]]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": str(self.home)}
        done = subprocess.run(["sh", "-c", shlex.join(argv)], cwd=self.home, env=env, capture_output=True,
                              timeout=timeout, input=stdin or b"")
        out, err = (stream.decode(errors="replace") for stream in (done.stdout, done.stderr))
        return CommandResult(done.returncode, out, err)


# A node command like torchrun's: it starts a "worker" in a session of its own, and both ignore SIGTERM.
NODE = ("import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " time.sleep(600)'], start_new_session=True)\n"
        "print('worker started', flush=True)\n"
        "time.sleep(600)\n")

# One like a Python trainer's: a SIGTERM handler that ends it cleanly, in it and in its worker (a stopped process
# with a handler acts on SIGTERM only once continued; one without a handler is ended by the kernel either way).
NODE_WITH_HANDLER = ("import signal, subprocess, sys, time\n"
                     "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                     "subprocess.Popen([sys.executable, '-c', 'import signal, sys, time; "
                     "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(600)'],"
                     " start_new_session=True)\n"
                     "print('worker started', flush=True)\n"
                     "time.sleep(600)\n")


def _start(conn: HomeHere, workspace: str, node: str = NODE) -> int:
    (conn.home / workspace / "code").mkdir(parents=True, exist_ok=True)
    result = conn.run([sys.executable, "-c", start_program(), workspace, workspace, "", "2", "", sys.executable, "-c",
                       node], timeout=60)
    assert result.exit_code == 0 and result.stdout.strip().isdigit(), result
    return int(result.stdout)


def _marked(conn: HomeHere, workspace: str) -> dict[int, str]:
    return proctree.marked_processes(*node_stop.run_marks(os.path.realpath(conn.home / workspace)))


def _wait_for(what: str, condition: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.1)


@pytest.fixture
def lookalikes(tmp_path: Path) -> Any:
    """Processes of this user that are not the run's: one with the node marker for another workspace, one with
    another run's output folder in its environment. Nothing may signal them."""
    other = str(tmp_path / "other-run")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", node_start.NODE_MARKER, other]),
             subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**os.environ, node_start.OUTPUT_DIR_ENV: other + "/out"})]
    yield procs
    for proc in procs:
        assert proc.poll() is None, "a process that is not the run's was signalled"
        proc.kill()
        proc.wait()


@pytest.mark.integration
def test_a_node_started_polled_and_stopped_as_on_a_host(tmp_path: Path, lookalikes: Any) -> None:
    conn = HomeHere(tmp_path, isolated=True)
    pid = _start(conn, "ws")
    _wait_for("worker", lambda: len(_marked(conn, "ws")) >= 3)  # the supervisor, the command, its worker
    state = read_state(conn, "ws", python=sys.executable)
    assert (state.pid, state.alive, state.label) == (pid, True, "running")
    assert state.last_logged == "torchrun.out: worker started"
    # `ps` on the host shows the supervisor as a file in the workspace, not its program's text
    supervisor = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert supervisor[1:4] == [b"-S", os.fsencode(conn.home / "ws" / node_start.SUPERVISOR_FILE),
                               node_start.NODE_MARKER.encode()], supervisor
    assert b"_SOURCES" not in b" ".join(supervisor) and b"_LOADER" not in b" ".join(supervisor)
    after = stop_node(conn, "ws", sys.executable, grace_seconds=1, report=True)
    assert after.stopped is not None and after.stopped["found_by"] == "pid file"
    assert set(_marked(conn, "ws")) == set(), "left running"
    assert after.exit_code == 143 and after.report is not None and after.report["exit_code"] == 143
    assert stop_node(conn, "ws", sys.executable).stopped == {"signalled": [], "found_by": ""}  # ended: no signal


@pytest.mark.integration
def test_a_node_whose_workspace_was_deleted_is_found_by_its_marks_and_stopped(tmp_path: Path,
                                                                            lookalikes: Any) -> None:
    conn = HomeHere(tmp_path, isolated=True)
    _start(conn, "runs/r1")
    _wait_for("worker", lambda: len(_marked(conn, "runs/r1")) >= 3)
    ours = set(_marked(conn, "runs/r1"))
    shutil.rmtree(tmp_path / "runs" / "r1")  # deleted by someone, pid file and all
    assert read_state(conn, "runs/r1", python=sys.executable).label == "workspace gone"
    after = stop_node(conn, "runs/r1", sys.executable, grace_seconds=1)
    assert after.workspace_gone and after.stopped is not None
    assert after.stopped["found_by"] == "marks" and set(after.stopped["signalled"]) == ours
    for pid in ours:
        _wait_for(f"end of {pid}", lambda pid=pid: not proctree.alive(pid), timeout=10)
    again = stop_node(conn, "runs/r1", sys.executable, grace_seconds=1)
    assert again.stopped == {"signalled": [], "found_by": ""}  # nothing of the run is left to find


@pytest.mark.integration
def test_a_frozen_node_whose_workspace_was_deleted_is_stopped_without_waiting_out_the_grace(tmp_path: Path) -> None:
    """Stopped processes (SIGSTOP: a job-control stop, a debugger) get SIGTERM and SIGCONT: they end at once."""
    conn = HomeHere(tmp_path, isolated=True)
    _start(conn, "runs/r2", NODE_WITH_HANDLER)
    _wait_for("worker", lambda: len(_marked(conn, "runs/r2")) >= 3)
    ours = set(_marked(conn, "runs/r2"))
    for pid in ours:
        os.kill(pid, signal.SIGSTOP)
    shutil.rmtree(tmp_path / "runs" / "r2")
    started = time.monotonic()
    after = stop_node(conn, "runs/r2", sys.executable, grace_seconds=30)
    assert after.stopped is not None and set(after.stopped["signalled"]) == ours
    assert time.monotonic() - started < 20, "waited out the grace: the frozen processes never saw SIGTERM"
    for pid in ours:
        _wait_for(f"end of {pid}", lambda pid=pid: not proctree.alive(pid), timeout=10)


@pytest.mark.integration
def test_a_stop_never_signals_a_process_that_took_a_recorded_pid(tmp_path: Path) -> None:
    conn = HomeHere(tmp_path)
    (tmp_path / "ws").mkdir()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        (tmp_path / "ws" / "pid").write_text(f"{victim.pid}\n")  # the node's pid, now another process's
        (tmp_path / "ws" / "pid_start").write_text("1\n")
        after = stop_node(conn, "ws", sys.executable, grace_seconds=1)
        assert after.stopped == {"signalled": [], "found_by": ""}
        assert victim.poll() is None
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


@pytest.mark.integration
def test_the_node_gets_its_environment_file_and_the_workspace_paths_before_its_own(tmp_path: Path) -> None:
    conn = HomeHere(tmp_path)
    ws = tmp_path / "ws"
    (ws / "code").mkdir(parents=True)
    (ws / "env").write_bytes(encode_env((("PYTHONPATH", "/users/own"), ("K", "a\nb"))))
    show = "import json, os; print(json.dumps([os.environ[k] for k in ('PYTHONPATH', 'K', 'DDPCTL_OUTPUT_DIR')]))"
    result = conn.run([sys.executable, "-c", start_program(), "ws", "ws", "env", "2", "", sys.executable, "-c", show])
    assert result.exit_code == 0, result
    _wait_for("exit_code", lambda: (ws / "exit_code").exists())
    real = os.path.realpath(ws)
    assert json.loads((ws / "torchrun.out").read_text()) == [f"{real}/hook:{real}/code:/users/own", "a\nb",
                                                              f"{real}/out"]
    assert not (ws / "env").exists() and (ws / "exit_code").read_text() == "0\n"


def test_the_start_writes_the_nodes_files_inside_its_workspace_only(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The files that come with the start (environment file, join hook) land in the workspace with their modes;
    a path that leaves the workspace is refused, whatever sent it."""
    monkeypatch.chdir(tmp_path)

    def payload(*files: tuple[str, bytes, int]) -> list:
        return [[p, base64.b64encode(d).decode(), m] for p, d, m in files]

    assert node_start.write_files(payload(("env", b"K=v\n", 0o600), ("hook/sitecustomize.py", b"x = 1\n", 0o644))) \
        is None
    assert (tmp_path / "env").read_bytes() == b"K=v\n" and (tmp_path / "env").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "hook" / "sitecustomize.py").stat().st_mode & 0o777 == 0o644
    for bad in ("../escape", "/etc/passwd", "a//b", "hook/../../x"):
        assert "not a path inside the workspace" in str(node_start.write_files(payload((bad, b"", 0o600))))
    assert not (tmp_path.parent / "escape").exists()
    (tmp_path / "elsewhere").write_bytes(b"kept\n")
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")  # a link where a file goes is not written through
    assert node_start.write_files(payload(("linked", b"K=v\n", 0o600))) is not None
    assert (tmp_path / "elsewhere").read_bytes() == b"kept\n"
    assert isinstance(node_start.read_request(b"not json"), str) and node_start.read_request(b"") == ([], None)
