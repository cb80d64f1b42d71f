"""Runs on node 0 (standard library only; sent as source, launcher/planning/rdzv_reservation.py): choose the run's
rendezvous port, reserve it for the run under a lock shared by every user of the host, and hold it listening for
a moment so the other nodes can show they reach it; release the reservation when the run no longer needs it.

A reservation is a file `port-PORT-RUN` in the reservation directory (mode 1777, sticky: any login user may
reserve, only the owner may remove). It is live while a socket listens on its port (a torchrun listening always
wins), or while it is younger than its time to live and its run's torchrun has not ended. Reservations are kept
per network namespace (ports are). Answers are one line, as the launcher reads them (`Refusal` below)."""

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import time

from launcher.remote import daemon


class Refusal(Exception):
    """Why no port was reserved, as the one line the launcher reads: `reserved PORT RUN USER AGE LISTENING`,
    `in-use PORT`, `bind-failed: TEXT`, `unsafe: TEXT` or `locked: TEXT`."""


def netns() -> str:
    """This process's network namespace (reservations of another namespace are about other ports)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def listening(port: int) -> bool:
    """Whether a socket listens on `port`, read from /proc, never by binding: a test bind could make a starting
    torchrun fail to bind its store."""
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


def open_dir(path: str, create: bool) -> bool:
    """Whether the reservation directory exists (made, 1777, with `create`); Refusal when it is not safe to use."""
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
        raise Refusal(f"unsafe: {path} is not a directory (a link or a file): remove it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise Refusal(f"unsafe: {path} is writable by others without the sticky bit (mode "
                      f"{st.st_mode & 0o7777:o}): remove it or chmod 1777 it")
    return True


def lock(path: str, create: bool, wait: float = 30.0) -> "int | None":
    """The directory's lock, held (a descriptor); None when there is no lock file and `create` is off."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(os.path.join(path, ".lock"), flags, 0o644)  # read-only is enough for flock: any user
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Refusal(f"unsafe: cannot open {path}/.lock ({e}): remove it") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refusal(f"unsafe: {path}/.lock is not a regular file: remove it")
    deadline = time.time() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.time() > deadline:
                os.close(fd)
                raise Refusal(f"locked: {path}/.lock was held by another process for {wait:g} s") from None
            time.sleep(0.05)


def reservations(path: str) -> "list[dict]":
    """Every readable reservation in `path`, with its file name, owner, age and port."""
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


def ended(r: dict) -> bool:
    """Whether the reservation's run has ended; only the owner can see into its workspace (0700): another user's
    reservation is judged by age alone."""
    return r["uid"] == os.getuid() and os.path.exists(os.path.join(str(r.get("workspace", "")), "exit_code"))


def live(r: dict, ttl: float) -> bool:
    return listening(r["port"]) or (r["age"] < ttl and not ended(r))


def _bind(family: int, addr: str, port: int) -> "socket.socket | OSError":
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((addr, port))
        return s
    except OSError as e:
        s.close()
        return e


def _choose(addr: str, port: int, any_free: bool, held: dict) -> socket.socket:
    """A socket bound to `port` (unless another run holds it or it is in use), else, with `any_free`, to a port
    the host offers that no run holds."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    if port in held:
        if not any_free:
            r = held[port]
            raise Refusal(f"reserved {port} {r.get('run_id', '?')} {r.get('user', '?')} {int(r['age'])} "
                          f"{int(listening(port))}")
    elif listening(port):
        if not any_free:
            raise Refusal(f"in-use {port}")
    else:
        got = _bind(family, addr, port)
        if not isinstance(got, OSError):
            return got
        if not any_free:
            raise Refusal(f"bind-failed: {got}")
    refused: list[socket.socket] = []
    try:
        while len(refused) < 64:
            got = _bind(family, addr, 0)
            if isinstance(got, OSError):
                raise Refusal(f"bind-failed: {got}")
            if got.getsockname()[1] not in held:
                return got
            refused.append(got)
    finally:
        for s in refused:
            s.close()
    raise Refusal("bind-failed: every port the host offered is reserved by other runs")


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def reserve(addr: str, port: int, *, any_free: bool, run_id: str, path: str, ttl: float,
            workspace: str) -> socket.socket:
    """Choose node 0's port (`port` unless reserved by another live run or in use; with `any_free` then another),
    reserve it for `run_id` (an empty run id reserves nothing: it only reads), and return its socket, listening.
    `workspace` is the run's, relative to home: a reservation whose run recorded its exit code there is over."""
    writing = bool(run_id)
    fd = lock(path, writing) if open_dir(path, writing) else None
    try:
        here = netns()
        held: dict[int, dict] = {}
        mine_stale: list[str] = []
        for r in reservations(path) if fd is not None else []:
            if r.get("netns") != here:
                continue
            if r.get("run_id") == run_id or not live(r, ttl):
                if writing and r["uid"] == os.getuid():
                    mine_stale.append(r["file"])  # ours: this run's earlier one, or stale by rule
                continue
            held.setdefault(r["port"], r)
        chosen = _choose(addr, port, any_free, held)
        chosen.listen(16)
        if writing:
            for name in mine_stale:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, name))
            _write_reservation(path, run_id, chosen.getsockname()[1], addr, here, workspace)
        return chosen
    finally:
        if fd is not None:
            os.close(fd)  # released here: a child left listening must not hold the lock


