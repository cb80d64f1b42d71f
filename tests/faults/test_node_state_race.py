"""Issue 12: "under load a plain 2-host run once failed with 'node 1 lost'". A node's state read
(launcher/runtimes/native.py's STATE_SCRIPT) used to read `exit_code` and then ask whether the node's process
lived; a node ending between the two reads (it writes exit_code, then ends) showed neither, "lost", which `up`
took for a failure. Under load the gap between the two reads is long enough to be hit. Here the node ends exactly
in that gap, every time: `cat` is wrapped so that reading exit_code ends the node right after."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from launcher.runtimes.native import read_state

# Runs the real cat; when it was asked for exit_code, the node then ends as the detach script ends it: exit_code
# written, then the process gone (reaped by init).
ENDING_CAT = """#!/bin/sh
/bin/cat "$@"; status=$?
if [ "$1" = exit_code ] && [ ! -f ended ]; then
  touch ended; echo 0 > exit_code; kill "$(/bin/cat pid)"
  n=0; while kill -0 "$(/bin/cat pid)" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done
fi
exit $status
"""


class LocalRunner:
    """Runs argv here, with the ending `cat` first on PATH."""

    def __init__(self, bin_dir: Path) -> None:
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(self, argv: list[str], *, timeout: float | None = None) -> Any:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env)


def test_a_node_ending_between_the_reads_is_never_lost(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cat").write_text(ENDING_CAT)
    (bin_dir / "cat").chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # The node: a process whose parent has already exited, so init reaps it when it ends (as on a host).
    subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $! > pid"], cwd=workspace, check=True)
    pid = int((workspace / "pid").read_text())
    try:
        state = read_state(LocalRunner(bin_dir), str(workspace))
        assert (workspace / "ended").exists()  # the node did end during the read
        assert state.label != "lost" and not (state.finished and state.exit_code is None), state
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = read_state(LocalRunner(bin_dir), str(workspace))
            if state.finished:
                break
            time.sleep(0.05)
        assert (state.exit_code, state.label) == (0, "finished")
    finally:
        subprocess.run(["kill", str(pid)], capture_output=True, check=False)
