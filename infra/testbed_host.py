"""One test bed host (network namespace + sshd + login user) and the process helpers the bed uses.

Split from infra/testbed.py, which re-exports TestHost and TestbedError; see its docstring.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


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
    host_key_types: tuple[str, ...] = ("ed25519",)  # `ssh-keygen -t` names; sshd has a host key of each
    host_key_public: str = ""  # the first type's public key line
    sftp: bool = True  # False: sshd offers no SFTP subsystem (set_sftp)

    @property
    def spec(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    @property
    def host_key_path(self) -> str:
        return self.host_key_file(self.host_key_types[0])

    def host_key_file(self, key_type: str) -> str:
        return f"{self.dir}/ssh_host_{key_type}_key"

    @property
    def host_key_fingerprint(self) -> str:
        """`SHA256:...` as `ssh-keygen -l` prints it."""
        blob = base64.b64decode(self.host_key_public.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

    @property
    def ssh_environment_path(self) -> str:
        """~/.ssh/environment: KEY=VALUE lines set in every SSH session (sshd has PermitUserEnvironment yes)."""
        return f"{self.home}/.ssh/environment"

    def known_hosts_line(self, key_type: str | None = None) -> str:
        """`name keytype base64` for the host's key of `key_type` (`ssh-keygen -t` name; default: the first)."""
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        public = Path(self.host_key_file(key_type) + ".pub").read_text() if key_type else self.host_key_public
        keytype, key = public.split()[:2]
        return f"{name} {keytype} {key}"

    def set_ssh_environment(self, env: dict[str, str]) -> None:
        """Replace the variables every SSH session of this host's user gets (e.g. DOCKER_HOST, PATH)."""
        text = "".join(f"{k}={v}\n" for k, v in env.items())
        write_user_file(Path(self.ssh_environment_path), text, self.user, 0o600)

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
        sh("ip", "link", "set", self.veth, "down")

    def link_up(self) -> None:
        sh("ip", "link", "set", self.veth, "up")

    def regenerate_host_key(self, key_types: Sequence[str] = ("ed25519",)) -> None:
        """Give the host new host keys of these types (`ssh-keygen -t` names: ed25519, ecdsa, rsa), sshd's only
        ones, and restart its sshd with them."""
        self.stop_sshd()
        for key_type in self.host_key_types:
            for suffix in ("", ".pub"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.host_key_file(key_type) + suffix)
        self.host_key_types = tuple(key_types)
        self._make_host_key()
        self.start_sshd()

    def set_sftp(self, enabled: bool) -> None:
        """Give sshd an SFTP subsystem or none (as a host whose sshd_config lacks `Subsystem sftp`), restarting it."""
        self.stop_sshd()
        self.sftp = enabled
        self.start_sshd()

    # -- life cycle (used by Testbed) --------------------------------------------------------------------

    def _make_host_key(self) -> None:
        for key_type in self.host_key_types:
            sh("ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", self.name, "-f", self.host_key_file(key_type))
        self.host_key_public = Path(self.host_key_path + ".pub").read_text().strip()

    def start_sshd(self) -> None:
        """Start the host's sshd and wait until it has written its pid file and accepts connections.

        The pid file is written just after the port is bound: returning on the port alone let a stop right
        after read no pid, leave the old sshd listening, and the next one fail to bind."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        config = Path(self.dir, "sshd_config")
        config.write_text(_sshd_config(self))
        pid_file = Path(self.dir, "sshd.pid")
        pid_file.unlink(missing_ok=True)
        sh(*self.nsenter(), SSHD, "-f", str(config), "-E", f"{self.dir}/sshd.log")
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as sock:
                sock.settimeout(1)
                if sock.connect_ex((self.address, self.port)) == 0 and read_pid(pid_file):
                    return
            if time.monotonic() > deadline:
                log = Path(self.dir, "sshd.log").read_text(errors="replace")[-2000:]
                raise TestbedError(f"{self.name}: sshd does not accept connections at "
                                   f"{self.address}:{self.port}; its log:\n{log}")
            time.sleep(0.05)

    def stop_sshd(self) -> None:
        pid = read_pid(Path(self.dir, "sshd.pid"))
        if pid:
            kill_and_wait([pid])


def _sshd_config(host: TestHost) -> str:
    host_keys = "\n".join(f"HostKey {host.host_key_file(t)}" for t in host.host_key_types)
    return f"""# test bed host {host.name}
