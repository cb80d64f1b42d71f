"""The end-of-session check: the suite fails when something it made is still there after its last test.

Checked: mounts, network namespaces, Docker containers and processes. Other developers' test runs on the same
machine make the same kinds of things at the same time, so only what this session made counts:

- processes carrying this session's token in their environment (set at session start, inherited by every
  process the tests start: ddpctl, torchrun, trainers, sshd and dockerd of test beds), and processes inside a
  network namespace of a bed this session started (held open, so its identity is not reused: infra/testbed.py);
- network namespaces of beds this session started;
- mounts that were not there at the start and lie in this session's places: pytest's temporary directory, the
  checkout, the directories and homes of its beds, their Docker exec roots;
- containers that were not there at the start and bind-mount one of those places (or are a compose project of
  one), on this machine's Docker engine (the beds' engines go with their data roots, checked as mounts).

Under pytest-xdist (`-n N`) each worker is a session of its own: it checks what it made (its token, its beds, its
temporary directory), never what another worker still has running. The checkout is shared by all workers, so
mounts and containers below it are checked once, by the controller, after every worker has finished.

tests/conftest.py imports the two hooks. DDPCTL_SKIP_LEAK_CHECK=1 turns the check off (a debugging session that
keeps things on purpose).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra import testbed

TOKEN_VAR = "DDPCTL_TEST_SESSION"
REPO = Path(__file__).resolve().parent.parent
# What is being torn down right now (a container's --rm, a SIGKILLed process) may take a moment to go.
SETTLE_SECONDS = float(os.environ.get("DDPCTL_LEAK_SETTLE_SECONDS", "15"))


@dataclass
class Snapshot:
    """What existed when the session started."""

    mounts: set[str]
    containers: set[str] | None  # None: no Docker engine answers here
    token: str
    basetemp: Path | None = None
    role: str = "session"  # "session": no workers; "worker": an xdist worker; "controller": the xdist controller
    leaks: list[str] = field(default_factory=list)


def mount_points() -> set[str]:
    with open("/proc/mounts") as f:
        return {line.split()[1].replace("\\040", " ") for line in f}


def docker_containers() -> set[str] | None:
    if shutil.which("docker") is None:
        return None
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        proc = subprocess.run(["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return set(proc.stdout.split())
    return None


def take_snapshot(role: str = "session") -> Snapshot:
    """Record what exists now and mark this session's processes with a fresh token. The controller of xdist
    workers runs no test: its workers mark their own processes."""
    token = uuid.uuid4().hex
    if role != "controller":
        os.environ[TOKEN_VAR] = token
        testbed.WATCH_NAMESPACES = True
    return Snapshot(mounts=mount_points(), containers=docker_containers(), token=token, role=role)


def _our_beds() -> list[testbed.BedState]:
    """The beds this process started, less those whose index another live bed has taken since: the names of a
    bed's directory, namespaces and homes come from its prefix and index, so they are now the other bed's."""
    ours = []
    for bed in testbed.STARTED_HERE:
        now = testbed.load_state(testbed.STATE_ROOT / f"bed-{bed.idx}")
        if now is None or (now.owner_pid, now.owner_start) == (bed.owner_pid, bed.owner_start):
            ours.append(bed)
    return ours


def our_places(snapshot: Snapshot) -> list[str]:
    """Directories this session owns: things mounted or bind-mounted below them are its doing. The checkout is
    every worker's: the controller checks it once they are all done."""
    places = [] if snapshot.role == "worker" else [str(REPO)]
    if snapshot.basetemp is not None:
        places.append(str(snapshot.basetemp))
    for bed in _our_beds():
        places.append(str(testbed.STATE_ROOT / f"bed-{bed.idx}"))
        for host in bed.hosts:
            places += [host["dir"], host["home"], f"/run/{host['netns']}-docker", f"/run/netns/{host['netns']}"]
    return places


def _below(path: str, places: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in places)


