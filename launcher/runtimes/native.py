"""Per-node operations on a host, each one quoted argv over SSH: start torchrun detached, read its state,
stop it. The workspace layout is docs/contracts.md's "Remote workspace".

A node's environment (NodePlan.env: the user's --env API keys and tokens among it) never goes on a command line,
where every user of the host could read it in the process table: the start step writes it over SFTP into a 0600
file in the (0700) workspace, and the node reads it from there and deletes it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.planning.plan import NodePlan, native_node_plan
from launcher.runtimes import proctree
from launcher.runtimes.base import NODE_STOP_GRACE_SECONDS

if TYPE_CHECKING:
    from launcher.planning.plan import NodeHost
    from launcher.spec.run_spec import RunSpec
    from launcher.transport.connection import HostConnection


@dataclass(frozen=True)
class NativeRuntime:
    """torchrun started by the host's own python (see launcher.planning.plan.NodeRuntime): host versions must agree."""

    name: str = "native"
    runs_host_torch: bool = True
    image: str | None = None
    detach_reads_env_file: bool = True  # the detach script exports the file's variables itself

    @property
    def stop_grace_seconds(self) -> int:
        """How long a stop waits between SIGTERM and SIGKILL of the node's process tree."""
        return NATIVE_STOP_GRACE_SECONDS

    def env_file(self, node: NodePlan) -> tuple[str, bytes]:
        """ENV_FILE and its bytes (encode_env)."""
        return ENV_FILE, encode_env(node.env)

    def plan_node(self, spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
        """Node `index` as torchrun on `host` (launcher.planning.plan.native_node_plan)."""
        return native_node_plan(spec, index, host, rdzv_addr, workspace)


# A native node's environment file in its workspace: one NAME=VALUE line per variable, the value with each
# backslash doubled and each newline written as \n (see encode_env), which `printf %b` undoes. Nothing in it
# is ever run as shell text.
ENV_FILE = "env"
# How long a native node's process tree gets between SIGTERM and SIGKILL when it is stopped.
NATIVE_STOP_GRACE_SECONDS = 20

# Starts the node's command in a session of its own (so it outlives the SSH connection), output to a file,
# stdin from /dev/null, and records its pid, its stop grace and, when it ends, its exit status. Arguments:
# workspace, cwd (both relative to home or absolute), the environment file's name in the workspace (exported,
# then deleted; empty: none), the seconds a stop waits before killing, then the command.
# A fixed script: every value reaches it as a quoted argument, never as shell text.
DETACH_SCRIPT = r"""
ws=$1; cwd=$2; envfile=$3; grace=$4; shift 4
cd "$ws" || { echo "no workspace $ws" >&2; exit 3; }
ws=$(pwd)
if [ -n "$envfile" ] && [ ! -f "$envfile" ]; then echo "no environment file $ws/$envfile" >&2; exit 3; fi
mkdir -p out logs
rm -f exit_code pid
echo "$grace" > stop_grace
setsid sh -c '
  ws=$1; cwd=$2; envfile=$3; shift 3
  export DDPCTL_OUTPUT_DIR="$ws/out"
  if [ -n "$envfile" ]; then
    while IFS= read -r line; do
      value=$(printf "%bx" "${line#*=}"); export "${line%%=*}=${value%x}"
    done < "$ws/$envfile"
    rm -f "$ws/$envfile"
  fi
  export PYTHONPATH="$ws/hook:$ws/code${PYTHONPATH:+:$PYTHONPATH}" DDPCTL_JOIN_DIR="$ws/logs/joined"
  cd "$HOME" && cd "$cwd" && "$@"
  echo $? > "$ws/exit_code.tmp" && mv "$ws/exit_code.tmp" "$ws/exit_code"
' ddpctl-node "$ws" "$cwd" "$envfile" "$@" > torchrun.out 2>&1 < /dev/null &
echo $! > pid
sed 's/.*) //' "/proc/$!/stat" 2>/dev/null | cut -d' ' -f20 > pid_start
echo $!
"""

# Prints `pid|exit_code|alive|free KiB` (free: the workspace's file system, for launcher/execute/hang_watch.py),
# then `@attempt|N|FROM|TO|M` (N: the newest attempt_<N> folder under logs/, which counts torchrun's restarts;
# FROM-TO: the byte range of local rank $2's stdout.log in attempt M sent at the end, when $2 is given), then
# `@ended|K|NOTE` for attempts N and N-1 whose workers failed (NOTE: the one-line JSON launcher/spec/attempt_logs.py
# wrote, which failure ended that attempt), then the node's progress record, if any (only global rank 0's node has
# one), then `@output` and those bytes. Arguments: the workspace, then optionally the local rank to tail, the
# attempt its offset $4 belongs to (another attempt starts at 0), the most bytes to send ($5; older new bytes are
# skipped), the stream ($6: stdout or stderr).
# Whether the node's process lives is asked before exit_code is read: it writes exit_code and then ends, so
# read the other way round, a node ending between the two reads showed no exit code and no process ("lost",
# which `up` took for a failure: issue 12's loaded host declared lost).
STATE_SCRIPT = r"""
cd "$1" 2>/dev/null || { echo "||gone"; exit 0; }
pid=$(cat pid 2>/dev/null); alive=0
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then alive=1; fi
# A pid the system gave to another process since (the start time the node recorded differs) is not the node's.
if [ "$alive" = 1 ] && [ -s pid_start ] && [ -r "/proc/$pid/stat" ] \
   && [ "$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" != "$(cat pid_start)" ]; then alive=0; fi
ec=$(cat exit_code 2>/dev/null)
free=$(df -Pk . 2>/dev/null | awk 'NR==2 {print $4}')
echo "$pid|$ec|$alive|$free"
n=""; nd=""
for d in logs/*/attempt_*; do
  [ -d "$d" ] || continue
  k=${d##*attempt_}
  case $k in ''|*[!0-9]*) continue;; esac
  if [ -z "$n" ] || [ "$k" -gt "$n" ]; then n=$k; nd=$d; fi
done
from=""; to=""; log=""
stream=${6:-stdout}; rn=$n; rd=$nd
if [ -n "$3" ] && [ "$3" != "$n" ]; then
  # The attempt read last has ended: send the rest of its file first, the new attempt's on the next poll.
  for d in logs/*/attempt_"$3"; do
    if [ -f "$d/$2/$stream.log" ] && [ "$(wc -c < "$d/$2/$stream.log")" -gt "${4:-0}" ]; then rn=$3; rd=$d; fi
  done
fi
if [ -n "$2" ] && [ -n "$rd" ] && [ -f "$rd/$2/$stream.log" ]; then
  log="$rd/$2/$stream.log"
  from=${4:-0}; [ "$3" = "$rn" ] || from=0
  to=$(wc -c < "$log"); to=$((to))
  if [ $((to - from)) -gt "${5:-65536}" ]; then from=$((to - ${5:-65536})); fi
  if [ "$from" -gt "$to" ]; then from=0; fi
fi
echo "@attempt|$n|$from|$to|$rn"
if [ -n "$n" ]; then
  for k in "$n" $((n - 1)); do
    f="${nd%attempt_*}attempt_$k/ended.json"
    if [ "$k" -ge 0 ] && [ -f "$f" ]; then printf '@ended|%s|' "$k"; tr -d '\n' < "$f"; echo; fi
  done
fi
cat out/progress.json 2>/dev/null
echo
echo "@output"
if [ -n "$log" ]; then tail -c +$((from + 1)) "$log" | head -c $((to - from)); fi
"""

# Stop the node's torchrun and all its workers (launcher/runtimes/proctree.py, whose source this is, plus the
# workspace's pid file), and record exit status 143 unless the node recorded its own. Arguments: the workspace,
# the grace in seconds (empty: the one the node recorded at its start), the grace when it recorded none.
# Nothing is signalled once the node recorded its exit status, nor when the pid now names another process (its
# start time is not the one recorded, or it is not a `ddpctl-node` command). A process group outlives its leader
# and its id is never handed out while it has members: when the leader is gone, what is left of it is ours.
STOP_SCRIPT = Path(proctree.__file__).read_text() + r"""
import sys
workspace, grace, fallback = sys.argv[1:4]
try:
    os.chdir(os.path.expanduser("~"))
    os.chdir(workspace)
    pid = int(open("pid").read())
except (OSError, ValueError):
    sys.exit(0)
try:
    recorded_start = open("pid_start").read().strip()
except OSError:
    recorded_start = ""
if os.path.exists("exit_code"):
    sys.exit(0)
if start_time(pid) is not None and not is_node_process(pid, recorded_start, b"ddpctl-node"):
    sys.exit(0)  # another process has that pid now (ours ended); its group, if any is left, cannot be another's
if not grace:
    try:
        grace = open("stop_grace").read().strip()
    except OSError:
        grace = fallback
stop_tree(pid, float(grace))
if not os.path.exists("exit_code"):
    with open("exit_code", "w") as f:
        f.write("143\n")
"""


def encode_env(env: Sequence[tuple[str, str]]) -> bytes:
    """ENV_FILE's contents: values may hold anything a command line can (quotes, `$`, newlines, other bytes)."""
    lines = (f"{key}=" + value.replace("\\", "\\\\").replace("\n", "\\n") + "\n" for key, value in env)
    return "".join(lines).encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class OutputRequest:
    """What read_state also fetches of one worker's stdout.log (or `stream`.log): the bytes after `offset` of
    attempt `attempt`, at most the newest `max_bytes`."""

    local_rank: int
    attempt: int | None = None
    offset: int = 0
    max_bytes: int = 65536
    stream: str = "stdout"


@dataclass(frozen=True)
class NodeState:
    pid: int | None
    exit_code: int | None
    alive: bool
    progress: dict[str, Any] | None
    disk_free: int | None = None  # bytes free where the workspace is (None: not known)
    attempt: int | None = None  # the newest attempt_<N> under logs/: torchrun's restarts so far
    output: str = ""  # the requested worker's new output (OutputRequest), bytes output_from..output_to
    output_from: int | None = None
    output_to: int | None = None
    output_attempt: int | None = None  # the attempt those bytes belong to (the one before `attempt` until read)
    ended: dict[int, Any] = field(default_factory=dict)  # attempt -> how its workers failed (attempts N, N-1)
    workspace_gone: bool = False  # the host has no such workspace (deleted since the start)

    @property
    def finished(self) -> bool:
        return self.exit_code is not None or (self.pid is not None and not self.alive)

    @property
    def label(self) -> str:
        # exit_code first: an exited process can linger as a zombie where nothing reaps orphans.
        if self.exit_code is not None:
            return "finished" if self.exit_code == 0 else f"failed (exit {self.exit_code})"
        if self.alive:
            return "running"
        if self.workspace_gone:
            return "workspace gone"
        return "not started" if self.pid is None else "lost"


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def read_state(conn: HostConnection, workspace: str, output: OutputRequest | None = None) -> NodeState:
    """The node's process state, progress record and restarts, and (with `output`) a worker's new output: one
    command on the host."""
    tail = [] if output is None else [str(output.local_rank), "" if output.attempt is None else str(output.attempt),
                                      str(output.offset), str(output.max_bytes),
                                      "stderr" if output.stream == "stderr" else "stdout"]
    result = conn.run(["sh", "-c", STATE_SCRIPT, "ddpctl-state", workspace, *tail], timeout=30)
    head, _, chunk = result.stdout.partition("\n@output\n")
    lines = head.splitlines()
    fields = lines[0].split("|") if lines else []
    pid_s, ec_s, alive_s = (fields + ["", "", ""])[:3]
    attempt_s, from_s, to_s, read_s = "", "", "", ""
    if len(lines) > 1 and lines[1].startswith("@attempt|"):
        attempt_s, from_s, to_s, read_s = (lines[1].split("|") + ["", "", "", ""])[1:5]
        lines = lines[1:]
    ended: dict[int, Any] = {}
    while len(lines) > 1 and lines[1].startswith("@ended|"):
        _, number, note = lines[1].split("|", 2)
        with contextlib.suppress(ValueError):
            ended[int(number)] = json.loads(note)
        lines = lines[:1] + lines[2:]
    progress = None
    if len(lines) > 1 and "\n".join(lines[1:]).strip():
        try:
            progress = json.loads("\n".join(lines[1:]))
        except (ValueError, RecursionError):
            progress = None
    return NodeState(
        pid=int(pid_s) if pid_s.isdigit() else None,
        exit_code=int(ec_s) if ec_s.strip().lstrip("-").isdigit() else None,
        alive=alive_s == "1",
        workspace_gone=alive_s == "gone",
        progress=progress,
        disk_free=int(fields[3]) * 1024 if len(fields) > 3 and fields[3].strip().isdigit() else None,
        attempt=_int(attempt_s),
        output=chunk if _int(to_s) is not None else "",
        output_from=_int(from_s),
        output_to=_int(to_s),
        output_attempt=_int(read_s),
        ended=ended,
    )


def stop_node(conn: HostConnection, workspace: str, python: str = "python3", grace_seconds: float | None = None,
              fallback_grace_seconds: float = NATIVE_STOP_GRACE_SECONDS) -> None:
    """TERM the node's torchrun tree, KILL what is left after `grace_seconds`, by default the grace the node
    recorded at its start (longer for a docker node: its wrapper must finish `docker stop` and `docker rm`), else
    `fallback_grace_seconds` (its runtime's); `python` is the host's."""
    grace = "" if grace_seconds is None else str(grace_seconds)
    conn.run([python, "-c", STOP_SCRIPT, workspace, grace, str(fallback_grace_seconds)],
             timeout=max(grace_seconds or 0, NODE_STOP_GRACE_SECONDS) + 30)