Port {host.port}
ListenAddress {host.address}
{host_keys}
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
{"Subsystem sftp internal-sftp" if host.sftp else "# no SFTP subsystem (TestHost.sftp is False)"}
"""


def shared_python_env(source: str | None = None) -> dict[str, str]:
    """Environment giving test users this machine's Python and its packages (torch) as `python3`.

    The interpreter lives under /root (mode 0700, closed to test users), so it is hard-linked once (seconds,
    no space) to /opt/ddpctl-testbed/; its RPATH still names /root, hence LD_LIBRARY_PATH. A virtual
    environment (infra/setup.sh makes .venv where python3 is externally managed) is hard-linked the same way.
    """
    prefix = Path(source or sys.prefix)
    if not source and sys.prefix != sys.base_prefix and not _open_to_all(Path(sys.base_prefix)):
        raise TestbedError(f"host_python: this virtual environment's base python ({sys.base_prefix}) is closed to "
                           "other users; make the environment from a python they can run (e.g. /usr/bin/python3)")
    site = next((prefix / "lib").glob("python3*/site-packages"))
    tag = hashlib.sha256(f"{prefix}:{site.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    copy = Path("/opt/ddpctl-testbed") / f"python-{tag}"
    if not copy.exists():
        copy.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = copy.parent / f".{copy.name}.{os.getpid()}"
        sh("cp", "-al", str(prefix), str(tmp))
        try:
            os.rename(tmp, copy)
        except OSError:  # another bed made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return {"PATH": f"{copy}/bin:/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": f"{copy}/lib"}


def _open_to_all(path: Path) -> bool:
    """Every directory from / down to `path` lets other users through (a venv's base python then runs for them;
    the venv itself is hard-linked like any prefix, its bin/python3 a link to that base)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def write_user_file(path: Path, text: str, user: str, mode: int) -> None:
    """Write a file (and its parent, mode 0700) in a test user's home, owned by that user."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    shutil.chown(path.parent, user, user)
    path.write_text(text)
    os.chmod(path, mode)
    shutil.chown(path, user, user)


# -- processes and commands -------------------------------------------------------------------------------

def run_cmd(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def sh(*argv: str) -> None:
    proc = run_cmd(*argv)
    if proc.returncode != 0:
        raise TestbedError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): tells a live owner from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def netns_pids(netns: str) -> list[int]:
    out = run_cmd("ip", "netns", "pids", netns).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def user_pids(user: str) -> list[int]:
    proc = run_cmd("id", "-u", user)
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


def kill_and_wait(pids: list[int], timeout: float = 5) -> None:
    """SIGKILL the given processes (only ones the bed made: its sshds, its users', its namespaces') and wait."""
    for pid in set(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for pid in set(pids):
        while start_time(pid) is not None and process_state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def mounts_at_or_below(root: str) -> list[str]:
    """Mount points that are `root` itself or lie below it, as /proc/mounts lists them."""
    root = root.rstrip("/")
    with open("/proc/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [p for p in points if p == root or p.startswith(root + "/")]


def remove_mounted_tree(root: str) -> None:
    """Unmount `root` and whatever is mounted below it (deepest first), then remove it; raise if anything stays.

    dockerd bind-mounts its data root onto itself (to make it a shared mount) and mounts each layer below it; a
    stopped or killed dockerd may leave those behind, and a mounted directory cannot be removed.
    """
    for point in sorted(mounts_at_or_below(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(root)
    left = mounts_at_or_below(root)
    if left or os.path.exists(root):
        raise TestbedError(f"could not remove {root}: still mounted there: {', '.join(left) or 'nothing'}")
