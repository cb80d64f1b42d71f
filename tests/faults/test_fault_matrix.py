"""The fault matrix on the SSH test bed: one real `ddpctl up` per fault (the two brief losses of contact with a
host, its link and its sshd, in turn in one run), on one shared two-host bed.

Each test asserts the outcome (exit status, the run's recorded events), the one line the user sees (key words),
that nothing was lost (what the hosts wrote before the fault is what was pulled, by sha256) and that no
torchrun or trainer process is left on any host. Disk full and hangs are in test_disk_full.py and test_hang.py,
failure attribution in test_failure_attribution.py."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.testbed import Testbed, TestHost
from launcher.planning.rdzv_reservation import RESERVATION_DIR, release_reservation, reserve_and_listen
from launcher.transport.ssh import CommandResult
from tests.faults.fault_support import (
    TINY,
    Up,
    assert_nothing_left_running,
    assert_nothing_lost,
    ddpctl,
    last_line,
    rank_0_hangs_at,
    sha256,
    tiny_steps_per_epoch,
    wait_for,
)
from tests.testbed_fixtures import REPO, TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
# Runs that only a fault (or the test) ends, and that wait for it without training: rank 0 stops at the first step
# after epoch 1's snapshots (those the tests compare with what was pulled), rank 1 waits for it in the collective.
LONG = ["--epochs", "500", *rank_0_hangs_at(tiny_steps_per_epoch(2) + 1)]


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """Two hosts, each its own login user, with this machine's python and torch; shared by every fault."""
    yield from lent(two_hosts)


def kinds(up: Up) -> list[str]:
    return [e["event"] for e in up.events()]


def outcome(up: Up) -> dict[str, object]:
    (last,) = [e for e in up.events() if e["event"] == "outcome"][-1:]
    return last


# -- interruptions of `up` ----------------------------------------------------------------------------------


@pytest.mark.parametrize("signals", [["SIGINT", "SIGINT"], ["SIGTERM"]], ids=["double-ctrl-c", "sigterm"])
def test_interrupting_up_stops_every_node_and_pulls_what_they_wrote(bed: Testbed, tmp_path: Path,
                                                                    signals: list[str]) -> None:
    """Ctrl-C twice in quick succession, SIGTERM: every node stopped, everything pulled, said in one line. SIGHUP
    is the next test's: a terminal closing sends it (the same handler; there the line is read from the events)."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, *LONG)
    before = up.wait_snapshots()
    for name in signals:
        up.proc.send_signal(getattr(signal, name))
        time.sleep(0.2)
    code, err = up.finish()
    cause = "Ctrl-C" if signals[0] == "SIGINT" else signals[0]
    assert code == 130, err
    line = last_line(err)
    assert f"interrupted by {cause}" in line and "stopped every node and pulled" in line, err
    assert str(up.run) in line
    if len(signals) > 1:
        assert "still stopping every node" in err, "the second Ctrl-C is told that the stop goes on"
    events = kinds(up)
    assert events.index("interrupted") < events.index("stopped") < events.index("outcome")
    assert outcome(up)["stopped"] is True and outcome(up)["pulled"] is True
    assert_nothing_lost(up, before)
    assert_nothing_left_running(bed.hosts)


def test_terminal_closing_stops_every_node_even_when_nothing_can_be_printed(bed: Testbed, tmp_path: Path) -> None:
    """`up` in a terminal that is closed mid-run: the kernel's SIGHUP, then every write fails (EIO); the nodes are
    stopped and pulled all the same, and the outcome (the line a terminal would have shown) is in the run's
    events."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, *LONG, terminal=True)
    before = up.wait_snapshots()
    assert up.terminal is not None
    shown = wait_for("the progress display", lambda: "node 1" in up.err_path.read_text(errors="replace"))
    assert shown
    up.terminal.close()
    code, _ = up.finish()
    assert code == 130, "the documented status, though nothing could be printed (was 1 or 120: EIO on the last line)"
    assert outcome(up)["stopped"] is True and outcome(up)["pulled"] is True
    said = str(outcome(up)["text"])
    assert "interrupted by SIGHUP" in said and "stopped every node and pulled" in said and str(up.run) in said, said
    events = kinds(up)
    assert events.index("interrupted") < events.index("stopped") < events.index("outcome")
    assert_nothing_lost(up, before)
    assert_nothing_left_running(bed.hosts)


