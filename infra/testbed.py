"""A real multi-host test bed on one Linux machine (root): network namespaces on a bridge, each one an SSH host.

Each host is a network namespace joined to the bed's bridge by a veth pair, running its own OpenSSH sshd
(own config, own host key, its own address and port) and having its own login user (own home = own workspace;
all namespaces share one file system and hostname). The launcher in the root namespace reaches hosts at their
bridge address; hosts reach each other over the bridge.

Several beds may run at once (different engineers' test runs): a bed claims a free index `idx` (directory
/tmp/ddpctl-testbed/bed-<idx>), uses subnet 10.231.<idx>.0/24 and names every resource `<prefix><idx>...`.
Every resource is recorded in the bed's state.json *before* it is created, so `stop()` (and `cleanup_stale()`
for beds whose owner died) removes exactly what was made, even after a partial start.

    with Testbed(n_hosts=2, ports=[22, 2222]) as bed:
        host = bed.hosts[0]          # host.spec == "ddptb7h0@10.231.7.2:22"
        bed.write_known_hosts(path)  # trust the hosts' keys

Usable by hand: `python -m infra.testbed start --hosts 3 | list | stop`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_ROOT = Path(os.environ.get("DDPCTL_TESTBED_ROOT", "/tmp/ddpctl-testbed"))
SUBNET_FMT = "10.231.{idx}"
SSHD = "/usr/sbin/sshd"
HOST_IFACE = "eth0"  # the interface name inside every host's namespace
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # short: interface names are limited to 15 characters


class TestbedError(RuntimeError):
    """Setting up or tearing down the test bed failed (the message holds the failing command and its output)."""


@dataclass
class TestHost:
    """One SSH host of the bed. `spec` is what a user would pass as `--host`."""

    __test__ = False  # not a pytest test class

    name: str  # also the namespace name, the login user name and the root-side veth name
    index: int
    netns: str
    address: str
    port: int
    user: str
    home: str
    iface: str
    veth: str  # root-namespace end of the veth pair (link_down/link_up act on it)
    dir: str  # host's private directory on this machine (sshd config, host key, pid and log files)
    client_key_path: str
    host_key_public: str = ""

    @property
    def spec(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    @property
    def host_key_path(self) -> str:
        return f"{self.dir}/ssh_host_ed25519_key"

    @property
    def host_key_fingerprint(self) -> str:
        """`SHA256:...` as `ssh-keygen -l` prints it."""
        blob = base64.b64decode(self.host_key_public.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

    @property
    def ssh_environment_path(self) -> str:
        """~/.ssh/environment: KEY=VALUE lines set in every SSH session (sshd has PermitUserEnvironment yes)."""
        return f"{self.home}/.ssh/environment"

    def known_hosts_line(self) -> str:
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        keytype, key = self.host_key_public.split()[:2]
        return f"{name} {keytype} {key}"

    def set_ssh_environment(self, env: dict[str, str]) -> None:
        """Replace the variables every SSH session of this host's user gets (e.g. DOCKER_HOST, PATH)."""
        text = "".join(f"{k}={v}\n" for k, v in env.items())
        _write_user_file(Path(self.ssh_environment_path), text, self.user, 0o600)

    def ssh_environment(self) -> dict[str, str]:
        """The variables now in ~/.ssh/environment."""
        try:
            lines = Path(self.ssh_environment_path).read_text().splitlines()
        except FileNotFoundError:
            return {}
        return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))

    def update_ssh_environment(self, env: dict[str, str]) -> None:
        """Add or change variables of the user's SSH sessions, keeping the others (e.g. PATH from host_python)."""
        self.set_ssh_environment({**self.ssh_environment(), **env})

    def run_as_user(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60,
                    input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run argv inside the host's namespace as its login user, in its home (for tests' set-up and checks)."""
        env = ["env", "-i", f"HOME={self.home}", f"USER={self.user}", f"LOGNAME={self.user}",
               "PATH=/usr/local/bin:/usr/bin:/bin"]
        cmd = [*self.nsenter(), "setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups",
               *env, *argv]
        proc = subprocess.run(cmd, cwd=self.home, capture_output=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise TestbedError(f"{self.name}: {shlex.join(argv)} exited {proc.returncode}: "
                               f"{proc.stderr.decode(errors='replace').strip()}")
        return proc

    def nsenter(self) -> list[str]:
        """Prefix that runs a command in this host's network namespace (nsenter keeps /sys, unlike ip netns exec)."""
        return ["nsenter", f"--net=/var/run/netns/{self.netns}"]

    def link_down(self) -> None:
        """Pull the cable: packets to and from the host are lost (connects time out, no reset)."""
        _sh("ip", "link", "set", self.veth, "down")

    def link_up(self) -> None:
        _sh("ip", "link", "set", self.veth, "up")

    def regenerate_host_key(self) -> None:
        """Give the host a new ed25519 host key and restart its sshd with it."""
        self.stop_sshd()
        for suffix in ("", ".pub"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.host_key_path + suffix)
        self._make_host_key()
        self.start_sshd()

    # -- life cycle (used by Testbed) --------------------------------------------------------------------

    def _make_host_key(self) -> None:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", self.host_key_path)
        self.host_key_public = Path(self.host_key_path + ".pub").read_text().strip()

    def start_sshd(self) -> None:
        """Start the host's sshd (it daemonizes and writes its pid file) and wait until it accepts connections."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        config = Path(self.dir, "sshd_config")
        config.write_text(_sshd_config(self))
        _sh(*self.nsenter(), SSHD, "-f", str(config), "-E", f"{self.dir}/sshd.log")
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as sock:
                sock.settimeout(1)
                if sock.connect_ex((self.address, self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                log = Path(self.dir, "sshd.log").read_text(errors="replace")[-2000:]
                raise TestbedError(f"{self.name}: sshd does not accept connections at "
                                   f"{self.address}:{self.port}; its log:\n{log}")
            time.sleep(0.05)

    def stop_sshd(self) -> None:
        pid = _read_pid(Path(self.dir, "sshd.pid"))
        if pid:
            _kill_and_wait([pid])


def _sshd_config(host: TestHost) -> str:
    return f"""# test bed host {host.name}
