"""Rendezvous port reservations on node 0: the probe picks node 0's port and reserves it for the run in one step,
under a lock shared by every user of the host, so two runs probing at the same moment never get the same port.

The port is only *bound* minutes later, when torchrun starts (after the ship). Between the two, a reservation
file in RESERVATION_DIR (mode 1777, sticky: any login user may reserve, only the owner may remove) tells every
other probe that the port is taken. A reservation is live while a socket listens on its port (a torchrun
listening always wins), or while it is younger than RESERVATION_TTL and its run's torchrun has not ended; a
launcher that died leaves one that goes stale by that rule. Reservations are kept per network namespace (ports
are), and each names its run. `up` releases its reservation however it ends (`reservation_released`); `down`
releases it too. A dry run or `doctor` reads reservations (to avoid a reserved port) but writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from launcher.errors import HostError
from launcher.planning.plan import REMOTE_RUNS_ROOT
from launcher.remote import daemon, source_of
from launcher.transport.parallel import run_on_hosts

if TYPE_CHECKING:
    from launcher.transport.connection import HostConnection
    from launcher.transport.hostsession import HostSession

# The same directory for every user of a host, so it is not $TMPDIR (which may differ between users).
RESERVATION_DIR = "/tmp/ddpctl-rdzv"
# Seconds a reservation of a run that has not started torchrun stays live: covers the ship (image streaming and
# code, retried) between the probe and torchrun's start. Past it, only a listening socket keeps the port.
RESERVATION_TTL = 3600
RELEASE_TIMEOUT = 10.0  # seconds: a node 0 that cannot be reached leaves its reservation to go stale

# Shared by both scripts (standard library only; run on node 0 with the run's python), after the daemon helper.
_COMMON = source_of(daemon) + r"""
import fcntl, json, os, socket, stat, sys, time

def fail(kind, text):
    print("%s: %s" % (kind, text)); sys.stdout.flush(); os._exit(1)

def netns():
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""

def listening(port):
    # Read from /proc, never by binding: a test bind could make a starting torchrun fail to bind its store.
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except (OSError, StopIteration, ValueError):
            continue
    return False

def open_dir(path, create):
    if create:
        old = os.umask(0)
        try:
            os.mkdir(path, 0o1777)
        except FileExistsError:
            pass
        finally:
            os.umask(old)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        fail("unsafe", "%s is not a directory (a link or a file): remove it" % path)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        fail("unsafe", "%s is writable by others without the sticky bit (mode %o): remove it or chmod 1777 it"
             % (path, st.st_mode & 0o7777))
    return True

def lock(path, create, wait=30.0):
    flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(os.path.join(path, ".lock"), flags, 0o644)  # read-only is enough for flock: any user
    except FileNotFoundError:
        return None
    except OSError as e:
        fail("unsafe", "cannot open %s/.lock (%s): remove it" % (path, e))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fail("unsafe", "%s/.lock is not a regular file: remove it" % path)
    deadline = time.time() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.time() > deadline:
                fail("locked", "%s/.lock was held by another process for %d s" % (path, wait))
            time.sleep(0.05)