def _process_leaks(token: str) -> list[str]:
    marker = f"{TOKEN_VAR}={token}".encode()
    watched = {}
    for name, fd in testbed.WATCHED_NAMESPACES.items():
        with contextlib.suppress(OSError):
            watched[os.fstat(fd).st_ino] = name
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, not yet reaped: it holds nothing
            ours = marker in (entry / "environ").read_bytes().split(b"\0")
            netns = watched.get(os.stat(entry / "ns" / "net").st_ino)
            if ours or netns:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                where = f" in test host namespace {netns}" if netns else ""
                found.append(f"process {entry.name}{where}: {cmdline[:200]}")
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return found


def _container_leaks(snapshot: Snapshot, places: list[str]) -> list[str]:
    now = docker_containers()
    if snapshot.containers is None or now is None:
        return []
    new = sorted(now - snapshot.containers)
    if not new:
        return []
    proc = subprocess.run(["docker", "inspect", *new], capture_output=True, text=True, timeout=60)
    found = []
    for info in json.loads(proc.stdout or "[]"):
        labels = info.get("Config", {}).get("Labels") or {}
        sources = [m.get("Source", "") for m in info.get("Mounts") or []]
        sources.append(labels.get("com.docker.compose.project.working_dir", ""))
        if any(s and _below(s, places) for s in sources):
            found.append(f"container {info['Name'].lstrip('/')} ({info['Id'][:12]}, {info['State']['Status']}, "
                         f"image {info['Config']['Image']})")
    return found


def find_leaks(snapshot: Snapshot) -> list[str]:
    """What this session made that is still there, one line each."""
    places = our_places(snapshot)
    leaks = [f"mount {m}" for m in sorted(mount_points() - snapshot.mounts) if _below(m, places)]
    for bed in _our_beds():
        for host in bed.hosts:
            if Path("/run/netns", host["netns"]).exists():
                leaks.append(f"network namespace {host['netns']}")
    if snapshot.role != "controller":  # the controller started nothing; its workers are exiting meanwhile
        leaks += _process_leaks(snapshot.token)
    leaks += _container_leaks(snapshot, places)
    return sorted(set(leaks))


def settled_leaks(snapshot: Snapshot, settle: float = SETTLE_SECONDS) -> list[str]:
    """find_leaks, asked again for a few seconds while things being torn down finish going."""
    deadline = time.monotonic() + settle
    leaks = find_leaks(snapshot)
    while leaks and time.monotonic() < deadline:
        time.sleep(1)
        leaks = find_leaks(snapshot)
    return leaks


_SNAPSHOT: list[Snapshot] = []
_WORKER_LEAKS: list[str] = []  # what the xdist workers found, told to the controller as each one ends
WORKER_OUTPUT_KEY = "ddpctl_left_behind"


def session_role(config: pytest.Config) -> str:
    if hasattr(config, "workerinput"):
        return "worker"
    if config.pluginmanager.get_plugin("dsession") is not None:
        return "controller"
    return "session"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Record what exists before the first test."""
    if os.environ.get("DDPCTL_SKIP_LEAK_CHECK") != "1":
        _SNAPSHOT.append(take_snapshot(session_role(session.config)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a mount, namespace, container or process it made is still there."""
    if not _SNAPSHOT:
        return
    snapshot = _SNAPSHOT.pop()
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        with contextlib.suppress(Exception):
            snapshot.basetemp = factory.getbasetemp()
    leaks = settled_leaks(snapshot)
    for fd in testbed.WATCHED_NAMESPACES.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    testbed.WATCHED_NAMESPACES.clear()
    if snapshot.role == "worker":  # a worker has no terminal: its controller tells and fails the session
        worker = session.config.workerinput["workerid"]  # type: ignore[attr-defined]
        session.config.workeroutput[WORKER_OUTPUT_KEY] = [f"{leak} (worker {worker})" for leak in leaks]  # type: ignore[attr-defined]
        return
    if snapshot.role == "controller":
        leaks = sorted(set(leaks) | set(_WORKER_LEAKS))
    if not leaks:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"the test session left {len(leaks)} thing(s) it made behind:", *(f"  {leak}" for leak in leaks)]
    if reporter is not None:
        reporter.write_sep("=", "left behind", red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """An xdist worker ended: keep what its own end-of-session check found, for the controller's report."""
    _WORKER_LEAKS.extend(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY, []))