# The host's python for `--python`: it stops at the step the test gates (every call, or the ship's creation of the
# code cache on a host that has none: `python -c SCRIPT mkdirs DIR`; the probe lists the cache), says so in a file,
# waits until the test opens the gate, then runs the hosts' python3 (the bed puts this machine's python with torch
# first on their PATH).
GATED_PYTHON = """#!/bin/sh
if {gated}; then
    touch {gate_dir}/reached
    while [ -d {gate_dir} ] && [ ! -e {gate_dir}/open ]; do sleep 0.05; done
fi
exec python3 "$@"
"""


def bed_reservations(bed: Testbed) -> set[Path]:
    """The reservations this bed's users hold (the directory is shared with every other bed on the machine)."""
    users = {pwd.getpwnam(h.user).pw_uid for h in bed.hosts}
    found = set()
    for path in Path(RESERVATION_DIR).glob("port-*"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_uid in users:
                found.add(path)
    return found


@pytest.mark.parametrize(("phase", "gated", "signal_name", "line"), [
    ("probe", "true", "SIGINT", "error: interrupted by Ctrl-C while probing the hosts: nothing was started on any "
                                "host; no run directory was made"),
    ("ship", '[ "$3" = mkdirs ]', "SIGTERM", "error: interrupted by SIGTERM while shipping the code to the hosts: "
                                               "nothing was started on any host; no run directory kept (it held only "
                                               "the plan)"),
    # The last step of the probe: node 0's port is reserved and node 1's probe, to be sent the port to connect to,
    # is held (its one argument is the probe's request); the reservation goes too.
    ("reserve", """echo "$3" | grep -q '"connect": "later"'""", "SIGINT",
     "error: interrupted by Ctrl-C while probing the hosts: nothing was started on any host; no run directory was "
     "made"),
], ids=["ctrl-c-while-probing", "sigterm-while-shipping", "ctrl-c-once-the-port-is-reserved"])
def test_interrupted_before_torchrun_starts_says_nothing_was_started(bed: Testbed, tmp_path: Path, phase: str,
                                                                    gated: str, signal_name: str, line: str) -> None:
    """Interrupted while the hosts are probed or the code is shipped: one line saying that nothing runs anywhere
    and what became of the run directory; exit 130; nothing in --runs-dir; no process left on the hosts."""
    gate_dir = Path(tempfile.mkdtemp(prefix=f"ddpctl-gate-{phase}-"))
    reserved_before = bed_reservations(bed)
    if phase == "ship":  # no code cache on the hosts (earlier runs made one): the ship creates it
        for host in bed.hosts:
            host.run_as_user(["rm", "-rf", f"{host.home}/.ddpctl/code"])
    try:
        os.chmod(gate_dir, 0o777)  # the hosts' login users say there that they reached the gate
        python = gate_dir / "gated-python"
        python.write_text(GATED_PYTHON.format(gated=gated, gate_dir=gate_dir))
        python.chmod(0o755)
        up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, "--python", str(python))
        wait_for(f"the {phase} to reach a host", (gate_dir / "reached").exists, timeout=120)
        if phase == "reserve":  # node 1 is held from its start; node 0's probe goes on to reserve the port
            wait_for("node 0's reservation", lambda: bed_reservations(bed) - reserved_before, timeout=60)
        up.proc.send_signal(getattr(signal, signal_name))
        code, err = up.finish(timeout=60)
        (gate_dir / "open").touch()  # what waited on the hosts now runs its step and ends (its connection is gone)
        assert code == 130, err
        assert last_line(err) == line, err
        assert "Traceback" not in err
        assert list((tmp_path / "runs").iterdir()) == [], "nothing half-written in --runs-dir"
        assert bed_reservations(bed) <= reserved_before, "a rendezvous port left reserved"
        assert_nothing_left_running(bed.hosts)
        wait_for("the gated steps to end on the hosts", lambda: not any(
            h.run_as_user(["pgrep", "-u", h.user, "-f", str(gate_dir)], check=False).stdout for h in bed.hosts),
            timeout=30)
    finally:
        (gate_dir / "open").touch()
        shutil.rmtree(gate_dir, ignore_errors=True)


