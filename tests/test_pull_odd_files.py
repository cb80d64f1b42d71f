"""One odd file never costs a node's results: on the test bed, a script leaves files the pull cannot read or name
as they are (mode 000, a folder it cannot list, a name that is not UTF-8, a 249-character name), files vanish or
change type between listing and copying or between two pulls, and two pulls of one run meet. Each case asserts
the line the user reads and, by sha256, what came back; the run's outcome stays the training's."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.testbed import Testbed
from launcher.execute.pull_record import PULL_LOCK, PULL_RECORD, incomplete_pull_line, write_pull_record
from launcher.places.registry import PLACES
from launcher.transport.pull import CHANGED, pull_tree
from launcher.transport.sync import NAME_MAX, PART_MARK, part_name
from tests.faults.fault_support import wait_for
from tests.plain_lines import unstamped
from tests.testbed_fixtures import REPO, TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, connect, lent, run_ddpctl

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)

LONG_NAME = "L" * 249
ODD_SCRIPT = r"""
import os
out = os.environ["DDPCTL_OUTPUT_DIR"]
def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
write(os.path.join(out, "good.bin"), os.urandom(300_000))
write(os.path.join(out, "secret.bin"), b"nobody reads this")
os.chmod(os.path.join(out, "secret.bin"), 0)
os.makedirs(os.path.join(out, "locked"))
write(os.path.join(out, "locked", "inside.txt"), b"behind a folder nobody lists")
os.chmod(os.path.join(out, "locked"), 0)
write(os.fsencode(out) + b"/caf\xe9.txt", b"a Latin-1 name")
write(os.path.join(out, "L" * 249), b"a long name")
print("done")
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class OddRun:
    bed: Testbed
    run: Path
    out_on_host: Path  # the node's out/ on the host (the bed's hosts share this file system)
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """The shared two hosts, of which the first runs one tiny script."""
    yield from lent(two_hosts)


@pytest.fixture(scope="module")
def odd_run(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> OddRun:
    root = tmp_path_factory.mktemp("odd")
    project, runs = root / "project", root / "runs"
    project.mkdir()
    (project / "make_odd.py").write_text(ODD_SCRIPT)
    result = run_ddpctl(bed, "up", "--host", bed.hosts[0].spec, "--gpus", "1", "--runs-dir", str(runs), "--json",
                        "--", "python3", "make_odd.py", cwd=project, timeout=300)
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return OddRun(bed, run, Path(bed.hosts[0].home, ".ddpctl", "runs", run.name, "out"), result)


def test_unreadable_files_are_named_and_everything_else_comes_back_verified(odd_run: OddRun) -> None:
    result, run, host_out = odd_run.result, odd_run.run, odd_run.out_on_host
    assert result.returncode == 0, result.stderr  # the training's outcome: it succeeded
    (line,) = [line for line in unstamped(result.stderr).splitlines() if line.startswith("pull incomplete")]
    assert line.startswith("pull incomplete, 2 files not pulled: ")
    assert "node 0 'out/locked': the host cannot list the folder: Permission denied" in line
    assert "node 0 'out/secret.bin': the host cannot read it: Permission denied" in line
    assert f"(all listed in {run / PULL_RECORD}); `ddpctl down {run.name}` pulls again and leaves what it " \
           f"cannot pull on the hosts, in ~/.ddpctl/runs/{run.name}/" in line
    local_out = run / "nodes" / "0" / "out"
    assert sha256(local_out / "good.bin") == sha256(host_out / "good.bin")
    assert (local_out / LONG_NAME).read_bytes() == b"a long name"
    assert (local_out / "caf\\xe9.txt").read_bytes() == b"a Latin-1 name"  # stored under its escaped name
    record = json.loads((run / PULL_RECORD).read_text())
    assert record["complete"] is False
    (node,) = record["nodes"]
    assert node["escaped"] == [{"path": "out/caf\\xe9.txt", "host_name": repr("out/caf\udce9.txt")}]
    assert sorted(item["path"] for item in node["not_pulled"]) == ["out/locked", "out/secret.bin"]
    assert not list(run.rglob(f"*{PART_MARK}*"))


def test_up_json_carries_what_could_not_be_pulled_per_file_and_what_down_will_do(odd_run: OddRun) -> None:
    result, run = odd_run.result, odd_run.run
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)  # --json: one JSON document on stdout, the line on stderr as without it
    assert printed["exit_code"] == 0 and printed["run_dir"] == str(run)
    pull = printed["pull"]
    assert pull["complete"] is False and pull["failed_nodes"] == []
    assert sorted((item["node"], item["host"], item["path"], item["reason"]) for item in pull["not_pulled"]) == [
        (0, odd_run.bed.hosts[0].spec, "out/locked", "the host cannot list the folder: Permission denied"),
        (0, odd_run.bed.hosts[0].spec, "out/secret.bin", "the host cannot read it: Permission denied"),
    ]
    assert pull["down"] == (f"`ddpctl down {run.name}` pulls again and leaves what it cannot pull on the hosts, in "
                            f"~/.ddpctl/runs/{run.name}/")
    assert pull["record"] == str(run / PULL_RECORD)
    (line,) = [line for line in unstamped(result.stderr).splitlines() if line.startswith("pull incomplete")]
    assert pull["line"] == line


