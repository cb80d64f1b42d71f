"""What each node's autostop watchdog (autostop.py) is doing, read on the node: the state its `.autostop/state.json`
records (watching | stopped | failed, with the error) and whether the process that wrote it still runs. A machine
whose watchdog failed or is not running is never stopped: `status` says so in one line per node, and `pull`
starts such a watchdog again."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from launcher.places.vast.ledger import say
from launcher.remote import shell_text

# $1: the node's workspace (launcher/remote/autostop_state.sh). Prints state.json (nothing when there is none), then
# on its own line whether the process it names runs the watchdog of this workspace ("alive") or not ("dead").
STATE_SCRIPT = shell_text("autostop_state.sh")


def watchdog_command(workspace: str) -> list[str]:
    """The command that prints a node's watchdog state and whether it runs (see parse_watchdog)."""
    return ["sh", "-c", STATE_SCRIPT, "ddpctl-autostop", workspace]


@dataclass(frozen=True)
class WatchdogState:
    """A node's watchdog: `state` as its file says (None: no file), its `error`, and whether its process runs."""

    state: str | None
    error: str | None
    alive: bool

    @property
    def problem(self) -> str | None:
        """Why this watchdog will not stop its machine (None: it watches)."""
        if self.state == "failed":
            return f"failed ({self.error or 'no reason recorded'})"
        if self.state == "watching" and self.alive:
            return None
        if self.state == "stopped":
            return "not running (it stopped the machine, which runs again without it)"
        if self.state == "watching":
            return "not running (its process ended)"
        return "not running (it never started)"

    @property
    def label(self) -> str:
        """What `status` shows in its autostop column."""
        return self.problem or "watching"


def parse_watchdog(text: str) -> WatchdogState:
    """The watchdog_command's output as a WatchdogState."""
    lines = text.strip().splitlines()
    alive = bool(lines) and lines[-1].strip() == "alive"
    try:
        record: Any = json.loads("\n".join(lines[:-1])) if len(lines) > 1 else {}
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}
    state, error = record.get("state"), record.get("error")
    return WatchdogState(state if isinstance(state, str) else None, str(error) if error else None, alive)


def add_watchdog_states(rows: list[dict[str, Any]], outputs: dict[int, str], run_id: str,
                        keys: list[dict[str, Any]] | None = None) -> None:
    """Put each node's watchdog state in its status row (`autostop`) and the key it stops its machine with
    (`autostop_key`: "container" or "scoped", from run.json's autostop.keys), and warn in one line for each that
    will not stop its machine. `outputs`: node -> watchdog_command's output (absent: the node could not be asked)."""
    key_of = {k.get("node"): k.get("key") for k in keys or [] if isinstance(k, dict)}
    for row in rows:
        node = row.get("node")
        if key_of.get(node):
            row["autostop_key"] = key_of[node]
        if not isinstance(node, int) or node not in outputs:
            row["autostop"] = "unknown (node not reached)"
            continue
        watchdog = parse_watchdog(outputs[node])
        row["autostop"] = watchdog.label
        if watchdog.problem:
            say(f"node {node}: autostop {watchdog.problem}: the machine bills in full until `ddpctl down {run_id}`",
                style="bold yellow")
