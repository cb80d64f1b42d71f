"""`ddpctl up` on this machine, end to end: real torchrun, two gloo processes, the synthetic data set.

Runs, Ctrl-C and restarts start ddpctl as a process (`ddpctl`); refusals, dry runs and the reattach commands on a
recorded run call its command line in this process (`ddpctl_in_process`: the same main(), its exit status, stdout
and stderr), as nothing about a process boundary is what they test."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.remote.proctree import alive, process_tree
from tests import cli_runner
from tests.cli_in_process import ddpctl_in_process

SMALL = ["--synthetic-train-size", "2048", "--synthetic-test-size", "512"]


REPO = Path(__file__).resolve().parent.parent


def ddpctl(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    try:
        return cli_runner.ddpctl(*args, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        # The killed launcher cannot stop torchrun (a session of its own): end what runs in this test's runs dir.
        if "--runs-dir" in args:
            subprocess.run(["pkill", "-KILL", "-f", args[args.index("--runs-dir") + 1]], check=False)
        raise


def only_run(runs: Path) -> Path:
    entries = [p for p in runs.iterdir()]
    assert len(entries) == 1, entries
    return entries[0]


def test_two_process_run_end_to_end(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = ddpctl("up", "--gpus", "2", "--epochs", "3", "--lr", "0.05", "--name", "e2e", "--runs-dir", str(runs),
                    "--json", *SMALL)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run = Path(out["run_dir"])
    assert run.parent == runs.resolve() and run.name.startswith("e2e-")
    for name in ("run.json", "events.jsonl", "timing.jsonl", "summary.json"):
        assert (run / name).is_file(), name
    assert any((run / "logs").rglob("*.log")), "each rank's output is kept under logs/"
    assert any((run / "snapshots").iterdir())
    record = json.loads((run / "run.json").read_text())
    assert record["spec"]["nproc_per_node"] == 2 and len(record["code_hash"]) == 16
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[0] == "started" and events[-1] == "exited"

    summary = json.loads((run / "summary.json").read_text())
    assert summary == out["summary"]
    timing = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    assert [t["epoch"] for t in timing] == [1, 2, 3]
    assert summary["world_size"] == 2 and all(t["world_size"] == 2 for t in timing)
    assert summary["epochs"] == 3
    assert summary["train_seconds"] == pytest.approx(sum(t["seconds"] for t in timing), rel=1e-6)
    assert summary["samples_per_s"] == pytest.approx(
        sum(t["samples"] for t in timing) / sum(t["seconds"] for t in timing), rel=1e-6)
    for t in timing:
        assert t["samples_per_s"] == pytest.approx(t["samples"] / t["seconds"], rel=1e-6)
        assert t["samples"] == 2048
    assert summary["final_val_acc"] == timing[-1]["val_acc"]
    assert summary["final_val_acc"] > 0.2, "above chance (10 classes)"


def test_user_script_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "my train.py"
    script.write_text(
        "import os, sys\n"
        "rank = os.environ['RANK']\n"
        "open(f'rank{rank}.txt', 'w').write(os.environ['WORLD_SIZE'] + ' ' + ' '.join(sys.argv[1:]))\n"
    )
    result = ddpctl("up", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(script),
                    "--flag", "a b", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "2 --flag a b"


def test_a_failed_run_shows_the_failing_workers_own_log(tmp_path: Path) -> None:
    """Not torchrun's ChildFailedError: the end of the failed rank's stderr, taken literally."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit('[rank1]: cannot read [/data/a] \\x1b[1mbold\\x1b[0m')\n"
        "time.sleep(60)\n"
    )
    result = ddpctl("up", "--gpus", "2", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(script),
                    cwd=tmp_path)
    assert result.returncode == 1
    assert "attempt_0/1/stderr.log:\n[rank1]: cannot read [/data/a] bold" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr


