"""Vast.ai's rate limits count per API key, not per process: twelve `ddpctl offers` in a row, or two `up`s at once,
must keep to them together. Their pacers share one small JSON file per key and API address under
~/.ddpctl/vast-pacing/ (named by a hash: the key never touches the disk here), read and written under an exclusive
fcntl lock, so a request's turn is taken in the file before the lock is let go."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from launcher.places.vast.pacing import PacingState

# Stamps older than this are dropped when the file is written: no interval or window of Vast's is longer.
KEEP_S = 3600.0


def pacing_file(api_key: str, base_url: str) -> Path:
    """The file the pacers of every process using this key at this API address share."""
    digest = hashlib.sha256(f"{base_url}\0{api_key}".encode()).hexdigest()[:20]
    return Path.home() / ".ddpctl" / "vast-pacing" / f"{digest}.json"


class PacingFile:
    """A pacer's state in a file shared by processes (see the module docstring); an unreadable file counts as
    empty (the worst it costs is one request sent early, which the client's 429 handling absorbs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._alone: PacingState | None = None  # this process's own state, once the file cannot be used

    @contextlib.contextmanager
    def state(self) -> Iterator[PacingState]:
        if self._alone is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:  # a read-only or full home: pace this process alone rather than fail every request
                self._alone = PacingState()
        if self._alone is not None:
            yield self._alone
            return
        with os.fdopen(fd, "r+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
            state = _parse(handle.read())
            yield state
            newest = max([*state.last.values(), *(t for ts in state.sent.values() for t in ts)], default=0.0)
            kept = PacingState({k: t for k, t in state.last.items() if t > newest - KEEP_S},
                               {k: [t for t in ts if t > newest - KEEP_S] for k, ts in state.sent.items()})
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps({"last": kept.last, "sent": kept.sent}))
            handle.flush()


def _parse(text: str) -> PacingState:
    try:
        data = json.loads(text) if text.strip() else {}
        last = {str(k): float(v) for k, v in dict(data.get("last") or {}).items()}
        sent = {str(k): [float(t) for t in v] for k, v in dict(data.get("sent") or {}).items()}
    except (ValueError, TypeError, AttributeError):
        return PacingState()
    return PacingState(last, sent)
