"""launcher.transport.ssh and launcher.transport.parallel against real sshd hosts of the test bed."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from launcher.errors import AuthenticationFailed, DdpctlError, HostError, HostsFailed
from launcher.spec.hosts import parse_host
from launcher.transport.known_hosts import KnownHosts, host_key_name
from launcher.transport.parallel import HostTimeoutError, raise_for_errors, run_on_hosts
from launcher.transport.ssh import Connection, SSHTarget, command_line, resolve_target
from tests.testbed_fixtures import bed_known_hosts, connect, run_ddpctl

pytestmark = pytest.mark.testbed  # the `testbed` fixture skips where no bed can run

ECHO_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"
NASTY = ["it's", 'say "hi"', "a b  c", "x; touch pwned1", "$(touch pwned2)", "`touch pwned3`", "line1\nline2",
         "*", "~", "$HOME", "-n", "", "é ü 日本", "back\\slash", "&& touch pwned4 ||", "| cat"]


def test_arguments_arrive_intact_and_nothing_else_runs(testbed):
    host = testbed.hosts[0]
    with connect(testbed, host) as conn:
        result = conn.run(["python3", "-c", ECHO_ARGV, *NASTY], timeout=30)
        assert result.ok, result.stderr
        assert json.loads(result.stdout) == NASTY
        assert conn.run(["ls", "-a"]).stdout.split().count("pwned1") == 0
    assert not [p for p in Path(host.home).iterdir() if p.name.startswith("pwned")]


def test_run_exit_code_stderr_stdin_env_cwd_and_timeout(testbed):
    with connect(testbed, testbed.hosts[1]) as conn:
        result = conn.run(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"from stdin")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "from stdin", "err\n")
        assert conn.run(["cat"]).stdout == ""  # no stdin: EOF at once, no hang
        out = conn.run(["sh", "-c", 'echo "$A|$B|$(pwd)"'], env={"A": "x y", "B": "$(no)"}, cwd="/tmp").stdout
        assert out == "x y|$(no)|/tmp\n"
        with pytest.raises(DdpctlError, match="not valid"):
            conn.run(["true"], env={"A;B": "1"})
        with pytest.raises(HostError, match="check failed .exit 1.: boom"):
            conn.check(["sh", "-c", "echo boom >&2; exit 1"], "the check")
        t0 = time.monotonic()
        with pytest.raises(HostError, match=r"did not finish within 0\.5 s"):
            conn.run(["sleep", "20"], timeout=0.5)
        assert time.monotonic() - t0 < 5
        t0 = time.monotonic()  # a command that never reads a large stdin cannot block us either
        with pytest.raises(HostError, match=r"did not finish within 1 s"):
            conn.run(["sleep", "20"], stdin=b"x" * 20_000_000, timeout=1)
        assert time.monotonic() - t0 < 5
        assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


def test_streaming_channel_and_sftp(testbed):
    with connect(testbed, testbed.hosts[0]) as conn:
        chan = conn.open_channel_command(["sh", "-c", "wc -c > streamed.count"])
        for _ in range(10):
            chan.sendall(b"x" * 100_000)
        chan.shutdown_write()
        assert chan.recv_exit_status() == 0
        with conn.sftp.open("streamed.count") as f:
            assert f.read().strip() == b"1000000"
        assert conn.sftp is conn.sftp  # memoized


def test_command_line_is_quoted_once():
    assert command_line(["echo", "a b"]) == "exec echo 'a b'"
    assert command_line(["ls"], env={"K": "v w"}, cwd="my dir") == "cd 'my dir' && exec env 'K=v w' ls"


def test_unknown_host_refused_then_trusted_with_flag(testbed, tmp_path):
    host = testbed.hosts[1]  # port 2222: recorded as [address]:2222
    own = KnownHosts(ddpctl_file=tmp_path / "ddpctl" / "known_hosts", system_file=tmp_path / "none")
    with pytest.raises(HostError) as refused, connect(testbed, host, known_hosts=own) as conn:
        conn.run(["true"])
    message = str(refused.value)
    assert host.spec in message and "ssh-ed25519" in message and host.host_key_fingerprint in message
    assert "--accept-new-host-keys" in message
    assert not own.ddpctl_file.exists()
    with connect(testbed, host, known_hosts=own, accept_new_host_keys=True) as conn:
        assert conn.run(["true"]).ok
    assert own.ddpctl_file.read_text() == host.known_hosts_line() + "\n"
    assert (own.ddpctl_file.stat().st_mode & 0o777) == 0o600
    with connect(testbed, host, known_hosts=own) as conn:  # trusted now, without the flag
        assert conn.run(["true"]).ok


def test_hashed_system_known_hosts_entry_is_honoured(testbed, tmp_path):
    host = testbed.hosts[1]
    system = tmp_path / "known_hosts"
    shutil.copy(testbed.known_hosts_path, system)
    subprocess.run(["ssh-keygen", "-H", "-f", str(system)], check=True, capture_output=True)
    assert host_key_name(host.address, host.port) not in system.read_text()
    known = KnownHosts(ddpctl_file=tmp_path / "own", system_file=system)
    with connect(testbed, host, known_hosts=known) as conn:
        assert conn.run(["true"]).ok


def test_changed_host_key_always_refused(testbed, tmp_path):
    host = testbed.hosts[0]
    old = tmp_path / "known_hosts"
    old.write_text("# a comment\n" + testbed.known_hosts_path.read_text())
    known = KnownHosts(ddpctl_file=old, system_file=tmp_path / "none")
    host.regenerate_host_key()
    try:
        for accept in (False, True):
            with pytest.raises(HostError) as refused, connect(testbed, host, known_hosts=known,
                                                              accept_new_host_keys=accept) as conn:
                conn.run(["true"])
            assert "HOST KEY CHANGED" in str(refused.value) and f"{old}:2" in str(refused.value)
            assert host.host_key_fingerprint in str(refused.value)
    finally:
        testbed.write_known_hosts()
    with connect(testbed, host) as conn:
        assert conn.run(["true"]).ok


def test_key_of_another_type_refused_even_with_flag(testbed, tmp_path):
    """known_hosts pins the host's ECDSA key; a man in the middle shows only an ed25519 key."""
    host = testbed.hosts[1]
    host.regenerate_host_key(["ecdsa"])
    pinned = host.known_hosts_line()
    host.regenerate_host_key(["ed25519"])
    system = tmp_path / "known_hosts"
    system.write_text(pinned + "\n")
    own = KnownHosts(ddpctl_file=tmp_path / "ddpctl" / "known_hosts", system_file=system)
    try:
        for accept in (False, True):
            with pytest.raises(HostError) as refused, connect(testbed, host, known_hosts=own,
                                                              accept_new_host_keys=accept) as conn:
                conn.run(["true"])
            message = str(refused.value)
            assert "\n" not in message and "HOST KEY TYPE CHANGED" in message
            assert f"ssh-ed25519 {host.host_key_fingerprint}" in message
            assert f"{system}:1 pins its ecdsa-sha2-nistp256 key" in message
            assert "--accept-new-host-keys" not in message
            assert not own.ddpctl_file.exists()
        # The same through the command line, the key pinned in ddpctl's own file: refused, the file unchanged.
        own_file = tmp_path / "own_known_hosts"
        own_file.write_text(pinned + "\n")
        doctor = run_ddpctl(testbed, "doctor", "--host", host.spec, "--accept-new-host-keys", "--json",
                            known_hosts=own_file, timeout=120)
        assert doctor.returncode == 1
        (row,) = json.loads(doctor.stdout)["hosts"]
        assert any("HOST KEY TYPE CHANGED" in p for p in row["problems"]), row
        assert own_file.read_text() == pinned + "\n"
        # The way out the message gives, for a host that really changed: remove the pin, then trust anew.
        name = host_key_name(host.address, host.port)
        assert f"ssh-keygen -R '{name}' -f {system}" in message
        subprocess.run(["ssh-keygen", "-R", name, "-f", str(system)], check=True, capture_output=True)
        with connect(testbed, host, known_hosts=own, accept_new_host_keys=True) as conn:
            assert conn.run(["true"]).ok
        assert own.ddpctl_file.read_text() == host.known_hosts_line() + "\n"
    finally:
        host.regenerate_host_key()
        testbed.write_known_hosts()