def test_files_become_readable_or_a_file_turns_into_a_folder_between_pulls(odd_run: OddRun) -> None:
    run, host_out = odd_run.run, odd_run.out_on_host
    os.chmod(host_out / "secret.bin", 0o644)
    os.chmod(host_out / "locked", 0o755)
    good = host_out / "good.bin"
    good.unlink()
    good.mkdir()
    (good / "inner.txt").write_bytes(b"now a folder")
    shutil.chown(good, odd_run.bed.hosts[0].user)
    pulled = run_ddpctl(odd_run.bed, "pull", str(run))
    assert pulled.returncode == 0, pulled.stderr
    assert ("pull incomplete, 1 file not pulled: node 0 'out/good.bin/inner.txt': an earlier pull's file "
            "out/good.bin is where the host now has a folder") in pulled.stderr
    local_out = run / "nodes" / "0" / "out"
    assert sha256(local_out / "secret.bin") == sha256(host_out / "secret.bin")
    assert (local_out / "locked" / "inside.txt").read_bytes() == b"behind a folder nobody lists"
    assert (local_out / "good.bin").is_file()  # the earlier pull's copy is kept, not replaced


def test_a_second_pull_of_the_run_waits_for_the_first(odd_run: OddRun, tmp_path: Path) -> None:
    run = odd_run.run
    err = tmp_path / "pull.err"
    fd = os.open(run / PULL_LOCK, os.O_RDWR | os.O_CREAT)
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(odd_run.bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a pull under way
        with err.open("w") as stderr:
            waiting = subprocess.Popen([sys.executable, "-m", "launcher", "pull", "-i", odd_run.bed.client_key_path,
                                        str(run)], stderr=stderr, stdout=subprocess.DEVNULL, env=env)
        wait_for("the waiting line", lambda: "another pull of run" in err.read_text(), timeout=60)
        assert f"another pull of run {run.name} is under way; waiting for it to finish" in err.read_text()
        time.sleep(1)
        assert waiting.poll() is None  # still waiting
    finally:
        os.close(fd)
    assert waiting.wait(timeout=120) == 0, err.read_text()
    # Two at once, neither locked out: both end well and leave no temporary file.
    both = [subprocess.Popen([sys.executable, "-m", "launcher", "pull", "-i", odd_run.bed.client_key_path,
                              str(run)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
            for _ in range(2)]
    for proc in both:
        _out, stderr_text = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr_text
    assert not list(run.rglob(f"*{PART_MARK}*"))


def test_files_that_vanish_change_or_change_type_while_pulling_are_named(bed: Testbed, tmp_path: Path) -> None:
    host = bed.hosts[0]
    remote = Path(host.home, "changing")
    remote.mkdir()
    files = {name: os.urandom(size) for name, size in
             [("a.bin", 300_000), ("b.bin", 1000), ("c.bin", 1000), ("d.bin", 1000), ("e.bin", 1000)]}
    for name, data in files.items():
        (remote / name).write_bytes(data)
    subprocess.run(["chown", "-R", f"{host.user}:", str(remote)], check=True)
    changed = []

    def meddle(path: str, done: int) -> None:  # while a.bin comes, the others change on the host
        if path == "a.bin" and not changed:
            (remote / "b.bin").unlink()
            (remote / "c.bin").unlink()
            (remote / "c.bin").mkdir()
            (remote / "d.bin").write_bytes(b"rewritten")
            changed.append(path)

    dest = tmp_path / "nodes" / "0"
    with connect(bed, host) as conn:
        stats = pull_tree(conn, "changing", dest, progress=meddle)
    assert changed
    not_pulled = dict(stats.not_pulled)
    assert not_pulled["b.bin"] == "vanished on the host before it was copied"
    assert not_pulled["c.bin"].endswith("it may have changed type")
    assert not_pulled["d.bin"] == CHANGED
    assert stats.verified == 2
    assert sha256(dest / "a.bin") == hashlib.sha256(files["a.bin"]).hexdigest()
    assert sha256(dest / "e.bin") == hashlib.sha256(files["e.bin"]).hexdigest()
    write_pull_record(tmp_path, [host.spec], [{"not_pulled": stats.not_pulled, "verified": 2}], [None])
    line = incomplete_pull_line(tmp_path, {"provider": "vast"}, down_words=PLACES["vast"].not_pulled_after_down)
    assert line is not None and line.startswith("pull incomplete, 3 files not pulled: node 0 'b.bin': vanished on")
    assert line.endswith("destroys the machines once the rest is verified, and what was not pulled with them")


def test_temporary_names_stay_within_the_file_system_limit() -> None:
    for name in (LONG_NAME, "é" * 127, "x"):
        part = part_name(name)
        assert len(part.encode()) <= NAME_MAX and part.startswith(".") and PART_MARK in part
    assert part_name("x").startswith(f".x{PART_MARK}")
