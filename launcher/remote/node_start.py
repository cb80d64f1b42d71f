"""Runs on a host (sent as source, launcher/runtimes/start.py): start a node's command so that it outlives the SSH
connection, and record what every later poll and stop reads (docs/contracts.md's "Remote workspace").

`start`: in the workspace (made 0700), copy the code the launcher shipped to the host's code cache into code/ when
asked, write the files that came on standard input (the node's environment file, 0600, and the join hook: never on a
command line, and no second round trip for them), make out/ and logs/, forget
an earlier attempt's `pid` and `exit_code`, write the stop grace, then start the supervisor in a session of its own
(stdin /dev/null, output to torchrun.out), record its pid and start time (`pid`, `pid_start`: a pid alone is no
identity) and print the pid. The supervisor is this same program run again, from its text written to SUPERVISOR_FILE
in the workspace (so that `ps` and `htop` on the host show a file, not kilobytes of source), with the
marker argument NODE_MARKER and the workspace's absolute path, which is how a stop knows the process is the node's
even when the workspace is gone: it takes the node's environment from the file the launcher wrote (then deletes
it), runs the command from `cwd` and, when the command ends, records its exit status in `exit_code` (128+N for a
signal N, as a shell does). The supervisor's python runs without `site` (-S): it needs the standard library only,
and the command it starts gets its own python's usual start."""

import json
import os
import sys
import time

from launcher.remote import proctree

# The supervisor's first argument: how a stop tells the node's supervisor from any other process.
NODE_MARKER = "ddpctl-node"
# The supervisor's program (this one's text) in the workspace, run from there.
SUPERVISOR_FILE = "ddpctl_node.py"
# What the supervisor exports for the command; the workspace is found in it when its files are gone.
OUTPUT_DIR_ENV = "DDPCTL_OUTPUT_DIR"
# Tries of the code's copy: another run shipping the same code to the cache at that moment renames and prunes files
# under it; once that run is done the cache is whole again.
COPY_ATTEMPTS = 3


def decode_env(data: bytes) -> "list[tuple[bytes, bytes]]":
    """The variables of an environment file (launcher/runtimes/native.py's encode_env: one NAME=VALUE line each,
    every backslash doubled and every newline written as backslash-n)."""
    pairs = []
    for line in data.split(b"\n"):
        if not line:
            continue
        name, _, value = line.partition(b"=")
        out, i = bytearray(), 0
        while i < len(value):
            if value[i:i + 1] == b"\\" and value[i + 1:i + 2] in (b"\\", b"n"):
                out += b"\n" if value[i + 1:i + 2] == b"n" else b"\\"
                i += 2
            else:
                out += value[i:i + 1]
                i += 1
        pairs.append((name, bytes(out)))
    return pairs


def _own_program() -> "list[str]":
    """What runs the supervisor: this program's text (the `-c TEXT` it was started with) written to SUPERVISOR_FILE
    in the current directory (the workspace), and the interpreter that runs that file."""
    argv = sys.orig_argv
    text = argv[argv.index("-c") + 1]
    with open(SUPERVISOR_FILE + ".tmp", "w") as f:
        f.write(text)
    os.replace(SUPERVISOR_FILE + ".tmp", SUPERVISOR_FILE)
    return [sys.executable, "-S", os.path.join(os.getcwd(), SUPERVISOR_FILE)]


def read_request(payload: bytes) -> "tuple[list, dict | None] | str":
    """The start's standard input: a JSON list of the node's files, or {"files": [...], "code": {"cache": PATH
    (from the home folder), "dest": "" or "/NAME"}} with the code to copy into the workspace; or the error."""
    try:
        request = json.loads(payload) if payload.strip() else []
    except ValueError as e:
        return f"could not read the node's files: {e}"
    if isinstance(request, list):
        return request, None
    if not isinstance(request, dict) or not isinstance(request.get("files", []), list):
        return "could not read the node's files: not a list of files"
    code = request.get("code")
    return request.get("files", []), code if isinstance(code, dict) else None


def copy_code(home: str, cache: str, dest: str) -> "str | None":
    """Copy the code cache `cache` (under `home` when relative) to code`dest` in the current directory (the
    workspace), replacing what is there, links copied as links; the error, or None."""
    parts = dest.split("/")[1:]
    if not cache:
        return "no code cache named to copy into the workspace"
    if dest and (not dest.startswith("/") or ".." in parts or "" in parts):
        return f"refused to copy the code to code{dest}: not a path inside the workspace"
    import shutil  # LAZY: see LAZY_IMPORTS

    source, target = os.path.join(home, cache), "code" + dest
    for attempt in range(COPY_ATTEMPTS):
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            elif os.path.lexists(target):
                os.remove(target)
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            shutil.copytree(source, target, symlinks=True, copy_function=shutil.copy)
            return None
        except (OSError, shutil.Error) as e:
            if attempt == COPY_ATTEMPTS - 1:
                return f"could not copy the code from {source} into the workspace: {e}"
            time.sleep(1 + attempt)
    return None


