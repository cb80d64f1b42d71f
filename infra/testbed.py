"""A real multi-host test bed on one Linux machine (root): network namespaces on a bridge, each one an SSH host.

Each host is a network namespace joined to the bed's bridge by a veth pair, running its own OpenSSH sshd
(own config, own host key, its own address and port) and having its own login user (own home = own workspace;
all namespaces share one file system and hostname). The launcher in the root namespace reaches hosts at their
bridge address; hosts reach each other over the bridge. By default the hosts differ as real machines do (their
interface's name, a docker0 that leads nowhere, the home's parent, python3's path: infra/testbed_variety.py), so
that every multi-node test meets what a user with different machines meets; `varied=False` makes them identical.

Several beds may run at once (different engineers' test runs): a bed claims a free index `idx` (directory
/tmp/ddpctl-testbed/bed-<idx>), uses subnet 10.231.<idx>.0/24 and names every resource `<prefix><idx>...`.
Every resource is recorded in the bed's state.json *before* it is created, so `stop()` (and `cleanup_stale()`
for beds whose owner died) removes exactly what was made, even after a partial start.

    with Testbed(n_hosts=2, ports=[22, 2222]) as bed:
        host = bed.hosts[0]          # host.spec == "ddptb7h0@10.231.7.2:22"
        bed.write_known_hosts(path)  # trust the hosts' keys

For what runs on a host (a per-host Docker engine, jobs): `host.nsenter()` enters its network namespace
(nsenter, not `ip netns exec`, which remounts /sys), `host.user`/`host.home` are its login user and workspace,
`host.update_ssh_environment({...})` sets variables of that user's SSH sessions (~/.ssh/environment,
PermitUserEnvironment yes), `Testbed(..., host_python=True)` gives sessions this machine's python3 with torch.
stop() SIGKILLs every process in a host's namespace or of its user: stop your own daemons first.

Usable by hand: `python -m infra.testbed start --hosts 3 | list | stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra import testbed_variety as variety
from infra.testbed_host import (  # noqa: F401 - TestHost, TestbedError, SSHD re-exported
    SSHD,
    TestbedError,
    TestHost,
    kill_and_wait,
    netns_pids,
    process_state,
    read_pid,
    remove_mounted_tree,
    run_cmd,
    sh,
    shared_python_env,
    start_time,
    user_pids,
    write_user_file,
)
from launcher.planning.rdzv_reservation import RESERVATION_DIR

STATE_ROOT = Path(os.environ.get("DDPCTL_TESTBED_ROOT", "/tmp/ddpctl-testbed"))
SUBNET_FMT = "10.231.{idx}"
HOST_IFACE = "eth0"  # the interface name inside every host's namespace of an identical (varied=False) bed
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # short: interface names are limited to 15 characters

# What beds this process started, for a test session's end-of-run check (tests/session_leaks.py). With
# WATCH_NAMESPACES on, each host's network namespace is also held open by a descriptor: a namespace's identity
# (its inode) is then not reused once the bed deleted its name, so a process left inside it can still be found.
STARTED_HERE: list[BedState] = []
WATCHED_NAMESPACES: dict[str, int] = {}  # namespace name -> open descriptor on it
WATCH_NAMESPACES = False


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
                 *, persistent: bool = False, host_python: bool = False, varied: bool = True) -> None:
        """`host_python`: hosts' SSH sessions get this machine's Python (with torch) first on PATH, and one
        thread per torch process. `varied` (the default): hosts differ as real machines do (interface names, a
        docker0 that leads nowhere, homes, python3 paths; infra/testbed_variety.py); `varied=False` gives identical
        hosts (interface eth0, homes under /home), for a test that needs them and says why."""
        if not _PREFIX_RE.match(name_prefix):
            raise ValueError(f"name_prefix {name_prefix!r}: use 1-8 lower-case letters or digits, first a letter")
        if os.geteuid() != 0:
            raise TestbedError("the test bed needs root (network namespaces, users, sshd)")
        ports = list(ports) if ports is not None else [22] * n_hosts
        if len(ports) != n_hosts:
            raise ValueError(f"{n_hosts} hosts but {len(ports)} ports given")
        self.prefix = name_prefix
        self.varied = varied
        self._stopped = False
        self.dir, idx = _claim_index()
        self.hosts: list[TestHost] = []
        # Every host is a namespace on this machine's cores, which all hosts and runs share: one intra-op thread
        # per torch process (as torchrun sets when it starts several on a node; a run's own OMP_NUM_THREADS
        # still wins), so that a rank's spare thread does not spin against the ranks of the other hosts.
        self.host_env = {**shared_python_env(), "OMP_NUM_THREADS": "1"} if host_python else {}
        owner = None if persistent else os.getpid()
        self.state = BedState(idx=idx, prefix=name_prefix, owner_pid=owner,
                              owner_start=start_time(owner) if owner else None,
                              bridge=f"{name_prefix}br{idx}", bridge_address=f"{SUBNET_FMT.format(idx=idx)}.1",
                              client_key_path=str(self.dir / "client_ed25519"))
        STARTED_HERE.append(self.state)
        self._save()
        try:
            self._start_network()
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ddpctl-testbed-{idx}",
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
                        port=port, user=name, home=variety.host_home(k, name) if self.varied else f"/home/{name}",
                        iface=variety.host_iface(k) if self.varied else HOST_IFACE, veth=name,
                        dir=str(self.dir / name), client_key_path=self.client_key_path)
        self.state.hosts.append(asdict(host))
        self._save()
        os.makedirs(host.dir, mode=0o700)
        self._create_namespace(host)
        self._create_user(host)
        host._make_host_key()
        host.start_sshd()
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

    def reset(self) -> None:
        """Every host as the bed made it, for the next tests that share the bed: its link up, its sshd running with
        SFTP, no process of its user, a home holding only the bed's SSH files, its rendezvous reservations gone."""
        for host in self.hosts:
            host.link_up()
            kill_and_wait(user_pids(host.user))
            pid = read_pid(Path(host.dir, "sshd.pid"))
            if not host.sftp:
                host.set_sftp(True)
            elif pid is None or process_state(pid) in (None, "Z"):
                host.start_sshd()
            for entry in Path(host.home).iterdir():
                if entry.name == ".ssh":
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    remove_mounted_tree(str(entry))
                else:
                    entry.unlink()
            self._write_login_files(host)
        _remove_reservations({host.user for host in self.hosts})

    def stop(self) -> None:
        """Remove everything the bed made; safe after a partial start. A second call does nothing: once the
        directory is gone, its index (and with it the bridge's and the namespaces' names) may be another bed's."""
        if self._stopped:
            return
        self._stopped = True
        _teardown_bed(self.state)  # before the directory goes: the directory is the claim on the index
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
        sh("ip", "link", "add", br, "type", "bridge")
        sh("ip", "addr", "add", f"{self.state.bridge_address}/24", "dev", br)
        sh("ip", "link", "set", br, "up")
        chain = "DOCKER-USER" if run_cmd("iptables", "-w", "-S", "DOCKER-USER").returncode == 0 else "FORWARD"
        # Docker sets the FORWARD policy to DROP; bridged traffic between namespaces must be let through.
        self.state.iptables_rule = [chain, "-i", br, "-o", br, "-j", "ACCEPT"]
        self._save()
        sh("iptables", "-w", "-I", *self.state.iptables_rule)

    def _create_namespace(self, host: TestHost) -> None:
        peer = f"{self.prefix}{self.idx}p{host.index}"
        sh("ip", "netns", "add", host.netns)
        if WATCH_NAMESPACES:
            WATCHED_NAMESPACES[host.netns] = os.open(f"/run/netns/{host.netns}", os.O_RDONLY)
        sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", host.netns)
        sh("ip", "link", "set", host.veth, "master", self.state.bridge, "up")
        sh("ip", "-n", host.netns, "link", "set", peer, "name", host.iface)
        sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.iface)
        sh("ip", "-n", host.netns, "link", "set", host.iface, "up")
        sh("ip", "-n", host.netns, "link", "set", "lo", "up")
        if self.varied:
            variety.add_decoy_interface(host.netns, self.idx)

    def _create_user(self, host: TestHost) -> None:
        # '*' as password: the account is unlocked (sshd without PAM refuses locked ones) but has no password.
        for attempt in range(20):  # useradd fails when another bed holds the passwd lock at the same moment
            proc = run_cmd("useradd", "--create-home", "--home-dir", host.home, "--shell", "/bin/bash",
                        "--user-group", "--password", "*", host.user)
            if proc.returncode == 0:
                break
            if attempt == 19 or "lock" not in proc.stderr:
                raise TestbedError(f"useradd {host.user} failed: {proc.stderr.strip()}")
            time.sleep(0.2)
        self._write_login_files(host)

    def _write_login_files(self, host: TestHost) -> None:
        """The bed's client key as the user's only authorized key; the bed's variables for every SSH session."""
        pub = Path(self.client_key_path + ".pub").read_text()
        write_user_file(Path(host.home, ".ssh", "authorized_keys"), pub, host.user, 0o600)
        host.set_ssh_environment(variety.host_python_env(self.dir, host.name, self.host_env) if self.varied
                                 else self.host_env)