def reservations(path):
    found = []
    for name in os.listdir(path):
        if not name.startswith("port-"):
            continue
        try:
            fd = os.open(os.path.join(path, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
                    continue
                data = json.loads(os.read(fd, 4096).decode())
            finally:
                os.close(fd)
            if isinstance(data, dict):
                found.append(dict(data, file=name, uid=st.st_uid, age=time.time() - st.st_mtime,
                                  port=int(data["port"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found

def ended(r):
    # Only the owner can see into its workspace (0700): another user's reservation is judged by age alone.
    return r["uid"] == os.getuid() and os.path.exists(os.path.join(str(r.get("workspace", "")), "exit_code"))

def live(r, ttl):
    return listening(r["port"]) or (r["age"] < ttl and not ended(r))
"""

# argv: ADDR PORT EXPECT SECONDS ANY_FREE RUN_ID DIR TTL WORKSPACE. Chooses node 0's port (PORT unless reserved by
# another live run or in use; with ANY_FREE another the host offers), reserves it for RUN_ID (none when RUN_ID is
# empty: read-only), listens on it, then forks: the parent reports, the child accepts EXPECT connections or times
# out. Prints `listening PORT`, or one of `reserved PORT RUN USER AGE LISTENING`, `in-use PORT`, `bind-failed: ..`,
# `unsafe: ..`, `locked: ..` and exits 1.
RESERVE_SCRIPT = _COMMON + r"""
addr, port, expect, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
any_free, run_id, path, ttl, workspace = sys.argv[5] == "1", sys.argv[6], sys.argv[7], float(sys.argv[8]), sys.argv[9]
writing = bool(run_id)
fd = lock(path, writing) if open_dir(path, writing) else None
here, held, mine_stale = netns(), {}, []
for r in reservations(path) if fd is not None else []:
    if r.get("netns") != here:
        continue
    if r.get("run_id") == run_id or not live(r, ttl):
        if writing and r["uid"] == os.getuid():
            mine_stale.append(r["file"])  # ours: this run's earlier one, or stale by rule
        continue
    held.setdefault(r["port"], r)
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET

def bind(p):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((addr, p))
        return s
    except OSError as e:
        s.close()
        return e

chosen = None
if port in held:
    if not any_free:
        r = held[port]
        print("reserved %d %s %s %d %d" % (port, r.get("run_id", "?"), r.get("user", "?"), r["age"],
                                           listening(port)))
        sys.exit(1)
elif listening(port):
    if not any_free:
        print("in-use %d" % port); sys.exit(1)
else:
    got = bind(port)
    if isinstance(got, OSError) and not any_free:
        print("bind-failed: %s" % got); sys.exit(1)
    chosen = got if not isinstance(got, OSError) else None
refused = []
while chosen is None and len(refused) < 64:
    got = bind(0)  # a port the host offers, unless another run holds a reservation on it
    if isinstance(got, OSError):
        print("bind-failed: %s" % got); sys.exit(1)
    if got.getsockname()[1] in held:
        refused.append(got)
    else:
        chosen = got
for s in refused:
    s.close()
if chosen is None:
    print("bind-failed: every port the host offered is reserved by other runs"); sys.exit(1)
chosen.listen(16)
port = chosen.getsockname()[1]
if writing:
    for name in mine_stale:
        try:
            os.unlink(os.path.join(path, name))
        except OSError:
            pass
    try:
        import pwd
        user = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        user = str(os.getuid())
    home = os.path.expanduser("~")
    record = {"run_id": run_id, "port": port, "addr": addr, "netns": here, "user": user, "created": time.time(),
              "workspace": os.path.join(home, workspace)}
    temp = os.path.join(path, ".new-%s-%d" % (run_id, os.getpid()))
    try:
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.fchmod(out, 0o644)  # every user's probe must read it, whatever the umask
        os.write(out, json.dumps(record).encode())
        os.close(out)
        os.rename(temp, os.path.join(path, "port-%d-%s" % (port, run_id)))
    except OSError as e:
        fail("unsafe", "cannot write a reservation in %s (%s): have it removed (rm -r %s) and rerun" % (path, e, path))
if fd is not None:
    os.close(fd)  # the lock is released here: the child must not hold it
detach("listening %d" % port)  # launcher/remote/daemon.py: the SSH channel closes, the child accepts
deadline = time.time() + seconds
chosen.settimeout(1.0)
while expect > 0 and time.time() < deadline:
    try:
        c, _ = chosen.accept(); c.close(); expect -= 1
    except socket.timeout:
        pass
"""

# argv: RUN_ID DIR WAIT WORKSPACE. Removes RUN_ID's reservations (this user's). While the run's torchrun has been
# started (WORKSPACE/pid) but has neither ended (exit_code) nor begun listening, a detached child waits for one of
# those (at most WAIT seconds) first, so the port stays reserved until torchrun holds it. Prints `released N` or
# `waiting`.
RELEASE_SCRIPT = _COMMON + r"""
run_id, path, wait, workspace = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
workspace = os.path.join(os.path.expanduser("~"), workspace)

def ours():
    return [r for r in reservations(path) if r.get("run_id") == run_id and r["uid"] == os.getuid()]

def starting(found):
    return (os.path.exists(os.path.join(workspace, "pid")) and not os.path.exists(os.path.join(workspace, "exit_code"))
            and not all(listening(r["port"]) for r in found))

def remove():
    fd = lock(path, False)
    count = 0
    for r in ours():
        try:
            os.unlink(os.path.join(path, r["file"])); count += 1
        except OSError:
            pass
    if fd is not None:
        os.close(fd)
    return count

found = ours() if open_dir(path, False) else []
if found and wait > 0 and starting(found):
    detach("waiting")
    deadline = time.time() + wait
    while time.time() < deadline and starting(ours()):
        time.sleep(0.5)
print("released %d" % (remove() if found else 0))
"""

START_WAIT = 600.0  # seconds a release waits for a started torchrun to listen (it imports torch first)


def reserve_and_listen(conn: HostConnection, python: str, label: str, addr: str, port: int, *, expect: int,
                       seconds: float, any_free: bool, run_id: str | None) -> int:
    """Choose node 0's rendezvous port (`port` unless another run reserved it or it is in use; with `any_free`
    then another), reserve it for `run_id` (None: reserve nothing) and listen on it for `expect` connections.
    Returns the port; an explicit port that is taken is refused in one line."""
    workspace = f"{REMOTE_RUNS_ROOT}/{run_id}" if run_id else ""
    result = conn.run([python, "-c", RESERVE_SCRIPT, addr, str(port), str(expect), str(seconds),
                       "1" if any_free else "0", run_id or "", RESERVATION_DIR, str(RESERVATION_TTL), workspace],
                      timeout=seconds - 10)
    answer = result.stdout.strip()
    if result.exit_code == 0 and answer.startswith("listening "):
        return int(answer.split()[1])
    words = answer.split()
    advice = "omit --rdzv-port to have a free port chosen, or pick another with --rdzv-port"
    if len(words) == 6 and words[0] == "reserved":
        _, taken, run, user, age, bound = words
        state = ("its torchrun listens there" if bound == "1"
                 else f"reserved {int(age)} s ago, torchrun not started yet")
        raise HostError(label, f"rendezvous port {taken} on node 0 is held by run {run} of user {user} ({state}): "
                        f"{advice}")
    if answer.startswith(("unsafe: ", "locked: ")):
        raise HostError(label, f"cannot reserve node 0's rendezvous port: {answer.split(': ', 1)[1]}")
    if len(words) == 2 and words[0] == "in-use":
        raise HostError(label, f"rendezvous port {words[1]} on node 0 is in use by another program: {advice}")
    raise HostError(label, f"cannot listen on rendezvous address {addr}:{port} "
                    f"({answer or result.stderr.strip()[-300:]}); pass --rdzv-addr or --rdzv-port")


def release_reservation(conn: HostConnection, python: str, run_id: str, wait: float = START_WAIT) -> str:
    """Remove the run's reservation on node 0 (at once, or once its started torchrun listens); the script's
    answer. A reservation left behind goes stale by rule."""
    result = conn.run([python, "-c", RELEASE_SCRIPT, run_id, RESERVATION_DIR, str(wait),
                       f"{REMOTE_RUNS_ROOT}/{run_id}"], timeout=RELEASE_TIMEOUT)
    return str(result.stdout).strip()


def release_on_node0(session: HostSession, python: str, run_id: str) -> None:
    """Release the run's reservation on node 0's host, bounded in time; a host that cannot be reached keeps it
    until it goes stale."""
    if len(session.targets) < 2:
        return  # one node: no rendezvous port was reserved
    run_on_hosts([0], lambda i: release_reservation(session.conn(i), python, run_id), timeout=RELEASE_TIMEOUT + 5,
                 label=session.label_of)


@contextmanager
def reservation_released(session: HostSession, python: str, run_id: str) -> Iterator[None]:
    """Around `up` on hosts from the probe on: however it ends (finished, failed, interrupted, refused before
    the start, detached), node 0's reservation is released, a started torchrun's once it listens."""
    try:
        yield
    finally:
        release_on_node0(session, python, run_id)


def rendezvous_taken_hint(port: int | None, node: int) -> str | None:
    """When node 0's torchrun could not bind its rendezvous port (another program took it after the probe):
    what happened and what to do, in one line. ddpctl does not retry on its own: every node's command names
    the port, so a retry is a new run."""
    if port is None or node != 0:
        return None
    return (f"rendezvous port {port} on node 0 was taken by another program between ddpctl's probe and "
            "torchrun's start (address already in use): rerun; without --rdzv-port ddpctl picks a port free then")