Port {host.port}
ListenAddress {host.address}
HostKey {host.host_key_path}
PidFile {host.dir}/sshd.pid
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
AllowUsers {host.user}
PermitRootLogin no
PermitUserEnvironment yes
AllowTcpForwarding yes
MaxStartups 64:30:128
MaxSessions 64
LogLevel VERBOSE
Subsystem sftp internal-sftp
"""


@dataclass
class BedState:
    """What a bed made; saved as state.json in the bed's directory before each resource is created."""

    idx: int
    prefix: str
    owner_pid: int | None  # None: started by hand (`python -m infra.testbed start`), lives until `stop`
    owner_start: str | None
    bridge: str
    bridge_address: str
    client_key_path: str
    iptables_rule: list[str] | None = None
    hosts: list[dict[str, Any]] = field(default_factory=list)
    next_host: int = 0


class Testbed:
    """A set of SSH hosts in network namespaces on one bridge. A context manager; `stop()` removes everything."""

    __test__ = False

    def __init__(self, name_prefix: str = "ddptb", n_hosts: int = 2, ports: Sequence[int] | None = None,
                 *, persistent: bool = False, host_python: bool = False) -> None:
        """`host_python`: hosts' SSH sessions get this machine's Python (with torch) first on PATH."""
        if not _PREFIX_RE.match(name_prefix):
            raise ValueError(f"name_prefix {name_prefix!r}: use 1-8 lower-case letters or digits, first a letter")
        if os.geteuid() != 0:
            raise TestbedError("the test bed needs root (network namespaces, users, sshd)")
        ports = list(ports) if ports is not None else [22] * n_hosts
        if len(ports) != n_hosts:
            raise ValueError(f"{n_hosts} hosts but {len(ports)} ports given")
        self.prefix = name_prefix
        self.dir, idx = _claim_index()
        self.hosts: list[TestHost] = []
        self.host_env = shared_python_env() if host_python else {}
        owner = None if persistent else os.getpid()
        self.state = BedState(idx=idx, prefix=name_prefix, owner_pid=owner,
                              owner_start=_start_time(owner) if owner else None,
                              bridge=f"{name_prefix}br{idx}", bridge_address=f"{SUBNET_FMT.format(idx=idx)}.1",
                              client_key_path=str(self.dir / "client_ed25519"))
        self._save()
        try:
            self._start_network()
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ddpctl-testbed-{idx}",
                "-f", self.state.client_key_path)
            for port in ports:
                self.add_host(port)
        except BaseException:
            self.stop()
            raise

    # -- public API ----------------------------------------------------------------------------------------

    @property
    def idx(self) -> int:
        return self.state.idx

    @property
    def client_key_path(self) -> str:
        return self.state.client_key_path

    @property
    def known_hosts_path(self) -> Path:
        """A known_hosts file trusting every current host (rewritten on add_host/remove_host/write_known_hosts)."""
        return self.dir / "known_hosts"

    def add_host(self, port: int = 22) -> TestHost:
        """Create one more host (namespace, veth, user, keys, sshd) listening on `port`."""
        k = self.state.next_host
        if k > 200:
            raise TestbedError("at most 200 hosts per test bed")
        self.state.next_host += 1
        name = f"{self.prefix}{self.idx}h{k}"
        host = TestHost(name=name, index=k, netns=name, address=f"{SUBNET_FMT.format(idx=self.idx)}.{k + 2}",
                        port=port, user=name, home=f"/home/{name}", iface=HOST_IFACE, veth=name,
                        dir=str(self.dir / name), client_key_path=self.client_key_path)
        self.state.hosts.append(asdict(host))
        self._save()
        os.makedirs(host.dir, mode=0o700)
        self._create_namespace(host)
        self._create_user(host)
        host._make_host_key()
        host.start_sshd()
        if self.host_env:
            host.set_ssh_environment(self.host_env)
        self.hosts.append(host)
        self._sync_state()
        return host

    def remove_host(self, host: TestHost) -> None:
        """Stop the host's processes and remove its namespace, veth, user and home."""
        _teardown_host(asdict(host))
        self.hosts = [h for h in self.hosts if h.name != host.name]
        self.state.hosts = [h for h in self.state.hosts if h["name"] != host.name]
        self._sync_state()

    def write_known_hosts(self, path: Path | str | None = None) -> Path:
        """Write a known_hosts file trusting every host's current key; returns its path."""
        target = Path(path) if path else self.known_hosts_path
        target.write_text("".join(h.known_hosts_line() + "\n" for h in self.hosts))
        return target

    def stop(self) -> None:
        """Remove everything the bed made; safe after a partial start and when called twice."""
        _teardown_bed(self.state)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.hosts = []

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------------------------

    def _save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self.state), indent=1))
        os.replace(tmp, self.dir / "state.json")

    def _sync_state(self) -> None:
        by_name = {h.name: asdict(h) for h in self.hosts}
        self.state.hosts = [by_name.get(h["name"], h) for h in self.state.hosts]
        self._save()
        self.write_known_hosts()

    def _start_network(self) -> None:
        br = self.state.bridge
        _sh("ip", "link", "add", br, "type", "bridge")
        _sh("ip", "addr", "add", f"{self.state.bridge_address}/24", "dev", br)
        _sh("ip", "link", "set", br, "up")
        chain = "DOCKER-USER" if _run("iptables", "-w", "-S", "DOCKER-USER").returncode == 0 else "FORWARD"
        # Docker sets the FORWARD policy to DROP; bridged traffic between namespaces must be let through.
        self.state.iptables_rule = [chain, "-i", br, "-o", br, "-j", "ACCEPT"]
        self._save()
        _sh("iptables", "-w", "-I", *self.state.iptables_rule)

    def _create_namespace(self, host: TestHost) -> None:
        peer = f"{self.prefix}{self.idx}p{host.index}"
        _sh("ip", "netns", "add", host.netns)
        _sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
        _sh("ip", "link", "set", peer, "netns", host.netns)
        _sh("ip", "link", "set", host.veth, "master", self.state.bridge, "up")
        _sh("ip", "-n", host.netns, "link", "set", peer, "name", host.iface)
        _sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.iface)
        _sh("ip", "-n", host.netns, "link", "set", host.iface, "up")
        _sh("ip", "-n", host.netns, "link", "set", "lo", "up")

    def _create_user(self, host: TestHost) -> None:
        # '*' as password: the account is unlocked (sshd without PAM refuses locked ones) but has no password.
        for attempt in range(20):  # useradd fails when another bed holds the passwd lock at the same moment
            proc = _run("useradd", "--create-home", "--home-dir", host.home, "--shell", "/bin/bash",
                        "--user-group", "--password", "*", host.user)
            if proc.returncode == 0:
                break
            if attempt == 19 or "lock" not in proc.stderr:
                raise TestbedError(f"useradd {host.user} failed: {proc.stderr.strip()}")
            time.sleep(0.2)
        pub = Path(self.client_key_path + ".pub").read_text()
        _write_user_file(Path(host.home, ".ssh", "authorized_keys"), pub, host.user, 0o600)
        _write_user_file(Path(host.home, ".ssh", "environment"), "", host.user, 0o600)


