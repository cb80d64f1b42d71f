"""What the last pull of a run brought back, kept in the run directory (PULL_RECORD), and the one line that names
what it could not; and the lock that lets one pull of a run at a time write into its run directory.

pull.json: `time` (unix), `complete` (every file listed on every node came back verified), `nodes`: per node
`node`, `host`, `verified` (files checked against the host's sha256), `not_pulled` ([{path, reason}], paths as
in nodes/<k>/), `escaped` ([{path, host_name}]: a name that is not UTF-8 on the host, stored under `path`), and
`error` (the node's whole pull failed: why; null otherwise)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from launcher.results.progress import console
from launcher.results.rundir import read_json, write_json_atomic

PULL_RECORD = "pull.json"
PULL_LOCK = ".pull.lock"
NAMED = 4  # files named in the line; the rest are counted (pull.json lists them all)


@contextmanager
def pull_lock(run_path: Path, run_id: str) -> Iterator[None]:
    """Hold the run directory's pull lock (flock): a second pull of the same run waits for the first."""
    fd = os.open(run_path / PULL_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"another pull of run {run_id} is under way; waiting for it to finish", markup=False,
                          highlight=False, soft_wrap=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_pull_record(run_path: Path, labels: list[str], stats: list[dict[str, Any] | None],
                      errors: list[str | None]) -> dict[str, Any]:
    """Record one pull (one entry per node: its stats as pull_run made them, or the error that ended it)."""
    nodes = []
    for index, (label, node_stats, error) in enumerate(zip(labels, stats, errors, strict=True)):
        node_stats = node_stats or {}
        nodes.append({
            "node": index, "host": label, "verified": int(node_stats.get("verified", 0)),
            "not_pulled": [{"path": path, "reason": reason} for path, reason in node_stats.get("not_pulled", [])],
            "escaped": [{"path": path, "host_name": name} for path, name in node_stats.get("escaped", [])],
            "error": error,
        })  # fmt: skip
    record = {"time": time.time(), "complete": all(not n["not_pulled"] and not n["error"] for n in nodes),
              "nodes": nodes}
    write_json_atomic(run_path / PULL_RECORD, record)
    return record


# What `down` does (after_down: did) with the files a pull could not bring back: (run id, run.json, after_down) ->
# the words; the run's place says (launcher/places/base.py: not_pulled_after_down).
DownWords = Callable[[str, dict[str, Any], bool], str]


def incomplete_pull_line(run_path: Path, record: dict[str, Any], after_down: bool = False,
                         down_words: DownWords | None = None) -> str | None:
    """One line naming what the last pull could not bring back and what `down` will do about it (`after_down`:
    what it did); None when it brought back everything (or no pull was recorded)."""
    statement = incomplete_pull(run_path, record, after_down, down_words)
    return None if statement is None else str(statement["line"])


def incomplete_pull(run_path: Path, record: dict[str, Any], after_down: bool = False,
                    down_words: DownWords | None = None) -> dict[str, Any] | None:
    """What the last pull could not bring back, for `--json` output: `not_pulled` ([{node, host, path, reason}]),
    `failed_nodes` ([{node, host, error}]: nothing came back), `down` (what `down` will do about it, or did),
    `record` (pull.json) and `line` (the same in one line); None when it brought back everything."""
    pulled = read_json(run_path / PULL_RECORD)
    if not isinstance(pulled, dict) or pulled.get("complete", True):
        return None
    nodes = [n for n in pulled.get("nodes", []) if isinstance(n, dict)]
    missing = [{"node": n["node"], "host": n["host"], "path": item["path"], "reason": item["reason"]}
               for n in nodes for item in n.get("not_pulled", [])]
    failed = [{"node": n["node"], "host": n["host"], "error": n["error"]} for n in nodes if n.get("error")]
    parts = [f"node {f['node']} ({f['host']}): nothing came back ({' '.join(str(f['error']).split())[:200]})"
             for f in failed]
    parts += [f"node {m['node']} {m['path']!r}: {m['reason']}" for m in missing[:NAMED]]
    if len(missing) > NAMED:
        parts.append(f"and {len(missing) - NAMED} more")
    count = f"{len(missing)} file{'' if len(missing) == 1 else 's'}"
    down = (down_words or _down_on_hosts)(run_path.name, record, after_down)
    what = f"{count} not pulled" if missing else "a node's pull failed"
    line = f"pull incomplete, {what}: {'; '.join(parts)} (all listed in {run_path / PULL_RECORD})" + (
        f"; {down}" if down else "")
    return {"complete": False, "not_pulled": missing, "failed_nodes": failed, "down": down or None,
            "record": str(run_path / PULL_RECORD), "line": line}


def pull_json(run_path: Path, record: dict[str, Any], down_words: DownWords | None = None) -> dict[str, Any] | None:
    """The last pull for `up --json`: incomplete_pull's statement, `{"complete": true, "record": ...}`, or None
    when no pull was recorded (a local run)."""
    statement = incomplete_pull(run_path, record, down_words=down_words)
    if statement is None and (run_path / PULL_RECORD).is_file():
        return {"complete": True, "record": str(run_path / PULL_RECORD)}
    return statement


def _down_on_hosts(run_id: str, record: dict[str, Any], after_down: bool) -> str:
    return down_on_hosts(run_id, after_down)


def down_on_hosts(run_id: str, after_down: bool) -> str:
    """What `down` does (`after_down`: did) about files a pull could not bring back from hosts it leaves running."""
    if after_down:
        return f"what was not pulled stays on the hosts, in ~/.ddpctl/runs/{run_id}/"
    return (f"`ddpctl down {run_id}` pulls again and leaves what it cannot pull on the hosts, in "
            f"~/.ddpctl/runs/{run_id}/")


def files_not_pulled(run_path: Path) -> int:
    """How many files the last recorded pull could not bring back (0: none, or no pull recorded)."""
    pulled = read_json(run_path / PULL_RECORD) or {}
    return sum(len(n.get("not_pulled", [])) for n in pulled.get("nodes", []) if isinstance(n, dict))
