"""Code that runs on the hosts is modules of launcher/remote/: standard library only, and the scripts sent to the
hosts carry the module's own text (no second copy); the daemon helper is tried here, without SSH."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

import launcher.remote
from launcher.errors import HostError
from launcher.execute.ship.to_hosts import probed_listing
from launcher.places.vast.autostop import WATCHDOG
from launcher.planning.host_round import PROBE_PROGRAM
from launcher.planning.preflight import probe_host
from launcher.planning.rdzv_reservation import RELEASE_PROGRAM
from launcher.remote import (
    client_watch,
    daemon,
    host_probe,
    interface_addresses,
    node_start,
    probe_round,
    rdzv_port,
    source_of,
    tree_sync,
)
from launcher.transport.ssh import CommandResult
from launcher.transport.sync import read_listing

REMOTE = Path(launcher.remote.__file__).parent


def test_remote_modules_need_only_the_standard_library() -> None:
    """Sent as source to a host that has only its python: no third-party import, no launcher import but of this
    package's modules (sent with it, launcher/remote/program.py), and no `from __future__` (it must open a file,
    and the source is sent ahead of a script)."""
    for path in sorted(REMOTE.glob("*.py")):
        if path.name == "__init__.py":
            continue  # the launcher's side: reads the modules' text
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "launcher.remote":
                assert all((REMOTE / f"{a.name}.py").is_file() or a.name == "source_of" for a in node.names)
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names and name != "__future__", (path.name, name)


def sources_of(text: str) -> dict[str, str]:
    """The modules a program (launcher/remote/program.py) defines on the host: name -> the text sent."""
    first = text.splitlines()[0]
    assert first.startswith("_SOURCES = ")
    return dict(ast.literal_eval(first.removeprefix("_SOURCES = ")))


def test_every_script_that_detaches_runs_the_daemon_modules_text() -> None:
    """One helper instead of a copy per script: each script carries the module's source and forks nowhere
    else, so changing the module changes what the hosts run."""
    helper = source_of(daemon)
    assert WATCHDOG.startswith(helper)
    assert WATCHDOG.count("os.fork()") == helper.count("os.fork()") == 1
    assert WATCHDOG.count("detach(") == 2  # its definition, then the script's one call
    for text in (PROBE_PROGRAM, RELEASE_PROGRAM):
        sent = sources_of(text)
        assert sent["launcher.remote.daemon"] == helper
        assert sum(source.count("os.fork()") for source in sent.values()) == 1


@pytest.mark.integration
def test_detach_answers_then_goes_on_in_a_session_of_its_own(tmp_path: Path) -> None:
    """The parent's line comes back and the command ends while the child still works (its streams are not the
    caller's pipe); the child has left the caller's session and finishes what it was doing."""
    done = tmp_path / "child.txt"
    script = source_of(daemon) + (
        "import time\n"
        f"detach('started')\n"
        "time.sleep(2)\n"
        f"open({str(done) + '.tmp'!r}, 'w').write('%d %d' % (os.getsid(0), os.getpid()))\n"
        f"os.replace({str(done) + '.tmp'!r}, {str(done)!r})\n")
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout == "started\n" and result.stderr == ""
    assert time.monotonic() - began < 2  # the pipe closed before the child's work was done
    deadline = time.monotonic() + 20
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    sid, pid = (int(word) for word in done.read_text().split())
    assert sid == pid  # the session leader of a session of its own


class ThisMachine:
    """A connection that runs the argv here, as sshd would run it on a host."""

    label = "this machine"

    def run(self, argv: list[str], *, timeout: float | None = None,
            stdin: bytes | Iterable[bytes] | None = None) -> CommandResult:
        """Standard input in parts is written a part at a time, as each comes (the program runs meanwhile)."""
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None
        for part in [stdin] if isinstance(stdin, bytes) else stdin or ():
            proc.stdin.write(part)
            proc.stdin.flush()
        out, err = (stream.decode(errors="replace") for stream in proc.communicate(timeout=timeout))
        return CommandResult(proc.returncode, out, err)


def test_the_probe_sent_to_the_hosts_is_the_modules_text() -> None:
    assert sources_of(PROBE_PROGRAM) == {m.__name__: source_of(m) for m in (client_watch, daemon, interface_addresses,
                                                                             host_probe,
                                                                            rdzv_port, tree_sync, probe_round)}
    assert sources_of(RELEASE_PROGRAM) == {m.__name__: source_of(m) for m in (daemon, rdzv_port)}


@pytest.mark.integration
def test_the_host_probe_describes_this_machine_through_the_launchers_own_reading() -> None:
    """The probe run here as the launcher runs it on a host (`python -c SOURCE`), read by probe_host: what it
    says of this machine is what this machine is."""
    facts = probe_host(ThisMachine(), sys.executable, "this machine")
    assert facts.python == platform.python_version() and facts.executable == sys.executable
    assert facts.cpus == os.cpu_count() and facts.home == os.path.expanduser("~")
    assert facts.torch == importlib.metadata.version("torch").split("+")[0] and facts.torch_error is None
    assert facts.docker == (shutil.which("docker") is not None)
    assert facts.disk_free > 0 and any(a.addr == "127.0.0.1" for a in facts.addrs)
    assert host_probe.host_facts()["cpus"] == facts.cpus  # the module is importable and callable here too


@pytest.mark.integration
def test_the_probes_one_round_trip_answers_checks_and_the_rendezvous_check(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's program run here as on two hosts (launcher/planning/host_round.py's probe_all): each runs the
    checks it is asked (their exit codes and output come back), node 0 listens on a port the host has free and
    node 1, probed at the same time, connects to it once told the port; a dry run's request writes no
    reservation."""
    from launcher.planning import rdzv_reservation
    from launcher.planning.host_round import probe_all
    from launcher.planning.rdzv_reservation import listen_request

    monkeypatch.setattr(rdzv_reservation, "RESERVATION_DIR", str(tmp_path / "rdzv"))
    listen = listen_request(addr="127.0.0.1", port=0, expect=1, seconds=10, any_free=True, run_id=None)
    checks = [["sh", "-c", 'echo "checked $1"; exit 3', "check", "node"], ["/nonexistent/program"]]
    outcomes = probe_all([ThisMachine(), ThisMachine()], ["node0", "node1"], sys.executable,
                         checks=lambda index: checks[:index + 1], listen=listen)
    node0, node1 = (o.value for o in outcomes)
    assert node0 is not None and node1 is not None, [o.error for o in outcomes]
    assert node0.listen is not None and node0.listen.startswith("listening ") and node0.addr == "127.0.0.1"
    assert node1.connect == "ok" and node0.connect is None and node1.listen is None
    assert [(c.exit_code, c.stdout) for c in node0.checks] == [(3, "checked node\n")]
    assert node1.checks[1].exit_code == 127 and "/nonexistent/program" in node1.checks[1].stderr
    assert node0.facts.python == platform.python_version() and node1.facts.cpus == os.cpu_count()
    assert not (tmp_path / "rdzv").exists(), "a dry run's probe wrote a reservation"


