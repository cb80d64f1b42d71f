"""Per-node operations on a host, each one quoted argv over SSH: start torchrun detached, read its state,
stop it. The workspace layout is docs/contracts.md's "Remote workspace"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher import proctree
from launcher.errors import HostError
from launcher.plan import NodePlan

if TYPE_CHECKING:
    from launcher.preflight import Runner

# Starts the node's command in a session of its own (so it outlives the SSH connection), output to a file,
# stdin from /dev/null, and records its pid and, when it ends, its exit status. Arguments: workspace, cwd
# (both relative to home or absolute), the number N of NAME=VALUE arguments, those N, then the command.
# A fixed script: every value reaches it as a quoted argument, never as shell text.
DETACH_SCRIPT = r"""
ws=$1; cwd=$2; shift 2
cd "$ws" || { echo "no workspace $ws" >&2; exit 3; }
ws=$(pwd)
mkdir -p out logs
rm -f exit_code pid
setsid sh -c '
  ws=$1; cwd=$2; n=$3; shift 3
  i=0; while [ "$i" -lt "$n" ]; do export "$1"; shift; i=$((i+1)); done
  export PYTHONPATH="$ws/code${PYTHONPATH:+:$PYTHONPATH}"
  cd "$HOME" && cd "$cwd" && "$@"
  echo $? > "$ws/exit_code.tmp" && mv "$ws/exit_code.tmp" "$ws/exit_code"
' ddpctl-node "$ws" "$cwd" "$@" > torchrun.out 2>&1 < /dev/null &
echo $! > pid
echo $!
"""

# Prints `pid|exit_code|alive` then the node's progress record, if any (only global rank 0's node has one).
STATE_SCRIPT = r"""
cd "$1" 2>/dev/null || { echo "||gone"; exit 0; }
pid=$(cat pid 2>/dev/null); ec=$(cat exit_code 2>/dev/null); alive=0
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then alive=1; fi
echo "$pid|$ec|$alive"
cat out/progress.json 2>/dev/null
"""

# Stop the node's torchrun and all its workers (launcher/proctree.py, whose source this is, plus the workspace's
# pid file), and record exit status 143 unless the node recorded its own.
STOP_SCRIPT = Path(proctree.__file__).read_text() + r"""
import sys
workspace, grace = sys.argv[1], float(sys.argv[2])
try:
    os.chdir(os.path.expanduser("~"))
    os.chdir(workspace)
    pid = int(open("pid").read())
except (OSError, ValueError):
    sys.exit(0)
stop_tree(pid, grace)
if not os.path.exists("exit_code"):
    with open("exit_code", "w") as f:
        f.write("143\n")
"""


def start_argv(node: NodePlan) -> list[str]:
    """The quoted-argv command that starts a node detached (env passed as NAME=VALUE arguments)."""
    return ["sh", "-c", DETACH_SCRIPT, "ddpctl-start", node.workspace, node.cwd, str(len(node.env)),
            *(f"{k}={v}" for k, v in node.env), *node.command]


@dataclass(frozen=True)
class NodeState:
    pid: int | None
    exit_code: int | None
    alive: bool
    progress: dict[str, Any] | None

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
        return "not started" if self.pid is None else "lost"


def start_node(conn: Runner, node: NodePlan, label: str) -> int:
    """Start one node's command detached; return its pid."""
    result = conn.run(start_argv(node), timeout=30)
    if result.exit_code != 0 or not result.stdout.strip().isdigit():
        raise HostError(label, f"could not start torchrun: {(result.stderr or result.stdout).strip()[:300]}")
    return int(result.stdout.strip())


def read_state(conn: Runner, workspace: str) -> NodeState:
    result = conn.run(["sh", "-c", STATE_SCRIPT, "ddpctl-state", workspace], timeout=30)
    lines = result.stdout.splitlines()
    pid_s, ec_s, alive_s = (lines[0].split("|") + ["", "", ""])[:3] if lines else ("", "", "")
    progress = None
    if len(lines) > 1:
        try:
            progress = json.loads("\n".join(lines[1:]))
        except ValueError:
            progress = None
    return NodeState(
        pid=int(pid_s) if pid_s.isdigit() else None,
        exit_code=int(ec_s) if ec_s.strip().lstrip("-").isdigit() else None,
        alive=alive_s == "1",
        progress=progress,
    )


def stop_node(conn: Runner, workspace: str, python: str = "python3", grace_seconds: int = 20) -> None:
    """TERM the node's torchrun tree, KILL what is left after `grace_seconds`; `python` is the host's."""
    conn.run([python, "-c", STOP_SCRIPT, workspace, str(grace_seconds)], timeout=grace_seconds + 30)


def log_tail(conn: Runner, workspace: str, lines: int = 20) -> str:
    """The end of torchrun's output on a node, for failure messages."""
    result = conn.run(["tail", "-n", str(lines), f"{workspace}/torchrun.out"], timeout=30)
    return str(result.stdout)
