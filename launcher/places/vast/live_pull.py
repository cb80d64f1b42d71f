"""While an interruptible run trains, every node's out/ folder is pulled as it changes (snapshots, timing, a
script's own checkpoints) into the run directory's live/<node>/out/, so that a machine lost to the market loses at
most what it wrote since the last pull (one snapshot interval). A thread of its own, with SSH connections of its
own; it writes only under live/, so it never meets the run's final pull (nodes/<node>/)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from launcher.errors import DdpctlError
from launcher.planning.plan import remote_workspace
from launcher.results.rundir import RunDir
from launcher.transport.hostsession import HostSession
from launcher.transport.pull import pull_tree

LIVE_DIR = "live"
# Seconds between two looks at a node's out/ (a listing by `find`: names, sizes and times, no file read); a pull
# follows only a change. The loss of a machine loses at most what it wrote since.
LOOK_EVERY_S = 1.0


class LivePull:
    """Pulls each node's out/ into run_dir/live/<k>/out as it changes, until `stop()`; `training_seen_at` is when
    node 0's pulled progress first showed a position past `resumed_at` ((epoch, step) the run resumed from)."""

    def __init__(self, session: HostSession, run_dir: RunDir, python: str,
                 resumed_at: tuple[int, int] | None = None) -> None:
        self.session, self.run_dir, self.python = session, run_dir, python
        self.workspace = remote_workspace(run_dir.run_id)
        self.resumed_at = resumed_at
        self.training_seen_at: float | None = None
        self._seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start following (again: a no-op while it runs)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="live-pull", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.session.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for node in range(len(self.session.targets)):
                if self._stop.is_set():
                    return
                try:
                    self.look(node)
                except (DdpctlError, OSError):
                    self.session.drop(node)  # a node going away is the loss watch's business
            self._stop.wait(LOOK_EVERY_S)

    def look(self, node: int) -> bool:
        """Pull node's out/ when its listing changed since the last look; whether it pulled."""
        conn = self.session.conn(node)
        listing = conn.run(["find", f"{self.workspace}/out", "-type", "f", "-printf", "%P %s %T@\\n"],
                           timeout=30)
        if listing.exit_code != 0 or listing.stdout == self._seen.get(node):
            return False
        local = self.run_dir.path / LIVE_DIR / str(node)
        stats = pull_tree(conn, self.workspace, local, include=["/out/"], missing_ok=True, python=self.python)
        if not stats.not_pulled:  # a file caught mid-change is fetched at the next look
            self._seen[node] = listing.stdout
        if stats.files_fetched:
            self.run_dir.event("vast.live_pulled", node=node, files=stats.files_fetched,
                               snapshots=sorted(p.name for p in (local / "out" / "snapshots").glob("*.pt")))
        if node == 0 and self.training_seen_at is None:
            self._note_training(local / "out" / "progress.json")
        return True

    def _note_training(self, progress: Path) -> None:
        try:
            record: dict[str, Any] = json.loads(progress.read_text())
            position = (int(record["epoch"]), int(record["step"]))
        except (OSError, ValueError, KeyError, TypeError):
            return
        # past the position resumed from: a step was trained (progress.json is written about once a second, so a
        # short epoch may be seen only as "validating" or "done": still past it)
        if position > (self.resumed_at or (0, 0)):
            self.training_seen_at = time.time()