def write_files(files: "list") -> "str | None":
    """Write `files` ([[PATH, BASE64, MODE], ...] from the start's request, paths inside the workspace) into the
    current directory, each created with its mode; the error, or None."""
    import base64  # LAZY: see LAZY_IMPORTS

    try:
        for path, data, mode in files:
            parts = path.split("/")
            if path.startswith("/") or ".." in parts or "" in parts:
                return f"refused to write {path!r}: not a path inside the workspace"
            if len(parts) > 1:
                os.makedirs(os.path.join(*parts[:-1]), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)  # never through a link
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)
                f.write(base64.b64decode(data))
    except (OSError, ValueError, TypeError) as e:
        return f"could not write the node's files: {e}"
    return None


def start(workspace: str, cwd: str, env_file: str, grace: str, files: str, command: "list[str]") -> int:
    """Start the node's supervisor detached; return 0 (its pid printed) or 3 (the workspace or file missing).
    `files`: "stdin" when the node's files come on standard input (read_request: with the code to copy, the
    workspace is made when missing), "" when they were written before."""
    request = read_request(sys.stdin.buffer.read()) if files == "stdin" else ([], None)
    if isinstance(request, str):
        print(request, file=sys.stderr)
        return 3
    listed, code = request
    try:
        os.chdir(os.path.expanduser("~"))
        home = os.getcwd()
        if code is not None:
            os.makedirs(workspace, 0o700, exist_ok=True)
        os.chdir(workspace)
    except OSError:
        print(f"no workspace {workspace}", file=sys.stderr)
        return 3
    here = os.getcwd()
    if files == "stdin":
        os.chmod(".", 0o700)  # before any file is written: nobody else may open them, even for a moment
        failed = (copy_code(home, str(code.get("cache", "")), str(code.get("dest", ""))) if code is not None
                  else None) or write_files(listed)
        if failed:
            print(failed, file=sys.stderr)
            return 3
    if env_file and not os.path.isfile(env_file):
        print(f"no environment file {os.path.join(here, env_file)}", file=sys.stderr)
        return 3
    for folder in ("out", "logs"):
        os.makedirs(folder, exist_ok=True)
    for name in ("exit_code", "pid"):
        if os.path.lexists(name):
            os.remove(name)
    _write("stop_grace", grace)
    import subprocess  # LAZY: see LAZY_IMPORTS

    with open("torchrun.out", "wb") as out:
        child = subprocess.Popen([*_own_program(), NODE_MARKER, here, cwd, env_file, *command],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
    _write("pid", str(child.pid))
    _write("pid_start", proctree.start_time(child.pid) or "")
    print(child.pid)
    return 0


def supervise(workspace: str, cwd: str, env_file: str, command: "list[str]") -> int:
    """The node's supervisor: run the command with the node's environment, then record its exit status."""
    env = dict(os.environb)
    env[OUTPUT_DIR_ENV.encode()] = os.fsencode(os.path.join(workspace, "out"))
    if env_file:
        path = os.path.join(workspace, env_file)
        with open(path, "rb") as f:
            env.update(decode_env(f.read()))
        os.remove(path)
    paths = [os.path.join(workspace, "hook"), os.path.join(workspace, "code")]
    before = env.get(b"PYTHONPATH")  # the node's own (its environment file's) first, as the user gave it
    env[b"PYTHONPATH"] = os.fsencode(os.pathsep.join(paths)) + (b":" + before if before else b"")
    env[b"DDPCTL_JOIN_DIR"] = os.fsencode(os.path.join(workspace, "logs", "joined"))
    try:
        os.chdir(os.path.expanduser("~"))
        os.chdir(cwd)
    except OSError as e:
        print(f"ddpctl-node: cannot enter {cwd}: {e.strerror}", file=sys.stderr, flush=True)
        code = 2
    else:
        code = _run(command, env)
    _write(os.path.join(workspace, "exit_code"), str(128 - code if code < 0 else code))
    return 0


def _run(command: "list[str]", env: "dict[bytes, bytes]") -> int:
    """The command's exit status as a shell gives it (127: not found, 126: not runnable)."""
    import subprocess  # LAZY: see LAZY_IMPORTS

    try:
        return subprocess.call(command, env=env)
    except FileNotFoundError:
        print(f"ddpctl-node: {command[0]}: not found", file=sys.stderr, flush=True)
        return 127
    except OSError as e:
        print(f"ddpctl-node: {command[0]}: {e.strerror}", file=sys.stderr, flush=True)
        return 126


def _write(path: str, text: str) -> None:
    """Write a one-line record whole (a reader never sees half of it)."""
    with open(path + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".tmp", path)


def main(argv: "list[str]") -> int:
    """`WORKSPACE CWD ENV_FILE GRACE FILES COMMAND...` starts a node (FILES: "stdin" or ""); `NODE_MARKER
    WORKSPACE CWD ENV_FILE COMMAND...` is the supervisor it starts."""
    if argv[:1] == [NODE_MARKER]:
        return supervise(argv[1], argv[2], argv[3], argv[4:])
    return start(argv[0], argv[1], argv[2], argv[3], argv[4], argv[5:])