def shared_python_env(source: str | None = None) -> dict[str, str]:
    """Environment giving test users this machine's Python and its packages (torch) as `python3`.

    The interpreter lives under /root (mode 0700, closed to test users), so it is hard-linked once (seconds,
    no space) to /opt/ddpctl-testbed/; its RPATH still names /root, hence LD_LIBRARY_PATH.
    """
    prefix = Path(source or sys.prefix)
    if not source and sys.prefix != sys.base_prefix:
        raise TestbedError("host_python needs the base interpreter, not a virtual environment")
    site = next((prefix / "lib").glob("python3*/site-packages"))
    tag = hashlib.sha256(f"{prefix}:{site.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    copy = Path("/opt/ddpctl-testbed") / f"python-{tag}"
    if not copy.exists():
        copy.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = copy.parent / f".{copy.name}.{os.getpid()}"
        _sh("cp", "-al", str(prefix), str(tmp))
        try:
            os.rename(tmp, copy)
        except OSError:  # another bed made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return {"PATH": f"{copy}/bin:/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": f"{copy}/lib"}


def _write_user_file(path: Path, text: str, user: str, mode: int) -> None:
    """Write a file (and its parent, mode 0700) in a test user's home, owned by that user."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    shutil.chown(path.parent, user, user)
    path.write_text(text)
    os.chmod(path, mode)
    shutil.chown(path, user, user)


# -- teardown: works from the saved state alone, so it also serves stale beds of dead processes -------------

def _teardown_host(host: dict[str, Any]) -> None:
    pids = _netns_pids(host["netns"]) + _user_pids(host["user"])
    pid = _read_pid(Path(host["dir"], "sshd.pid"))
    _kill_and_wait(pids + ([pid] if pid else []))
    _run("ip", "link", "del", host["veth"])
    _run("ip", "netns", "del", host["netns"])
    if _run("id", "-u", host["user"]).returncode == 0:
        for _ in range(20):
            proc = _run("userdel", "--remove", host["user"])
            if proc.returncode == 0 or "lock" not in proc.stderr:
                break
            time.sleep(0.2)
    shutil.rmtree(host["home"], ignore_errors=True)
    shutil.rmtree(host["dir"], ignore_errors=True)


def _teardown_bed(state: BedState) -> None:
    for host in state.hosts:
        _teardown_host(host)
    if state.iptables_rule:
        while _run("iptables", "-w", "-D", *state.iptables_rule).returncode == 0:
            pass
    _run("ip", "link", "del", state.bridge)


def load_state(bed_dir: Path) -> BedState | None:
    try:
        return BedState(**json.loads((bed_dir / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def list_beds() -> list[tuple[Path, BedState | None]]:
    """Every bed directory under STATE_ROOT with its state (None when unreadable)."""
    if not STATE_ROOT.is_dir():
        return []
    return [(d, load_state(d)) for d in sorted(STATE_ROOT.glob("bed-*")) if d.is_dir()]


def owner_alive(state: BedState) -> bool:
    return state.owner_pid is not None and _start_time(state.owner_pid) == state.owner_start


def stop_bed_dir(bed_dir: Path) -> None:
    """Tear down the bed recorded in bed_dir (whoever made it) and remove the directory."""
    state = load_state(bed_dir)
    if state:
        _teardown_bed(state)
    shutil.rmtree(bed_dir, ignore_errors=True)


def cleanup_stale(prefix: str | None = None, *, include_persistent: bool = False) -> list[int]:
    """Remove beds whose owner process is gone (by name prefix if given); returns their indexes."""
    removed = []
    for bed_dir, state in list_beds():
        if state is None:
            # A bed being claimed right now has no state for a moment; an old unreadable one is debris.
            if time.time() - bed_dir.stat().st_mtime > 60:
                shutil.rmtree(bed_dir, ignore_errors=True)
            continue
        if prefix and state.prefix != prefix:
            continue
        if owner_alive(state) or (state.owner_pid is None and not include_persistent):
            continue
        stop_bed_dir(bed_dir)
        removed.append(state.idx)
    return removed


def _claim_index() -> tuple[Path, int]:
    """Atomically claim a bed index whose directory and subnet are free."""
    STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for idx in range(1, 255):
        if f" {SUBNET_FMT.format(idx=idx)}." in used:
            continue
        bed_dir = STATE_ROOT / f"bed-{idx}"
        try:
            bed_dir.mkdir(mode=0o755)
        except FileExistsError:
            continue
        return bed_dir, idx
    raise TestbedError(f"no free test bed index: remove stale beds (python -m infra.testbed stop --all) "
                       f"or {STATE_ROOT}")


# -- processes and commands -------------------------------------------------------------------------------

def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _sh(*argv: str) -> None:
    proc = _run(*argv)
    if proc.returncode != 0:
        raise TestbedError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): tells a live owner from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _netns_pids(netns: str) -> list[int]:
    out = _run("ip", "netns", "pids", netns).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _user_pids(user: str) -> list[int]:
    proc = _run("id", "-u", user)
    if proc.returncode != 0:
        return []
    uid = int(proc.stdout)
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
    return pids


def _kill_and_wait(pids: list[int], timeout: float = 5) -> None:
    """SIGKILL the given processes (only ones the bed made: its sshds, its users', its namespaces') and wait."""
    for pid in set(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for pid in set(pids):
        while _start_time(pid) is not None and _state_of(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)


def _state_of(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


if __name__ == "__main__":
    from infra.testbed_cli import main

    main()