@pytest.mark.integration
def test_the_probe_lists_the_code_cache_as_shipping_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for a folder (from the home folder), the probe's answer carries its manifest, which shipping reads as
    it reads its own listing's: a relaunch needs no round trip to list the cache. A folder that is not there is
    listed as missing; one that is a file comes back as an error, and shipping then lists it itself."""
    from launcher.planning.host_round import run_probe

    monkeypatch.setenv("HOME", str(tmp_path))
    cache = tmp_path / ".ddpctl" / "code" / "k"
    (cache / "trainer").mkdir(parents=True)
    (cache / "trainer" / "a.py").write_bytes(b"x = 1\n")
    answer = run_probe(ThisMachine(), sys.executable, "host", manifest=".ddpctl/code/k")
    exists, entries = read_listing("host", ".ddpctl/code/k", answer.manifest)
    assert exists and [(e.path, e.type, e.size, e.sha256) for e in entries] == [
        ("trainer/a.py", "file", 6, hashlib.sha256(b"x = 1\n").hexdigest())]
    assert read_listing("host", "x", run_probe(ThisMachine(), sys.executable, "host", manifest="nothing").manifest) \
        == (False, [])
    (tmp_path / "plain").write_text("")
    refused = run_probe(ThisMachine(), sys.executable, "host", manifest="plain").manifest
    assert "is not a directory" in refused["error"]
    with pytest.raises(HostError, match="malformed manifest"):
        read_listing("host", "plain", refused)
    assert probed_listing("host", "plain", refused) is None  # shipping lists it itself, and says what is wrong
    assert run_probe(ThisMachine(), sys.executable, "host").manifest is None  # not asked: not listed


def test_a_listing_that_takes_too_long_is_left_to_shipping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A code cache too big to hash within the probe's LIST_SECONDS is not listed there (the probe keeps its own
    time limit): the answer says so, and shipping lists the cache in a round trip of its own."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "big.bin").write_bytes(b"0" * 1000)
    late = probe_round.listing("cache", seconds=-1)
    assert "took too long" in late["error"] and probed_listing("host", "cache", late) is None
    listed = probed_listing("host", "cache", probe_round.listing("cache"))
    assert listed is not None and [e.path for e in listed[1]] == ["big.bin"]
    with pytest.raises(HostError, match="malformed manifest"):
        probed_listing("host", "cache", {"exists": True})


def test_the_start_copies_the_code_cache_into_the_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's copy of the shipped code (what `cp -R CACHE WS/code/trainer` did in a round trip of its own):
    what was there is replaced, files keep their modes, links stay links; a destination outside code/ and a
    missing cache are refused in one line."""
    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path / "ws")
    cache = tmp_path / "home" / ".ddpctl" / "code" / "k"
    (cache / "sub").mkdir(parents=True)
    (cache / "run.sh").write_text("echo\n")
    (cache / "run.sh").chmod(0o755)
    (cache / "sub" / "m.py").write_text("y = 2\n")
    (cache / "link").symlink_to("run.sh")
    (tmp_path / "ws" / "code" / "trainer").mkdir(parents=True)
    (tmp_path / "ws" / "code" / "trainer" / "stale.py").write_text("")
    assert node_start.copy_code(str(tmp_path / "home"), ".ddpctl/code/k", "/trainer") is None
    copied = tmp_path / "ws" / "code" / "trainer"
    assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*")) == ["link", "run.sh", "sub",
                                                                                     "sub/m.py"]
    assert (copied / "run.sh").stat().st_mode & 0o777 == 0o755 and os.readlink(copied / "link") == "run.sh"
    assert node_start.copy_code(str(tmp_path / "home"), ".ddpctl/code/k", "") is None  # `-- CMD`: code/ itself
    assert (tmp_path / "ws" / "code" / "sub" / "m.py").read_text() == "y = 2\n"
    for bad in ("/../x", "trainer", "/a//b"):
        assert "not a path inside the workspace" in str(node_start.copy_code(str(tmp_path / "home"), "c", bad))
    monkeypatch.setattr(node_start, "COPY_ATTEMPTS", 1)
    assert "could not copy the code" in str(node_start.copy_code(str(tmp_path / "home"), "missing", "/trainer"))
    assert "no code cache" in str(node_start.copy_code(str(tmp_path / "home"), "", "/trainer"))
    assert node_start.read_request(b'{"files": [], "code": {"cache": "c", "dest": ""}}') == (
        [], {"cache": "c", "dest": ""})
    assert node_start.read_request(b'[["env", "", 384]]') == ([["env", "", 384]], None)
    assert isinstance(node_start.read_request(b"not json"), str) and node_start.read_request(b"") == ([], None)