@pytest.mark.parametrize("pinned_type", ["ecdsa", "rsa"])
def test_host_with_two_key_types_shows_the_pinned_one(testbed, tmp_path, pinned_type):
    """A server with an ed25519 key (paramiko's first choice) and the pinned one of another type connects."""
    host = testbed.hosts[0]
    host.regenerate_host_key(["ed25519", pinned_type])
    try:
        pinned = host.known_hosts_line(pinned_type)
        system = tmp_path / "known_hosts"
        system.write_text(pinned + "\n")
        known = KnownHosts(ddpctl_file=tmp_path / "own", system_file=system)
        with connect(testbed, host, known_hosts=known) as conn:
            assert conn.run(["true"]).ok
            assert conn.transport.get_remote_server_key().get_base64() == pinned.split()[2]
        assert not known.ddpctl_file.exists()
    finally:
        host.regenerate_host_key()
        testbed.write_known_hosts()


def test_revoked_key_refused_always(testbed, tmp_path):
    host = testbed.hosts[0]
    _, keytype, key = host.known_hosts_line().split()
    known_file = tmp_path / "known_hosts"
    known_file.write_text(f"{host.known_hosts_line()}\n@revoked * {keytype} {key}\n")  # pinned, then revoked
    revoked_only = tmp_path / "revoked_only"
    revoked_only.write_text(f"@revoked * {keytype} {key}\n")
    for system, accept in ((known_file, False), (known_file, True), (revoked_only, True)):
        own = KnownHosts(ddpctl_file=tmp_path / "own", system_file=system)
        with pytest.raises(HostError) as refused, connect(testbed, host, known_hosts=own,
                                                          accept_new_host_keys=accept) as conn:
            conn.run(["true"])
        message = str(refused.value)
        assert "REVOKED HOST KEY" in message and host.host_key_fingerprint in message
        assert f"{system}:{2 if system == known_file else 1}" in message
        assert not own.ddpctl_file.exists()


