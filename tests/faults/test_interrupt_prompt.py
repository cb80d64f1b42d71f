"""Ctrl-C (a real SIGINT sent to a real ddpctl process) ends promptly with one stated line: while connecting to a
host that does not answer (its SYNs dropped, so the connect would wait its whole timeout), and while `up` or
`ddpctl pull` copies a run's files back (no thread's traceback before the outcome, whenever it comes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from infra.testbed_host import TestHost
from launcher.transport.sync import PART_MARK
from tests.faults.fault_support import Up, last_line, wait_for
from tests.faults.test_pull_cut import WRITE_BIG, slow_egress
from tests.testbed_fixtures import REPO, TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)

PROMPT = 5.0  # seconds from SIGINT to the end: nothing may wait out a connect or transfer timeout


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


@contextlib.contextmanager
def unanswering(host: TestHost) -> Iterator[None]:
    """The host drops every SYN to its sshd: a connect waits its whole timeout, as to a host that is gone."""
    rule = ["INPUT", "-p", "tcp", "--dport", str(host.port), "-j", "DROP"]
    subprocess.run([*host.nsenter(), "iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run([*host.nsenter(), "iptables", "-D", *rule], check=False)


def start(bed: Testbed, *args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    command, *rest = args
    return subprocess.Popen([sys.executable, "-m", "launcher", command, "-i", bed.client_key_path, *rest], env=env,
                            cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def interrupt(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """SIGINT, then the seconds until the process ended and its stderr."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    return time.monotonic() - sent, err


@pytest.mark.parametrize(("command", "line"), [
    ("up", "error: interrupted by Ctrl-C while connecting to the hosts: nothing was started on any host; no run "
           "directory was made"),
    ("doctor", "error: interrupted by Ctrl-C"),
])
def test_ctrl_c_while_connecting_to_a_host_that_does_not_answer_ends_at_once(bed: Testbed, tmp_path: Path,
                                                                            command: str, line: str) -> None:
    gone = bed.hosts[1]
    hosts = [a for h in bed.hosts for a in ("--host", h.spec)]
    runs = ("--runs-dir", str(tmp_path / "runs")) if command == "up" else ()
    with unanswering(gone):
        proc = start(bed, command, *hosts, *runs, "--connect-timeout", "60", cwd=tmp_path)
        time.sleep(3)  # imported, connected to hosts[0], waiting on hosts[1]
        assert proc.poll() is None, proc.communicate()
        took, err = interrupt(proc)
    assert took <= PROMPT, f"{command} took {took:.1f} s to end after Ctrl-C:\n{err}"
    assert proc.returncode == 130
    assert err.strip().splitlines() == [line], err
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_during_the_pull_of_up_or_of_ddpctl_pull_says_one_outcome_and_no_traceback(bed: Testbed,
                                                                                          tmp_path: Path) -> None:
    host = bed.hosts[0]
    project = tmp_path / "project"
    project.mkdir()
    (project / "write_big.py").write_text(WRITE_BIG)
    with slow_egress(host):
        up = Up(bed, [host], tmp_path / "runs", "--gpus", "1", "--", "python3", "write_big.py", cwd=project)
        local_out = up.run / "nodes" / "0" / "out"

        def parts() -> set[str]:
            return {p.name for p in local_out.iterdir() if PART_MARK in p.name} if local_out.is_dir() else set()

        def pulling(before: frozenset[str] = frozenset()) -> bool:
            """A copy under way: a temporary file of its own (one a pull cut short left behind is not)."""
            return bool(parts() - before)

        wait_for("up's pull of big.bin", pulling, timeout=240, every=0.05)
        sent = time.monotonic()
        up.proc.send_signal(signal.SIGINT)
        code, err = up.finish(timeout=120)
        assert time.monotonic() - sent <= PROMPT and code == 130, err
        assert "Traceback" not in err and "Exception" not in err, err
        assert last_line(err) == (f"error: interrupted by Ctrl-C: the run had ended on every node; the pull was "
                                  f"interrupted: `ddpctl pull {up.run.name}` fetches what they wrote into {up.run}")

        for delay in (0.0, 1.0):  # `ddpctl pull`, cut at two points of its copy
            left = frozenset(parts())
            pull = start(bed, "pull", str(up.run), cwd=tmp_path)
            wait_for("ddpctl pull's copy of big.bin", lambda before=left: pulling(before), timeout=60, every=0.05)
            time.sleep(delay)
            took, err = interrupt(pull)
            assert took <= PROMPT and pull.returncode == 130, err
            assert "Traceback" not in err and "Exception" not in err, err
            assert last_line(err).startswith("error: interrupted"), err
    finished = start(bed, "pull", str(up.run), cwd=tmp_path)
    _out, err = finished.communicate(timeout=120)
    assert finished.returncode == 0, err
    assert (local_out / "big.bin").stat().st_size == 24 * 2**20
    assert not parts()  # what the pulls cut short left behind is gone once one pull is whole