def test_local_runs_use_the_python_running_ddpctl(tmp_path: Path) -> None:
    """A venv's ddpctl run without activating the venv: python3 on PATH may lack torch; ddpctl's own has it."""
    result = ddpctl_in_process("up", "--dry-run", "--epochs", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    wrapper = rf" {re.escape(sys.executable)} \S+/runs/[^/ ]+/ddpctl_torchrun\.py "  # torchrun's, in the run dir
    assert re.search(wrapper, result.stdout), result.stdout
    hosts = ddpctl_in_process("up", "--dry-run", "--no-probe", "--host", "u@10.0.0.1", "--epochs", "1", cwd=tmp_path)
    assert " python3 ddpctl_torchrun.py " in hosts.stdout, hosts.stderr


def test_a_dry_run_whose_hosts_cannot_be_reached_prints_the_plan_and_its_unknowns(tmp_path: Path) -> None:
    """Two ports of this machine that refuse connections (bound, never listening): the plan is still printed,
    with what only the hosts could tell named as unknown; the error names both hosts; exit 1; nothing written."""
    import socket

    closed = [socket.socket(), socket.socket()]
    try:
        for sock in closed:
            sock.bind(("127.0.0.1", 0))
        hosts = [arg for k, sock in enumerate(closed)
                 for arg in ("--host", f"u{k}@127.0.0.1:{sock.getsockname()[1]}")]
        result = ddpctl_in_process("up", "--dry-run", "--json", *hosts, "--runtime", "auto", "--runs-dir",
                        str(tmp_path / "runs"), cwd=tmp_path)
    finally:
        for sock in closed:
            sock.close()
    assert result.returncode == 1
    plan = json.loads(result.stdout)
    assert [u.split(":")[0] for u in plan["unknown"]] == ["runtime", "processes per node", "rendezvous port",
                                                          "node addresses and network interfaces (shown as the "
                                                          "names given)"]
    assert result.stderr.startswith("error: the plan above was made without probing the hosts")
    assert result.stderr.count("connection refused") == 2
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--model", "vgg"], "unknown model 'vgg'"),
    (["--dataset", "imagenet"], "unknown data set 'imagenet'"),
    (["--epochs", "0"], "--epochs must be an integer >= 1"),
    (["--batch-size", "0"], "--batch-size must be an integer >= 1"),
    (["--gpus", "0"], "--gpus must be an integer >= 1"),
    (["--name", "a/b"], "is not a valid name"),
    (["--name", "n" * 44], "has 44 characters: at most 43"),
    pytest.param(["--dataset", "mnist", "--data-dir", "/nonexistent"], "data set mnist not found",
                 marks=pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                                          reason="torchvision is installed: the trainer may download the files")),
    (["--epochs", "many"], "Invalid value for '--epochs'"),
    (["--stall-timeout", "-1"], "--stall-timeout -1: give seconds >= 0"),
    (["--host", "h", "--detach", "--stall-timeout", "60"], "--stall-timeout acts while `up` follows the run"),
    # programs this machine cannot start, refused before the run directory exists
    (["--python", "/nonexistent/python", "--epochs", "1"], "--python '/nonexistent/python': there is no file"),
    (["--python", "no-such-python-here"], "no program 'no-such-python-here' on PATH"),
    (["--", "./no-such-script.sh"], "the command after `--`: there is no file ./no-such-script.sh"),
    (["--python", ""], "--python '' names no interpreter"),
    # values
    (["--name", ""], "--name '' is not a valid name"),
    (["--rdzv-port", "0"], "--rdzv-port must be between 1024 and 65535, got 0"),
    (["--host", "h", "--rdzv-port", "80"], "--rdzv-port must be between 1024 and 65535, got 80"),
    (["--host", "h", "--connect-timeout", "0"], "--connect-timeout 0: give a positive number of seconds"),
    (["--host", "h", "--connect-timeout", "-5"], "--connect-timeout -5: give a positive number of seconds"),
    (["--lr", "inf"], "--lr must be positive and finite, got inf"),
    (["--host", " h"], "--host ' h' has spaces around it"),
    (["--host", "u@-oProxyJump"], "is not of the form [user@]host[:port]"),
    (["--host", "-h"], "is not of the form [user@]host[:port]"),
    (["--host", "a", "--host", "a"], "--host 'a' is given twice: each node needs a host of its own"),
    (["--host", "root@gpu1:22", "--host", "root@GPU1:22"], "--host 'root@gpu1:22' and --host 'root@GPU1:22' are "
                                                           "the same host"),
    (["--host", "h", "--runtime", "docker", "--image", "Bad Tag"], "--image 'Bad Tag' is not a valid image reference"),
    (["--host", "h", "--runtime", "docker", "--registry", "-x"], "--registry '-x' is not a valid image reference: "
                                                                 "it must not begin with '-'"),
    # options that would be ignored where the run goes
    (["--nodes", "2"], "--nodes is for --provider vast or slurm"),
    (["--gpu-name", "RTX 3080", "--max-price", "0.4"], "--gpu-name and --max-price are for --provider vast only"),
    (["--host", "h", "--down", "--max-cost", "2"], "--down and --max-cost are for --provider vast only"),
    (["--host", "h", "--min-reliability", "0.9", "--disk", "50", "--ready-timeout", "60"],
     "--min-reliability, --disk and --ready-timeout are for --provider vast only"),
    (["--provider", "vast", "--image", "docker.io/you/ddpctl:1", "--registry", "docker.io/you/ddpctl:1"],
     "with --provider vast, --image is the registry reference each machine starts from: drop --registry"),
    (["--image", "ddpctl:latest"], "--image has no effect on a run on this machine"),
    (["--host", "h", "--registry", "docker.io/you/ddpctl:1"], "--registry names the image of --runtime docker"),
    (["--detach", "--stall-timeout", "60"], "--stall-timeout acts while `up` follows the run"),
    (["--identity-file", "key", "--accept-new-host-keys"], "--identity-file and --accept-new-host-keys have no "
                                                           "effect on a run on this machine"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    runs = tmp_path / "runs"
    result = ddpctl_in_process("up", "--runs-dir", str(runs), *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_unwritable_runs_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = ddpctl_in_process("up", "--runs-dir", str(blocker / "runs"), *SMALL)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "cannot write the run directory" in result.stderr


def test_runs_dir_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for command in (["up", "--epochs", "1", *SMALL], ["status"], ["logs"], ["pull"], ["down"]):
        result = ddpctl_in_process(*command, "--runs-dir", str(afile))
        assert result.returncode == 1, command
        assert result.stderr == f"error: --runs-dir {afile} is a file, not a directory: give a directory for run " \
                                "directories (it is created if missing)\n", command
    assert afile.read_text() == "keep me"


def test_a_python_that_cannot_be_started_is_one_line_and_the_run_is_recorded_as_ended(tmp_path: Path) -> None:
    # It passes the up-front check (an executable file) and fails at the start itself: its #! names nothing.
    fake = tmp_path / "python"
    fake.write_text("#!/nonexistent/interpreter\n")
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    result = ddpctl_in_process("up", "--python", str(fake), "--epochs", "1", "--runs-dir", str(runs), *SMALL)
    assert result.returncode == 1
    run = only_run(runs)
    lines = result.stderr.strip().splitlines()  # the log names the run first (plain output), then the one error
    assert len(lines) == 2 and lines[0].endswith(f" run {run.name} (its directory: {run})"), result.stderr
    lines = lines[1:]
    assert lines[0].startswith(f"error: could not start torchrun ({fake}: "), result.stderr
    assert "check --python" in lines[0] and "Traceback" not in result.stderr
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["exited"] and "could not start torchrun" in events[0]["error"]
    status = ddpctl_in_process("status", "--runs-dir", str(runs), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["nodes"][0]["state"] == "failed"


def local_run(runs: Path, **record: object) -> Path:
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    run_dir = RunDir.create(runs, RunSpec(run_id="local-run"), {"hosts": [], "provider": "local"})
    run_dir.update_record(**record)
    return run_dir.path


def test_logs_of_a_local_run_without_output_say_so_and_succeed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = local_run(runs, created=time.time() - 3600)  # it never started: no pid, long ago
    for follow in ([], ["-f"]):
        result = ddpctl_in_process("logs", "--runs-dir", str(runs), *follow)
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        assert result.stderr == "node 0 has no output yet (the run is starting, or it never started)\n"
    (run / "torchrun.out").write_text("".join(f"line {i}\n" for i in range(10)))
    result = ddpctl_in_process("logs", "--runs-dir", str(runs), "-n", "3")
    assert (result.returncode, result.stdout, result.stderr) == (0, "line 7\nline 8\nline 9\n", "")


@pytest.mark.parametrize("args, message", [
    (["--lines", "0"], "--lines must be at least 1, got 0"),
    (["-n", "-3"], "--lines must be at least 1, got -3"),
    (["--node", "1"], "--node 1: run local-run ran on this machine; it has node 0 only"),
    (["--connect-timeout", "0"], "--connect-timeout 0: give a positive number of seconds"),
])  # fmt: skip
def test_logs_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    local_run(tmp_path / "runs")
    result = ddpctl_in_process("logs", "--runs-dir", str(tmp_path / "runs"), *args)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"error: {message}\n"


def test_logs_follow_a_local_run_until_its_torchrun_ends(tmp_path: Path) -> None:
    from launcher.results.rundir import RunDir

    runs = tmp_path / "runs"
    run = local_run(runs)
    with open(run / "torchrun.out", "wb") as out:  # a stand-in for torchrun: output, a pause, more output, gone
        writer = subprocess.Popen(["sh", "-c", "echo first; sleep 2; echo second"], stdout=out)
    reaper = threading.Thread(target=writer.wait)  # reaped the moment it ends, as `up` reaps its torchrun
    reaper.start()
    try:
        RunDir(run).update_record(local_pid=writer.pid)
        result = ddpctl_in_process("logs", "-f", "--runs-dir", str(runs))
    finally:
        writer.kill()
        reaper.join()
    assert result.returncode == 0, result.stderr
    assert result.stdout == "first\nsecond\n"


def test_pull_refuses_a_local_run_and_down_of_an_ended_one_has_nothing_to_stop(tmp_path: Path) -> None:
    run = local_run(tmp_path / "runs", local_pid=999999)
    pull = ddpctl_in_process("pull", "--runs-dir", str(tmp_path / "runs"))
    assert pull.returncode == 1
    assert pull.stderr == (f"error: run local-run is a local run and `pull` is for runs on hosts: its files are "
                           f"already in {run}\n")
    down = ddpctl_in_process("down", "--runs-dir", str(tmp_path / "runs"))  # pid 999999 is no process: it ended
    assert down.returncode == 0, down.stderr
    assert down.stderr == f"run local-run ran on this machine and has ended: nothing to stop; its files are in {run}\n"


def test_down_stops_a_local_runs_pid_only_while_it_is_still_its_torchrun(tmp_path: Path) -> None:
    from launcher.remote.proctree import start_time
    from launcher.results.rundir import RunDir

    victim = subprocess.Popen(["sleep", "60"])  # the process the system gave the run's pid to after it ended
    try:
        run = local_run(tmp_path / "runs", local_pid=victim.pid, local_pid_start=str(int(start_time(victim.pid)) - 7))
        down = ddpctl_in_process("down", "--runs-dir", str(tmp_path / "runs"))
        assert down.returncode == 0, down.stderr
        assert "has ended: nothing to stop" in down.stderr
        assert victim.poll() is None  # never signalled: the pid is another process's now
        RunDir(run).update_record(local_pid_start=start_time(victim.pid))  # now it is the run's torchrun
        down = ddpctl_in_process("down", "--runs-dir", str(tmp_path / "runs"))
        assert down.returncode == 0, down.stderr
        assert down.stderr == (f"stopped run local-run on this machine (1 process(es) stopped, none left); its files "
                               f"are already here, nothing to pull: {run}\n")
        assert victim.wait(timeout=10) == -signal.SIGTERM
        status = ddpctl_in_process("status", "--runs-dir", str(tmp_path / "runs"), "--json")
        assert json.loads(status.stdout)["nodes"][0]["state"] == "stopped"
    finally:
        victim.kill()
        victim.wait()


class LocalConn:
    """A node's connection that runs its commands on this machine (the workspace is a local folder)."""

    def run(self, argv: list[str], timeout: float | None = None, stdin: bytes | None = None) -> object:
        from launcher.transport.ssh import CommandResult

        done = subprocess.run(list(argv), capture_output=True, timeout=timeout, input=stdin or b"")
        out, err = (stream.decode(errors="replace") for stream in (done.stdout, done.stderr))
        return CommandResult(done.returncode, out, err)


class LocalSession:
    labels = ["a", "b"]

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def conn(self, index: int) -> LocalConn:
        return LocalConn()


@pytest.mark.parametrize("follow", [False, True])
def test_logs_of_a_host_without_output_yet_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], follow: bool) -> None:
    import launcher.execute.hosts.run
    from launcher.cli.app import main
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    workspaces = [tmp_path / "node0", tmp_path / "node1"]
    for workspace in workspaces:
        workspace.mkdir()
    (workspaces[1] / "exit_code").write_text("1\n")  # node 1 ended before torchrun wrote a line
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="r2", nnodes=2),
                            {"hosts": [{"label": "a"}, {"label": "b"}], "provider": "ssh"})
    monkeypatch.setattr(launcher.execute.hosts.run, "reattach", lambda run_dir, options: LocalSession())
    monkeypatch.setattr(launcher.execute.hosts.run, "node_workspaces", lambda run_dir: [str(w) for w in workspaces])
    main(["logs", str(run_dir.path), "--node", "1", *(["-f"] if follow else [])])  # no SystemExit: status 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("node 1 has no output yet; waiting for it (Ctrl-C to stop)\n" if follow
                   else "node 1 has no output yet (the run is starting, or it never started)\n")