def test_unreachable_host_named_within_timeout(testbed):
    host = testbed.hosts[1]
    host.link_down()
    try:
        t0 = time.monotonic()
        with pytest.raises(HostError) as unreachable, connect(testbed, host, connect_timeout=2) as conn:
            conn.run(["true"])
        assert time.monotonic() - t0 < 6
        assert str(unreachable.value).startswith(f"{host.spec}: host unreachable")
        assert f"{host.address}:{host.port}" in str(unreachable.value)
    finally:
        host.link_up()


def test_wrong_key_names_the_key_tried(testbed, tmp_path):
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = testbed.hosts[0]
    target = resolve_target(parse_host(host.spec), ssh_config=tmp_path / "none", identity_file=key)
    with pytest.raises(AuthenticationFailed) as failed, Connection(target, known_hosts=bed_known_hosts(testbed),
                                                                   allow_agent=False, connect_timeout=10) as conn:
        conn.run(["true"])
    assert f"authentication as {host.user!r}" in str(failed.value) and str(key) in str(failed.value)

    def connect(_: int) -> None:
        with Connection(target, known_hosts=bed_known_hosts(testbed), allow_agent=False, connect_timeout=10) as c:
            c.run(["true"])

    with pytest.raises(HostsFailed) as fanned:  # per-host fan-out keeps each host's error by type
        raise_for_errors(run_on_hosts([0], connect, timeout=60, label=lambda _: host.spec), "connect")
    assert [type(e) for e in fanned.value.errors] == [AuthenticationFailed]
    missing = resolve_target(parse_host(host.spec), ssh_config=tmp_path / "none", identity_file=tmp_path / "nope")
    with pytest.raises(HostError, match="nope .not found."), Connection(
            missing, known_hosts=bed_known_hosts(testbed), allow_agent=False) as conn:
        conn.run(["true"])


