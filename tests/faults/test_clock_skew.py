"""A host whose clock is off: the network namespaces of the test bed share this machine's kernel clock, so the
host's SSH sessions get libfaketime (LD_PRELOAD through ~/.ssh/environment): every program ddpctl starts there,
the probe's python included, reads a wall clock FAKETIME seconds off this machine's (monotonic clocks untouched,
as on a real host whose clock is wrong). `doctor` measures each host's offset and says when the skew between
nodes matters; `up` refuses such a skew before anything starts, where torchrun would otherwise drop a node."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from infra.testbed_host import TestHost
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, lent, run_ddpctl

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SKEW_VARIABLES = ("LD_PRELOAD", "FAKETIME", "DONT_FAKE_MONOTONIC")

pytestmark = [
    pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON),
    pytest.mark.skipif(not Path(FAKETIME_LIB).exists(),
                       reason="libfaketime is not installed (infra/setup.sh --test installs it)"),
]


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    yield from lent(two_hosts)


@pytest.fixture
def skewed(bed: Testbed) -> Iterator[TestHost]:
    """hosts[1], whose clock `set_skew` moves; back to this machine's clock afterwards."""
    host = bed.hosts[1]
    yield host
    host.set_ssh_environment({k: v for k, v in host.ssh_environment().items() if k not in SKEW_VARIABLES})


def set_skew(host: TestHost, seconds: int) -> None:
    host.update_ssh_environment({"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"{seconds:+d}", "DONT_FAKE_MONOTONIC": "1"})


def host_clock_offset(bed: Testbed, host: TestHost) -> float:
    """What the host's own `date` says against this machine's, over a login shell: the skew is real there."""
    before = time.time()
    said = subprocess.run(["ssh", "-i", bed.client_key_path, "-p", str(host.port), "-o", "BatchMode=yes",
                           "-o", f"UserKnownHostsFile={bed.known_hosts_path}", f"{host.user}@{host.address}",
                           "date +%s.%N"], capture_output=True, text=True, timeout=30, check=True).stdout
    return float(said) - (before + time.time()) / 2


def free_port() -> str:
    """A port of its own for the rendezvous check: reservations are kept on the file system every bed shares, so
    another bed's run on the default port would be named as holding it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def doctor(bed: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ddpctl(bed, "doctor", *(a for h in bed.hosts for a in ("--host", h.spec)), "--rdzv-port", free_port(),
                      *args, timeout=180)


def test_a_host_ten_minutes_behind_is_measured_and_named_by_doctor(bed: Testbed, skewed: TestHost) -> None:
    set_skew(skewed, -600)
    assert host_clock_offset(bed, skewed) == pytest.approx(-600, abs=2)  # the host's own clock is 10 min behind
    report = doctor(bed, "--json")
    assert report.returncode == 1, report.stderr
    data = json.loads(report.stdout)
    rows = {row["host"]: row for row in data["hosts"]}
    on_time, late = rows[bed.hosts[0].spec]["clock"], rows[skewed.spec]["clock"]
    assert abs(on_time["offset_s"]) <= on_time["uncertainty_s"] + 0.01
    assert abs(late["offset_s"] + 600) <= late["uncertainty_s"] + 0.01 and late["uncertainty_s"] < 1
    skew = data["clock_skew"]
    assert (skew["ahead"], skew["behind"], skew["matters"], skew["limit_s"]) == (bed.hosts[0].spec, skewed.spec,
                                                                                 True, 10.0)
    assert skew["seconds"] == pytest.approx(600, abs=1) and data["ok"] is False
    [problem] = data["problems"]
    said = re.match(rf"{re.escape(bed.hosts[0].spec)}'s clock is (\d+\.\d) s ahead of {re.escape(skewed.spec)}'s \(± ",
                    problem)
    assert said and abs(float(said[1]) - 600) <= late["uncertainty_s"] + 0.1, problem  # as measured, to 0.1 s
    assert "split the run" in problem

    table = doctor(bed)
    assert table.returncode == 1
    # The table's clock column (folded in a narrow pipe): the host's offset; each host itself is ready.
    assert re.search(r"│ -(599\.\d|600\.\d) ", table.stdout), table.stdout
    assert [line.split("│")[-2].strip() for line in table.stdout.splitlines() if line.startswith("│ ")
            and line.split("│")[-2].strip()] == ["yes", "yes"], table.stdout
    assert "s ahead of" in table.stderr and "timedatectl set-ntp true" in table.stderr


def test_a_skew_within_the_limit_is_measured_and_allowed(bed: Testbed, skewed: TestHost) -> None:
    set_skew(skewed, +4)
    report = doctor(bed, "--json")
    assert report.returncode == 0, report.stdout + report.stderr
    data = json.loads(report.stdout)
    late = {row["host"]: row for row in data["hosts"]}[skewed.spec]["clock"]
    assert abs(late["offset_s"] - 4) <= late["uncertainty_s"] + 0.01
    assert data["clock_skew"]["matters"] is False and data["ok"] is True
    table = doctor(bed)
    assert table.returncode == 0
    told = " ".join((table.stdout + table.stderr).split())  # a line folded at the terminal's width, read whole
    said = re.search(rf"clocks: {re.escape(skewed.spec)} is (\d+(?:\.\d)?) s ahead of {re.escape(bed.hosts[0].spec)} "
                     r"\(± ([\d.]+) s\), within the 10 s torchrun's rendezvous tolerates", told)
    # as this second measurement found it, within its own ± (a loaded machine widens it), shown to 0.1 s
    assert said and abs(float(said[1]) - 4) <= float(said[2]) + 0.1, told


def test_up_refuses_a_skew_that_would_split_the_run_before_anything_starts(bed: Testbed, skewed: TestHost,
                                                                           tmp_path: Path) -> None:
    set_skew(skewed, +300)
    up = run_ddpctl(bed, "up", *(a for h in bed.hosts for a in ("--host", h.spec)), "--rdzv-port", free_port(),
                    "--epochs", "1",
                    "--synthetic-train-size", "64", "--synthetic-test-size", "32", "--runs-dir", str(tmp_path / "runs"),
                    cwd=tmp_path, timeout=240)
    assert up.returncode == 1
    said = re.search(rf"{re.escape(skewed.spec)}'s clock is (\d+\.\d) s ahead of .* \(± ([\d.]+) s\)", up.stderr)
    assert "preflight failed" in up.stderr and said, up.stderr
    assert abs(float(said[1]) - 300) <= float(said[2]) + 0.1, up.stderr  # as measured, to 0.1 s
    for host in bed.hosts:  # nothing was started: no torchrun, no workspace
        assert not list(Path(host.home, ".ddpctl", "runs").glob("*/torchrun.out"))
