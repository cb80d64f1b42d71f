"""The test bed itself: hosts are separate SSH hosts that reach each other, and stop() leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import testbed as tb
from tests.testbed_fixtures import TESTBED_PREFIX, connect, needs_testbed

pytestmark = [needs_testbed, pytest.mark.testbed]


# The tests that check a stopped bed left nothing name their beds with a prefix of their own: names come from the
# prefix and the bed's index, and once a bed is gone another worker's bed of the same prefix may take its index.
STOP_PREFIX, STALE_PREFIX, BY_HAND_PREFIX = "ddptbst", "ddptbcs", "ddptbcl"


def leftovers(state: tb.BedState) -> list[str]:
    """Everything of a bed still present on the machine (empty when it was cleaned up)."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    if f" {state.bridge}:" in links or f" {state.bridge}@" in links:
        found.append(f"bridge {state.bridge}")
    if f"-i {state.bridge} " in rules:
        found.append("iptables rule")
    for host in state.hosts:
        if host["netns"] in netns.split():
            found.append(f"netns {host['netns']}")
        if f" {host['veth']}@" in links:
            found.append(f"veth {host['veth']}")
        if subprocess.run(["id", host["user"]], capture_output=True).returncode == 0:
            found.append(f"user {host['user']}")
        if Path(host["home"]).exists():
            found.append(f"home {host['home']}")
        pid = tb.read_pid(Path(host["dir"], "sshd.pid"))
        if pid and tb.process_state(pid) not in (None, "Z"):
            found.append(f"sshd {pid}")
    return found