def test_ssh_config_alias_and_proxy_jump(testbed, tmp_path):
    h0, h1 = testbed.hosts
    config = tmp_path / "ssh_config"
    config.write_text(f"""Host node1
    HostName {h1.address}
    User {h1.user}
    Port {h1.port}
    IdentityFile {testbed.client_key_path}

Host via0
    HostName {h1.address}
    User {h1.user}
    Port {h1.port}
    ProxyJump {h0.user}@{h0.address}:{h0.port}
    IdentityFile {testbed.client_key_path}
""")
    target = resolve_target(parse_host("node1"), ssh_config=config)
    assert (target.label, target.hostname, target.user, target.port) == ("node1", h1.address, h1.user, 2222)
    assert target.identity_files == (testbed.client_key_path,)
    with Connection(target, known_hosts=bed_known_hosts(testbed), allow_agent=False) as conn:
        assert conn.run(["id", "-un"]).stdout.strip() == h1.user
    # Explicit user/port in the host text win over the config.
    assert resolve_target(parse_host("other@node1:23"), ssh_config=config).port == 23
    jumped = resolve_target(parse_host("via0"), ssh_config=config)
    assert jumped.proxy_jump == f"{h0.user}@{h0.address}:{h0.port}"
    with Connection(jumped, known_hosts=bed_known_hosts(testbed), allow_agent=False, ssh_config=config) as conn:
        client = conn.run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split()[0]
    assert client == h0.address  # the session came through host 0


def test_fan_out_over_hosts_preserves_order_and_names_failures(testbed):
    hosts = testbed.hosts

    def whoami(host):
        with connect(testbed, host) as conn:
            return conn.check(["id", "-un"], "whoami").stdout.strip()

    outcomes = run_on_hosts(hosts, whoami, timeout=30, label=lambda h: h.spec)
    assert [o.value for o in outcomes] == [h.user for h in hosts]
    assert raise_for_errors(outcomes, "whoami") == [h.user for h in hosts]

    def fail_on_second(host):
        with connect(testbed, host) as conn:
            return conn.check(["sh", "-c", f"test {host.index} = 0 || {{ echo no way >&2; exit 2; }}"], "probe")

    outcomes = run_on_hosts(hosts, fail_on_second, timeout=30, label=lambda h: h.spec)
    assert outcomes[0].ok and not outcomes[1].ok
    with pytest.raises(DdpctlError) as failed:
        raise_for_errors(outcomes, "probe")
    assert str(failed.value).splitlines() == ["probe failed on 1 of 2 host(s):",
                                              f"  {hosts[1].spec}: probe failed (exit 2): no way"]


def test_stuck_host_times_out_without_blocking():
    release = threading.Event()

    def work(item: str) -> str:
        if item == "stuck":
            release.wait(60)  # a host that never answers
        if item == "bad":
            raise ValueError("broken\nacross lines")
        return item.upper()

    t0 = time.monotonic()
    outcomes = run_on_hosts(["a", "stuck", "bad", "b"], work, timeout=0.5, max_workers=3)
    assert time.monotonic() - t0 < 3
    release.set()
    assert [o.label for o in outcomes] == ["a", "stuck", "bad", "b"]
    assert outcomes[0].value == "A" and outcomes[3].value == "B"
    assert isinstance(outcomes[1].error, HostTimeoutError) and isinstance(outcomes[1].error, TimeoutError)
    with pytest.raises(DdpctlError) as failed:
        raise_for_errors(outcomes, "probe")
    assert str(failed.value).splitlines() == ["probe failed on 2 of 4 host(s):",
                                              "  stuck: did not finish within 0.5 s",
                                              "  bad: broken across lines"]


def test_proxy_command_from_ssh_config_is_honoured_and_reaped(testbed, tmp_path):
    """OpenSSH's own `ssh -W %h:%p` through host 0 as the ProxyCommand: the session arrives from host 0, the
    tokens come from the host as typed (its port overrides the config's), and no proxy outlives the connection."""
    h0, h1 = testbed.hosts
    config = tmp_path / "ssh_config"
    config.write_text(f"""Host viacmd
    HostName {h1.address}
    User {h1.user}
    Port 1
    IdentityFile {testbed.client_key_path}
    ProxyCommand ssh -F /dev/null -q -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile={testbed.known_hosts_path} -i {testbed.client_key_path} -p {h0.port} -W %h:%p {h0.user}@{h0.address}
""")  # noqa: E501
    target = resolve_target(parse_host(f"viacmd:{h1.port}"), ssh_config=config)
    assert target.proxy_command is not None and target.proxy_command.endswith(
        f"-W {h1.address}:{h1.port} {h0.user}@{h0.address}")
    conn = Connection(target, known_hosts=bed_known_hosts(testbed), allow_agent=False, ssh_config=config)
    hop = f"{h1.address}:{h1.port}".encode()
    with conn:
        assert conn.run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split()[0] == h0.address
        assert conn.sftp.listdir(".") is not None
        assert _processes_with_argument(hop)  # the ssh client running as the ProxyCommand
    assert not _processes_with_argument(hop)  # stopped and reaped when the connection closed