@pytest.mark.parametrize("args, message", [
    (["doctor", "--host", "a", "--gpus", "0"], "--gpus must be an integer >= 1, got 0"),
    (["doctor", "--host", "a", "--rdzv-port", "80"], "--rdzv-port must be between 1024 and 65535, got 80"),
    (["doctor", "--host", "a", "--python", ""], "--python '' names no interpreter"),
    (["doctor", "--host", "a", "--connect-timeout", "0"], "--connect-timeout 0: give a positive number of seconds"),
    (["doctor", "--host", "a", "--host", "a"], "--host 'a' is given twice"),
    (["doctor", "--host", "a "], "--host 'a ' has spaces around it"),
    (["offers", "--limit", "0"], "--limit must be at least 1, got 0"),
    (["offers", "--limit", "-1"], "--limit must be at least 1, got -1"),
    (["status", "--connect-timeout", "-1"], "--connect-timeout -1: give a positive number of seconds"),
])  # fmt: skip
def test_other_commands_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = ddpctl_in_process(*args, cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_stops_workers_and_leaves_a_consistent_run(tmp_path: Path) -> None:
    """One worker: the stop reaches torchrun's workers, which sit in sessions of their own, however many. Ctrl-C
    comes after the first of 50 epochs, while the run trains on."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "up", "--gpus", "1", "--epochs", "50", "--runs-dir",
                             str(runs), "--synthetic-train-size", "2048", "--synthetic-test-size", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # An epoch's timing record is written before its snapshot: wait for the snapshot itself.
            if list(runs.glob("*/snapshots/*.pt")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("training never finished an epoch")
        run = only_run(runs)
        pid = json.loads((run / "run.json").read_text())["local_pid"]
        tree = process_tree(pid)  # torchrun and its worker, which sits in a session of its own
        assert len(tree) >= 2, tree
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # an impatient second Ctrl-C must not cut the stop short
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    last = err.strip().splitlines()[-1]
    assert "interrupted by Ctrl-C" in last and "stopped torchrun" in last and str(run) in last, err
    assert "still stopping" in err and "not left running" in err, "the second Ctrl-C is told the stop goes on"
    assert [p for p in tree if alive(p)] == []
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[-3:] == ["interrupted", "stopped", "outcome"], events
    snapshots = sorted((run / "snapshots").glob("*.pt"))
    assert snapshots, "finished epochs keep their snapshots"
    assert not list((run / "snapshots").glob("*.tmp*")), "no half-written snapshot"


def test_killed_worker_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    """One worker, killed 16 steps into epoch 2 of 2 (64 steps an epoch): `up` counts torchrun's restart and the
    run resumes after epoch 1. Ranks of two resuming bitwise alike: tests/test_trainer_torchrun.py."""
    runs = tmp_path / "runs"
    result = ddpctl("up", "--gpus", "1", "--epochs", "2", "--max-restarts", "1", "--runs-dir", str(runs), "--json",
                    *SMALL, "--trainer-arg=--fault-kill", "--trainer-arg=0:80")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["restarts"] == 1 and summary["epochs"] == 2
    timing = [json.loads(line) for line in (only_run(runs) / "timing.jsonl").read_text().splitlines()]
    assert [t["epoch"] for t in timing] == [1, 2], "no epoch rerun after the restart"
    assert [t["restart_count"] for t in timing] == [0, 1], "epoch 2 is the restarted worker's"


def test_stop_tree_reaches_workers_in_sessions_of_their_own() -> None:
    """What a stuck torchrun leaves when only its process group is killed: workers in sessions of their own.
    The local runner's last resort (and the tests' clean-up) kills the whole tree."""
    from launcher.remote.proctree import process_tree, stop_tree

    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              "start_new_session=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not process_tree(parent.pid)[1:] and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = process_tree(parent.pid)[1:]
        stop_tree(parent.pid, 0)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the worker in its own session outlived stop_tree"
    finally:
        if parent.poll() is None:
            parent.kill()