def test_launcher_killed_then_status_pull_and_down_reattach(bed: Testbed, tmp_path: Path) -> None:
    """SIGKILL leaves no chance to say anything: the nodes run on, and status, pull and down reach them."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, *LONG)
    before = up.wait_snapshots()
    up.proc.send_signal(signal.SIGKILL)
    up.finish()
    status = ddpctl(bed, "status", str(up.run), "--json")
    assert status.returncode == 0, status.stderr
    assert [n["state"] for n in json.loads(status.stdout)["nodes"]] == ["running", "running"]
    pulled = ddpctl(bed, "pull", str(up.run))
    assert pulled.returncode == 0, pulled.stderr
    down = ddpctl(bed, "down", str(up.run))
    assert down.returncode == 0, down.stderr
    assert "stopped run" in down.stdout + down.stderr
    assert_nothing_lost(up, before)
    assert_nothing_left_running(bed.hosts)
    status = ddpctl(bed, "status", str(up.run), "--json")
    assert all(n["state"] != "running" for n in json.loads(status.stdout)["nodes"])

    # The pull interrupted (SIGKILL once its first file has come) then resumed: everything, verified.
    nodes = up.run / "nodes"
    subprocess.run(["rm", "-rf", str(nodes)], check=True)
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    pull = subprocess.Popen([sys.executable, "-m", "launcher", "pull", "-i", bed.client_key_path, str(up.run)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("the pull's first file", lambda: nodes.exists() and any(p.is_file() for p in nodes.rglob("*")),
             timeout=60, every=0.01)
    pull.kill()
    assert pull.wait() == -signal.SIGKILL, "the pull was cut before it finished"
    resumed = ddpctl(bed, "pull", str(up.run))
    assert resumed.returncode == 0, resumed.stderr
    assert_nothing_lost(up, before)


# -- faults on the nodes -------------------------------------------------------------------------------------


def test_worker_killed_without_restarts_fails_the_run_naming_the_node(bed: Testbed, tmp_path: Path) -> None:
    """Rank 1 (node 1's worker) SIGKILLs itself in epoch 2: the run fails, node 1 is named, the other node is
    stopped and what both wrote is pulled."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, "--epochs", "4", "--trainer-arg=--fault-kill",
            "--trainer-arg=1:20")
    before = up.wait_snapshots()
    code, err = up.finish()
    assert code == 1, err
    assert "node 1" in err and "training failed" in last_line(err), err
    assert "node_failed" in kinds(up)
    assert_nothing_lost(up, before)
    assert_nothing_left_running(bed.hosts)


def test_agent_killed_fails_the_run_and_leaves_no_worker(bed: Testbed, tmp_path: Path) -> None:
    """torchrun on node 1 SIGKILLed: its worker is orphaned; the run fails naming node 1, and no worker is left
    on either host."""
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, *LONG)
    before = up.wait_snapshots()
    os.kill(up.agent_pid(1), signal.SIGKILL)
    code, err = up.finish()
    assert code != 0, err
    assert "node 1" in err, err
    assert "node_failed" in kinds(up)
    assert_nothing_lost(up, before)
    assert_nothing_left_running(bed.hosts)


def test_worker_killed_with_restarts_mid_snapshot_write_resumes_from_a_whole_snapshot(bed: Testbed,
                                                                                       tmp_path: Path) -> None:
    """With --max-restarts 1, node 1's worker SIGKILLed while its snapshot file is being written: the half-written
    file is never used, the restarted workers resume from a whole snapshot (each epoch timed once) and the run
    completes; what the nodes wrote before the kill is pulled unchanged."""
    # The larger model's snapshot (about 10 MB) takes a few milliseconds to write; once epoch 1's is there the
    # directory is watched without pause, and eight epochs give six more writes to catch. Epochs of 4 steps per
    # rank: the write is as long as with more, the pauses between writes (watched without pause) are shorter.
    up = Up(bed, bed.hosts, tmp_path / "runs", *TINY, "--model", "mnist-cnn", "--synthetic-train-size", "256",
            "--epochs", "8", "--max-restarts", "1", "--json")
    snapshots = up.workspace(1) / "out" / "snapshots"
    worker = int(wait_for("node 1's worker", lambda: _children(up.agent_pid(1), "trainer"), timeout=150))
    wait_for("epoch 1's snapshot on node 1", lambda: "snapshot-epoch-000001.pt" in _listing(snapshots), timeout=150,
             every=0.05)
    seen = wait_for("a snapshot being written on node 1", lambda: [p for p in _listing(snapshots) if ".tmp-" in p],
                    timeout=150, every=0)
    os.kill(worker, signal.SIGKILL)
    # Epoch 1's snapshots, whole on both nodes before the kill (node 0's was written before epoch 2's steps, which
    # node 1 has done): a resume from a whole snapshot starts after them and never writes them again.
    first = "snapshot-epoch-000001.pt"
    before = {f"{k}/{first}": sha256(up.workspace(k) / "out" / "snapshots" / first) for k in range(len(bed.hosts))}
    code, err = up.finish()
    assert seen, "the worker was killed while a snapshot was being written"
    assert code == 0, err
    summary = json.loads(up.out_path.read_text())["summary"]
    assert summary["restarts"] == 1 and summary["epochs"] == 8
    assert [json.loads(x)["epoch"] for x in (up.run / "timing.jsonl").read_text().splitlines()] == list(range(1, 9))
    assert_nothing_lost(up, before)
    assert_nothing_left_running(bed.hosts)