def test_hosts_are_separate_ssh_hosts_that_reach_each_other(testbed):
    h0, h1 = testbed.hosts
    assert (h0.port, h1.port) == (22, 2222)
    assert h0.spec == f"{h0.user}@{h0.address}:22"
    assert len({h0.user, h1.user}) == 2 and len({h0.home, h1.home}) == 2 and len({h0.netns, h1.netns}) == 2
    assert testbed.known_hosts_path.read_text().splitlines() == [h0.known_hosts_line(), h1.known_hosts_line()]
    assert h1.known_hosts_line().startswith(f"[{h1.address}]:2222 ssh-ed25519 ")
    # Host 1 reaches host 0's sshd over the bridge, as its own user.
    probe = ("import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), 5); "
             "print(s.recv(7).decode())")
    out = h1.run_as_user(["python3", "-c", probe, h0.address, str(h0.port)]).stdout.decode()
    assert out.strip() == "SSH-2.0"
    assert h1.run_as_user(["id", "-un"]).stdout.decode().strip() == h1.user
    # Each namespace has loopback and its own interface with its own address.
    addrs = subprocess.run([*h0.nsenter(), "ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    assert f"{h0.iface}    inet {h0.address}/24" in addrs and "lo    inet 127.0.0.1/8" in addrs


def test_ssh_environment_reaches_sessions(testbed):
    host = testbed.hosts[0]
    host.set_ssh_environment({"DDPCTL_TESTBED_VAR": "value with spaces"})
    host.update_ssh_environment({"OTHER": "2"})
    try:
        assert host.ssh_environment() == {"DDPCTL_TESTBED_VAR": "value with spaces", "OTHER": "2"}
        with connect(testbed, host) as conn:
            out = conn.run(["sh", "-c", 'printf %s "$DDPCTL_TESTBED_VAR/$OTHER"']).stdout
        assert out == "value with spaces/2"
    finally:
        host.set_ssh_environment({})


def test_add_and_remove_host(testbed):
    host = testbed.add_host(port=2200)
    try:
        assert host.known_hosts_line() in testbed.known_hosts_path.read_text()
        with connect(testbed, host) as conn:
            assert conn.run(["pwd"]).stdout.strip() == host.home
    finally:
        testbed.remove_host(host)
    assert host.name not in [h.name for h in testbed.hosts]
    assert host.known_hosts_line() not in testbed.known_hosts_path.read_text()
    state = tb.BedState(**{**testbed.state.__dict__, "hosts": [host.__dict__], "iptables_rule": None,
                           "bridge": "ddpnosuchbr"})
    assert leftovers(state) == []


def test_reset_gives_the_next_module_the_hosts_as_the_bed_made_them(testbed):
    """What a module sharing the bed may leave (tests/testbed_fixtures.py `lent`): a cut link, a stopped sshd or
    one without SFTP, a detached process of the host's user, files in its home, a changed SSH environment."""
    h0, h1 = testbed.hosts
    h0.set_sftp(False)
    h0.link_down()
    h1.stop_sshd()
    h0.update_ssh_environment({"PATH": "/nowhere"})
    Path(h0.home, ".ddpctl", "runs", "r1").mkdir(parents=True)
    Path(h1.home, "notes.txt").write_text("left by a test")
    subprocess.Popen([*h1.nsenter(), "setpriv", f"--reuid={h1.user}", f"--regid={h1.user}", "--init-groups",
                      "setsid", "sleep", "300"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not tb.user_pids(h1.user):  # setpriv has yet to become the user
        assert time.monotonic() < deadline, "the user's process did not start"
        time.sleep(0.05)
    testbed.reset()
    for host in (h0, h1):  # (a killed process not yet reaped by its parent is a zombie: it runs no more)
        assert [pid for pid in tb.user_pids(host.user) if tb.process_state(pid) not in (None, "Z")] == []
    for host in (h0, h1):
        assert sorted(p.name for p in Path(host.home).iterdir()) == [".ssh"]
        assert host.ssh_environment() == {}
        with connect(testbed, host) as conn:  # reached over its link, its sshd up, SFTP served again
            assert conn.run(["sh", "-c", 'echo "$PATH"']).stdout.strip() != "/nowhere"
            assert conn.sftp.listdir(".") == [".ssh"]


def test_stop_removes_everything_even_with_user_processes():
    tb.cleanup_stale(STOP_PREFIX)  # beds of this prefix left by killed test runs
    bed = tb.Testbed(STOP_PREFIX, n_hosts=1)
    state = bed.state
    host = bed.hosts[0]
    # A process of the test user, detached into its own session, as a launched job would be.
    subprocess.Popen([*host.nsenter(), "setpriv", f"--reuid={host.user}", f"--regid={host.user}",
                      "--init-groups", "setsid", "sleep", "300"], start_new_session=True)
    assert leftovers(state) != []
    bed.stop()
    bed.stop()  # twice is harmless
    assert leftovers(state) == []
    assert not bed.dir.exists()


def test_cleanup_stale_removes_beds_of_dead_owners(tmp_path):
    tb.cleanup_stale(STALE_PREFIX)  # beds of this prefix left by killed test runs
    code = ("from infra.testbed import Testbed; import sys, time; "
            f"b = Testbed({STALE_PREFIX!r}, n_hosts=1); print(b.dir, flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parent.parent)
    try:
        assert proc.stdout is not None
        bed_dir = Path(proc.stdout.readline().strip())
        state = tb.load_state(bed_dir)
        assert state is not None and tb.owner_alive(state)
        assert state.idx not in tb.cleanup_stale(STALE_PREFIX)  # a live owner's bed is kept
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert leftovers(state) != []
    assert state.idx in tb.cleanup_stale(STALE_PREFIX)
    assert leftovers(state) == [] and not bed_dir.exists()


def test_command_line_start_list_stop():
    def cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "infra.testbed", *args], capture_output=True, text=True,
                              cwd=Path(__file__).parent.parent, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = cli("start", "--hosts", "1", "--ports", "2022", "--prefix", BY_HAND_PREFIX)
    idx = int(out.split()[2])
    state = tb.load_state(tb.STATE_ROOT / f"bed-{idx}")
    assert state is not None and state.owner_pid is None
    try:
        assert f"{state.hosts[0]['address']}:2022" in out and "known_hosts:" in out
        assert f"bed {idx} [{BY_HAND_PREFIX}] by hand" in cli("list")
        assert idx not in tb.cleanup_stale(BY_HAND_PREFIX)  # a bed started by hand lives until `stop`
    finally:
        stopped = cli("stop", "--bed", str(idx))
    assert str(idx) in stopped
    assert leftovers(state) == []
    assert not os.path.exists(tb.STATE_ROOT / f"bed-{idx}")


def test_host_python_gives_sessions_torch():
    with tb.Testbed(TESTBED_PREFIX, n_hosts=1, host_python=True) as bed:
        with connect(bed, bed.hosts[0]) as conn:
            result = conn.run(["python3", "-c", "import sys, torch; print(sys.prefix)"], timeout=120)
        assert result.ok, result.stderr
        assert result.stdout.startswith("/opt/ddpctl-testbed/python-")


VARIED_PREFIX = "ddptbvr"


def test_a_varied_bed_has_hosts_that_differ_as_real_machines_do():
    """Interface names, a second interface that is not the route between the hosts, homes, SSH ports and python
    paths all differ; the hosts still reach each other on the route, and stop() leaves nothing (homes outside
    /home included)."""
    tb.cleanup_stale(VARIED_PREFIX)
    bed = tb.Testbed(VARIED_PREFIX, n_hosts=3, ports=[22, 2222, 2200], host_python=True, varied=True)
    state = bed.state
    try:
        assert [h.iface for h in bed.hosts] == ["eth0", "ens5", "enp1s0"]
        assert [str(Path(h.home).parent) for h in bed.hosts] == ["/home", "/srv", "/opt"]
        pythons = []
        for host in bed.hosts:
            addrs = subprocess.run([*host.nsenter(), "ip", "-o", "-4", "addr"], capture_output=True,
                                   text=True).stdout
            assert f"{host.iface}    inet {host.address}/24" in addrs, addrs
            assert f"docker0    inet 10.232.{bed.idx}.1/24" in addrs, addrs
            with connect(bed, host) as conn:
                found = conn.run(["sh", "-c", "command -v python3 && python3 -c 'import torch' && pwd"],
                                 timeout=120)
            assert found.ok, found.stderr
            python, home = found.stdout.split()
            assert home == host.home
            pythons.append(python)
        assert len(set(pythons)) == 3, pythons
        probe = ("import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), 5); "
                 "print(s.recv(7).decode())")
        h0, h2 = bed.hosts[0], bed.hosts[2]
        assert h2.run_as_user(["python3", "-c", probe, h0.address, "22"]).stdout.decode().strip() == "SSH-2.0"
    finally:
        bed.stop()
    assert leftovers(state) == []