def _processes_with_argument(word: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and word in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_proxy_command_tokens_and_refusals(tmp_path):
    from launcher.transport.proxy_command import expand_proxy_command

    assert expand_proxy_command("nc %h %p # %r %n 100%%", hostname="10.0.0.2", port=2222, user="alice",
                                alias="gpu") == "nc 10.0.0.2 2222 # alice gpu 100%"
    config = tmp_path / "ssh_config"
    config.write_text("Host both\n  ProxyJump j\n  ProxyCommand nc %h %p\nHost none\n  ProxyCommand none\n")
    with pytest.raises(DdpctlError, match="both ProxyJump and ProxyCommand: keep one"):
        resolve_target(parse_host("both"), ssh_config=config)
    assert resolve_target(parse_host("none"), ssh_config=config).proxy_command is None


def test_passphrase_key_works_through_ssh_agent_and_is_named_without_it(testbed, tmp_path, monkeypatch):
    """What the refusal advises (`ssh-add KEY`) is what makes the key usable."""
    host = testbed.hosts[0]
    key = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f", str(key)], check=True)
    authorized = Path(host.home, ".ssh", "authorized_keys")
    original = authorized.read_text()
    authorized.write_text(original + Path(f"{key}.pub").read_text())
    target = resolve_target(parse_host(host.spec), ssh_config=tmp_path / "none", identity_file=key)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    try:
        with pytest.raises(AuthenticationFailed) as failed, Connection(
                target, known_hosts=bed_known_hosts(testbed), allow_agent=True) as conn:
            conn.run(["true"])
        assert f"run `ssh-add {key}`" in str(failed.value) and "passphrase" in str(failed.value)
        sock = tmp_path / "agent.sock"
        agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
        try:
            askpass = tmp_path / "askpass"
            askpass.write_text("#!/bin/sh\necho s3cret\n")
            askpass.chmod(0o700)
            for _ in range(100):
                if sock.exists():
                    break
                time.sleep(0.05)
            subprocess.run(["ssh-add", str(key)], check=True, stdin=subprocess.DEVNULL, capture_output=True,
                           env={"SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass),
                                "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0", "PATH": "/usr/bin:/bin"})
            monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
            with Connection(target, known_hosts=bed_known_hosts(testbed), allow_agent=True) as conn:
                assert conn.run(["id", "-un"]).stdout.strip() == host.user
        finally:
            agent.kill()
            agent.wait()
    finally:
        authorized.write_text(original)


def test_host_without_sftp_runs_commands_but_names_sftp(testbed):
    host = testbed.hosts[1]
    host.set_sftp(False)
    try:
        with connect(testbed, host) as conn:
            assert conn.run(["true"]).ok
            with pytest.raises(HostError) as refused:
                conn.sftp  # noqa: B018
        assert str(refused.value).startswith(f"{host.spec}: ddpctl copies files over SFTP")
        assert "Subsystem sftp" in str(refused.value)
    finally:
        host.set_sftp(True)
    with connect(testbed, host) as conn:
        assert conn.sftp.listdir(".") is not None


def test_reattach_takes_proxy_command_from_the_users_config_not_the_run(tmp_path, monkeypatch):
    from launcher.transport.hostsession import target_from_json, target_to_json

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu\n  HostName 10.0.0.9\n  ProxyCommand nc %h %p\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    target = resolve_target(parse_host("gpu"))
    assert target.proxy_command == "nc 10.0.0.9 22"
    recorded = {**target_to_json(target), "proxy_command": "touch /tmp/pwned"}  # a run.json from elsewhere
    assert target_from_json(recorded).proxy_command == "nc 10.0.0.9 22"
    assert "proxy_command" not in target_to_json(target)  # run.json never holds a command to run
    # A host that was reached without one (a rented machine, `vast:ID`) is not given one by a `Host *` line.
    (tmp_path / ".ssh" / "config").write_text("Host *\n  ProxyCommand nc %h %p\n")
    direct = SSHTarget(label="vast:123", hostname="10.0.0.7", port=40022, user="root")
    assert target_from_json(target_to_json(direct)).proxy_command is None