# -- teardown: works from the saved state alone, so it also serves stale beds of dead processes -------------

def _teardown_host(host: dict[str, Any]) -> None:
    pids = netns_pids(host["netns"]) + user_pids(host["user"])
    pid = read_pid(Path(host["dir"], "sshd.pid"))
    kill_and_wait(pids + ([pid] if pid else []))
    run_cmd("ip", "link", "del", host["veth"])
    for _ in range(20):  # under load a delete has been seen to fail once and leave the namespace mounted
        deleted = run_cmd("ip", "netns", "del", host["netns"]).returncode == 0
        if deleted or not Path("/run/netns", host["netns"]).exists():
            break
        time.sleep(0.5)
    if run_cmd("id", "-u", host["user"]).returncode == 0:
        for _ in range(20):
            proc = run_cmd("userdel", "--remove", host["user"])
            if proc.returncode == 0 or "lock" not in proc.stderr:
                break
            time.sleep(0.2)
    # A host's dockerd killed above (its test failed before stopping it) leaves its data root mounted.
    for tree in (host["home"], host["dir"], f"/run/{host['netns']}-docker"):
        with contextlib.suppress(TestbedError):
            remove_mounted_tree(tree)
        shutil.rmtree(tree, ignore_errors=True)


def _teardown_bed(state: BedState) -> None:
    for host in state.hosts:
        _teardown_host(host)
    _remove_reservations({host["user"] for host in state.hosts})
    if state.iptables_rule:
        while run_cmd("iptables", "-w", "-D", *state.iptables_rule).returncode == 0:
            pass
    run_cmd("ip", "link", "del", state.bridge)


def _remove_reservations(users: set[str]) -> None:
    """The rendezvous-port reservations of a bed's users (RESERVATION_DIR is shared by every bed on the machine):
    debris once the users are gone, and a later bed whose network namespace gets the same id (the kernel reuses
    them) would find its default port held by a run that no longer exists."""
    for path in Path(RESERVATION_DIR).glob("port-*"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("user") in users:
            path.unlink(missing_ok=True)


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
    return state.owner_pid is not None and start_time(state.owner_pid) == state.owner_start


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
    used = run_cmd("ip", "-o", "-4", "addr", "show").stdout
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


if __name__ == "__main__":
    from infra.testbed_cli import main

    main()
