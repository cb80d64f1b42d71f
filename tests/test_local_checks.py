"""A local run checks what a host run's preflight checks (launcher/execute/this_machine/checks.py): the rendezvous
address
resolves and a port can be bound, before anything is written; a run with no first step shows torchrun's last line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.execute.this_machine.checks import FirstStepWatch, check_local_rendezvous, last_line

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--epochs", "1", "--gpus", "1", "--synthetic-train-size", "256", "--synthetic-test-size", "64"]
TIMEOUT_LINE = ("[W1123 00:10:01.123456789 socket.cpp:755] [c10d] The client socket has timed out after 60000ms "
                "while trying to connect to (localhost, 42689).")


def test_a_name_that_does_not_resolve_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError) as refused:
        check_local_rendezvous("no-such-host.invalid")
    message = str(refused.value)
    assert "cannot resolve 'no-such-host.invalid'" in message and "\n" not in message


def test_an_address_with_no_port_to_bind_is_refused() -> None:
    """192.0.2.1 (TEST-NET-1, documentation only) is no address of this machine: nothing can be bound there."""
    with pytest.raises(SpecError, match=r"no port can be bound on '192\.0\.2\.1' \(192\.0\.2\.1: "):
        check_local_rendezvous("192.0.2.1")


def test_localhost_passes_here() -> None:
    check_local_rendezvous()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a mount namespace (unshare, root) stands in for a machine without /etc/hosts")
def test_local_up_where_localhost_does_not_resolve_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`ddpctl up` in a mount namespace of its own where /etc/hosts lacks localhost and only files are asked
    (a minimal root file system); this machine's own files are not touched."""
    hosts, nsswitch = tmp_path / "hosts", tmp_path / "nsswitch.conf"
    hosts.write_text("127.0.0.2 not-localhost\n")
    nsswitch.write_text("hosts: files\n")
    runs = tmp_path / "runs"
    script = ('mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/nsswitch.conf && shift 2 && exec "$@"')
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(hosts), str(nsswitch),
         sys.executable, "-m", "launcher", "up", "--runs-dir", str(runs), *SMALL],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "cannot resolve 'localhost'" in result.stderr, result.stderr
    assert "/etc/hosts" in result.stderr and "Traceback" not in result.stderr
    assert not runs.exists() or not any(runs.iterdir()), "nothing is written for a refused run"


def test_display_says_running_until_a_minute_without_a_step(tmp_path: Path) -> None:
    out = tmp_path / "torchrun.out"
    out.write_text("")
    watch = FirstStepWatch(out, wait=60, started=1000.0)
    assert watch.state(None, now=1030.0) == "running"
    assert watch.state(None, now=1061.0) == "no training step after 61 s; torchrun printed nothing"
    with open(out, "a") as f:  # as torchrun writes it: lines appended while it waits
        f.write("W1123 starting rendezvous\n\x1b[33m" + TIMEOUT_LINE + "\x1b[0m\n\n")
    shown = watch.state(None, now=1125.0)
    assert shown.startswith("no training step after 125 s; torchrun: [W1123 00:10:01")
    assert shown.endswith("connect to (localhost, 42689).") and "\x1b" not in shown and len(shown) < 160


def test_display_says_running_once_training_has_stepped(tmp_path: Path) -> None:
    out = tmp_path / "torchrun.out"
    out.write_text(TIMEOUT_LINE + "\n")
    watch = FirstStepWatch(out, wait=60, started=0.0)
    record = {"epoch": 1, "epochs": 3, "step": 4, "steps_per_epoch": 10, "state": "training"}
    assert watch.state(json.loads(json.dumps(record)), now=100.0) == "running"
    assert watch.state(None, now=500.0) == "running"  # a record missing for a moment later changes nothing


def test_last_line_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert last_line(tmp_path / "none") == ""