def _write_reservation(path: str, run_id: str, port: int, addr: str, here: str, workspace: str) -> None:
    record = {"run_id": run_id, "port": port, "addr": addr, "netns": here, "user": _user(), "created": time.time(),
              "workspace": os.path.join(os.path.expanduser("~"), workspace)}
    temp = os.path.join(path, f".new-{run_id}-{os.getpid()}")
    try:
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.fchmod(out, 0o644)  # every user's probe must read it, whatever the umask
        os.write(out, json.dumps(record).encode())
        os.close(out)
        os.rename(temp, os.path.join(path, f"port-{port}-{run_id}"))
    except OSError as e:
        raise Refusal(f"unsafe: cannot write a reservation in {path} ({e}): have it removed (rm -r {path}) "
                      "and rerun") from e


def accept(sock: socket.socket, expect: int, seconds: float) -> int:
    """Accept (and close) `expect` connections, or stop after `seconds`; the number accepted."""
    deadline = time.time() + seconds
    sock.settimeout(1.0)
    accepted = 0
    while accepted < expect and time.time() < deadline:
        try:
            c, _ = sock.accept()
            c.close()
            accepted += 1
        except TimeoutError:
            pass
    sock.close()
    return accepted


def connect(addr: str, port: int, timeout: float) -> str:
    """`ok` when a connection to addr:port opens within `timeout` seconds, else `failed: WHY`."""
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return "ok"
    except OSError as e:
        return f"failed: {e}"


def release(run_id: str, path: str, wait: float, workspace: str) -> str:
    """Remove `run_id`'s reservations (this user's): `released N`. While the run's torchrun has been started
    (WORKSPACE/pid) but has neither ended (exit_code) nor begun listening, answer `waiting` and go on in the
    background, waiting for one of those (at most `wait` seconds) first, so the port stays reserved until
    torchrun holds it."""
    workspace = os.path.join(os.path.expanduser("~"), workspace)

    def ours() -> "list[dict]":
        return [r for r in reservations(path) if r.get("run_id") == run_id and r["uid"] == os.getuid()]

    def starting(found: "list[dict]") -> bool:
        return (os.path.exists(os.path.join(workspace, "pid"))
                and not os.path.exists(os.path.join(workspace, "exit_code"))
                and not all(listening(r["port"]) for r in found))

    found = ours() if open_dir(path, False) else []
    if not found:
        return "released 0"
    if wait > 0 and starting(found):
        daemon.detach("waiting")
        deadline = time.time() + wait
        while time.time() < deadline and starting(ours()):
            time.sleep(0.5)
    fd = lock(path, False)
    count = 0
    try:
        for r in ours():
            try:
                os.unlink(os.path.join(path, r["file"]))
                count += 1
            except OSError:
                pass
    finally:
        if fd is not None:
            os.close(fd)
    return f"released {count}"


def main(argv: "list[str]") -> int:
    """`release RUN_ID DIR WAIT WORKSPACE`: prints `released N` or `waiting` (then goes on detached)."""
    if argv[:1] != ["release"] or len(argv) != 5:
        print("usage: release RUN_ID DIR WAIT WORKSPACE", file=sys.stderr)
        return 2
    try:
        print(release(argv[1], argv[2], float(argv[3]), argv[4]))
    except Refusal as refusal:
        print(refusal)
        return 1
    return 0