def _listing(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _children(pid: int, pattern: str) -> int | None:
    """The child of `pid` whose command line matches `pattern`."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", pattern], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


# -- faults between the launcher and the hosts ------------------------------------------------------------


@dataclass
class ContactLost:
    """One run through both losses of contact with host 1, and what its hosts held before each."""

    up: Up
    before_link_down: dict[str, str]
    before_sshd_stop: dict[str, str]
    code: int
    err: str


@pytest.fixture(scope="module")
def contact_lost_and_back(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> ContactLost:
    """One 4-epoch run loses contact with host 1 twice, each time for a few seconds, then follows it to its end:
    first host 1's link goes down for 8 s (node 1 cut from node 0 and from `up`: the training waits), then, once
    it is back and the training moves on, host 1's sshd is stopped for 4 s with `up`'s open connection killed.
    Each of the two tests reads the run as its own fault left it: complete, and nothing written before lost."""
    up = Up(bed, bed.hosts, tmp_path_factory.mktemp("contact") / "runs", *TINY, "--epochs", "4", "--json")
    host = bed.hosts[1]
    before_link_down = up.wait_snapshots()
    host.link_down()
    try:
        time.sleep(8)
    finally:
        host.link_up()
    # The training moves again: every node writes a snapshot it had not written before the link went down.
    written = max(sum(key.startswith(f"{k}/") for key in before_link_down) for k in range(len(bed.hosts)))
    before_sshd_stop = up.wait_snapshots(written + 1)
    host.stop_sshd()
    try:
        # The launcher's open connection goes too (its per-connection sshd runs as the login user); a session
        # that ended since it was listed (one from before the link went down) is gone already.
        sessions = subprocess.run(["pgrep", "-u", host.user, "-x", "sshd"], capture_output=True, text=True)
        for pid in sessions.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(4)
    finally:
        host.start_sshd()
    code, err = up.finish()
    return ContactLost(up, before_link_down, before_sshd_stop, code, err)


def test_sshd_stopped_mid_run_and_back_the_run_completes(bed: Testbed, contact_lost_and_back: ContactLost) -> None:
    lost = contact_lost_and_back
    assert lost.code == 0, lost.err
    assert json.loads(lost.up.out_path.read_text())["summary"]["epochs"] == 4
    assert_nothing_lost(lost.up, lost.before_sshd_stop)
    assert_nothing_left_running(bed.hosts)


def test_link_down_and_up_the_run_completes(bed: Testbed, contact_lost_and_back: ContactLost) -> None:
    lost = contact_lost_and_back
    assert lost.code == 0, lost.err
    assert json.loads(lost.up.out_path.read_text())["summary"]["epochs"] == 4
    assert_nothing_lost(lost.up, lost.before_link_down)
    assert_nothing_left_running(bed.hosts)


# The first run's python: torchrun itself starts late (a slow host), so its port stays reserved, not bound, for a
# while after its nodes were started; every other command (probe, ship, pull) runs at once.
SLOW_TORCHRUN = """#!/bin/sh
case " $* " in *" torch.distributed.run "*) sleep 8 ;; esac
exec python3 "$@"
"""


def test_two_runs_on_the_same_hosts_at_once_both_complete(bed: Testbed, tmp_path: Path) -> None:
    """Both ship the same code to the hosts' one cache (each retries a copy the other disturbed) and both train.
    Neither is given a rendezvous port: the second probes node 0 after the first's probe ended and before its
    torchrun bound the port it picked, the moment two runs used to get the same port; the first run's reservation
    (launcher/planning/rdzv_reservation.py) sends the second to another one. Both reservations are released."""
    slow = Path(tempfile.mkdtemp(prefix="ddpctl-slow-python-", dir="/tmp"))  # readable by the hosts' users
    try:
        slow.chmod(0o755)
        (slow / "python3").write_text(SLOW_TORCHRUN)
        (slow / "python3").chmod(0o755)
        first = Up(bed, bed.hosts, tmp_path / "a", *TINY, "--epochs", "2", "--json", "--python",
                   str(slow / "python3"))
        wait_for("the first run's nodes to start", lambda: "started" in kinds(first), timeout=120)
        second = Up(bed, bed.hosts, tmp_path / "b", *TINY, "--epochs", "2", "--json")
        wait_for("the second run's nodes to start", lambda: "started" in kinds(second), timeout=120)
        ports = {up.run.name: json.loads((up.run / "plan.json").read_text())["rdzv_port"] for up in (first, second)}
        for run_id, port in ports.items():
            assert Path(RESERVATION_DIR, f"port-{port}-{run_id}").is_file(), f"{run_id} holds no reservation"
        results = [first.finish(), second.finish()]
    finally:
        shutil.rmtree(slow, ignore_errors=True)
    assert [code for code, _ in results] == [0, 0], (results, node_outputs(first), node_outputs(second))
    assert first.run.name != second.run.name
    assert len(set(ports.values())) == 2, "each run has a rendezvous port of its own"
    for up in (first, second):
        assert json.loads(up.out_path.read_text())["summary"]["epochs"] == 2
        assert_nothing_lost(up, {})
        assert not list(Path(RESERVATION_DIR).glob(f"port-*-{up.run.name}")), "a reservation was left behind"
    assert_nothing_left_running(bed.hosts)


class HostShell:
    """Runs argv on a bed host as its login user, in its network namespace, as a command over SSH would run."""

    def __init__(self, host: TestHost) -> None:
        self.host = host

    def run(self, argv: list[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        done = self.host.run_as_user(argv, check=False, timeout=timeout or 60, input=stdin)
        text = [stream.decode(errors="replace") for stream in (done.stdout, done.stderr)]
        return CommandResult(done.returncode, *text)


def test_an_explicit_rdzv_port_another_run_holds_is_refused_before_anything_is_written(bed: Testbed,
                                                                                      tmp_path: Path) -> None:
    """Another run's probe reserved a port on node 0's host and its torchrun has not started: `up --rdzv-port`
    with that port is refused in one line naming the port, the run and what to do; nothing is written."""
    host, holder = bed.hosts[0], "another-run-20260101-000000-abcd"
    shell = HostShell(host)
    port = reserve_and_listen(shell, "python3", host.spec, host.address, 29400, expect=0, seconds=15,
                              any_free=True, run_id=holder)
    workspaces = [sorted(Path(h.home, ".ddpctl", "runs").glob("*")) for h in bed.hosts]
    try:
        runs = tmp_path / "runs"
        hosts = [a for h in bed.hosts for a in ("--host", h.spec)]
        result = ddpctl(bed, "up", *hosts, "--runs-dir", str(runs), *TINY, "--rdzv-port", str(port))
        print(f"$ ddpctl up ... --rdzv-port {port}\n{result.stderr}")  # shown with pytest -rP
        assert result.returncode == 1, result.stderr
        line = last_line(result.stderr)
        assert f"rendezvous port {port} on node 0" in line and holder in line and "omit --rdzv-port" in line, \
            result.stderr
        assert "Traceback" not in result.stderr
        assert not runs.exists() or not any(runs.iterdir()), "a run directory was made"
        assert [sorted(Path(h.home, ".ddpctl", "runs").glob("*")) for h in bed.hosts] == workspaces
        held = bed_reservations(bed)  # this bed's: other beds' runs (other tests, at once) reserve meanwhile
        dry = ddpctl(bed, "up", *hosts, "--runs-dir", str(runs), *TINY, "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["rdzv_port"] != port, "a dry run planned a port another run holds"
        assert bed_reservations(bed) == held, "a dry run reserved a port"
    finally:
        assert release_reservation(shell, "python3", holder) == "released 1"


def node_outputs(up: Up) -> dict[str, str]:
    """The end of each node's torchrun output and the run's plan, to tell why a run failed."""
    found = {str(p.relative_to(up.runs)): p.read_text(errors="replace")[-3000:]
             for p in up.runs.glob("*/nodes/*/torchrun.out")}
    return {**found, "plan": next((p.read_text()[:2000] for p in up.runs.glob("*/plan.json")), "")}
