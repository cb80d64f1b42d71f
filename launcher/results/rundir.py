"""The local run directory: runs/<run-id>/ with run.json, events.jsonl, logs/, timing.jsonl, snapshots/,
summary.json (and nodes/<k>/ for runs pulled from hosts). Written so a crash never leaves half a file."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import launcher
from launcher.errors import RunDirError, SpecError
from launcher.results.record import RECORD_VERSION, RecordError, RunRecord, load_run_record
from launcher.spec.run_spec import RunSpec

RUN_FILE = "run.json"
EVENTS_FILE = "events.jsonl"


def write_bytes_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temporary file in the same directory (created with `mode`), fsync it, rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp: 0600 from the start; the name cut so that the temporary one stays within 255 bytes
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """JSON (indented, sorted keys) written with write_bytes_atomic."""
    write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`; None when the file is missing, unreadable, or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply to be one of our records
        return None
    return data if isinstance(data, dict) else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (a writer killed mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError):
            continue
    return records


def code_hash() -> str:
    """sha256 over the launcher's and trainer's source files, so every run records what produced it."""
    root = Path(launcher.__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in ("launcher", "trainer"):
        for file in sorted((root / package).rglob("*.py")):
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class RunDir:
    """A run directory on this machine. create/open make `path` absolute, so the paths run.json records from it
    (such as a rented run's known_hosts) serve `status`/`pull`/`down` from any working directory."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, runs_dir: Path, spec: RunSpec, extra: dict[str, Any] | None = None) -> RunDir:
        """Make runs_dir/<run_id> with run.json complete, or nothing at all."""
        runs_dir = runs_dir.resolve()
        try:
            runs_dir.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{spec.run_id}.", dir=runs_dir))
        except OSError as e:
            raise RunDirError(
                f"cannot write the run directory {runs_dir}: {e.strerror}; pick another with --runs-dir"
            ) from e
        final = runs_dir / spec.run_id
        try:
            if final.exists():
                raise RunDirError(f"run directory {final} already exists: choose another --name")
            record = {
                "record_version": RECORD_VERSION,
                "run_id": spec.run_id,
                "spec": spec.to_json(),
                "code_hash": code_hash(),
                "versions": {"ddpctl": launcher.__version__, "python": platform.python_version()},
                "created": time.time(),
                "launcher_host": platform.node(),
            }
            record.update(extra or {})
            write_json_atomic(staging / RUN_FILE, record)
            (staging / "logs").mkdir()
            os.chmod(staging, 0o755)
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        for listener in list(_event_listeners):  # a log names its run first (told, not recorded: run.json says it)
            listener({"time": time.time(), "event": "run_created", "run": spec.run_id, "path": str(final)})
        return cls(final)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        if not (path / RUN_FILE).is_file():
            raise RunDirError(f"{path} is not a ddpctl run directory (no {RUN_FILE})")
        return cls(path.resolve())

    def typed_record(self) -> RunRecord:
        """run.json as a RunRecord; one-line RecordError naming the file when it is corrupt or foreign."""
        return load_run_record(self.path / RUN_FILE)

    def record(self) -> dict[str, Any]:
        """run.json as checked JSON (see typed_record), with recorded paths made usable from here."""
        data = self.typed_record().to_json()
        ssh = data.get("ssh")
        if isinstance(ssh, dict) and ssh.get("known_hosts_file"):
            ssh["known_hosts_file"] = str(self.recorded_path(ssh["known_hosts_file"]))
        return data

    def recorded_path(self, recorded: str) -> Path:
        """A path from run.json. Older versions wrote the run's own known_hosts relative to the working directory
        of `up` (runs/<id>/known_hosts): a relative path is taken inside this run directory, wherever it is now."""
        path = Path(recorded)
        if path.is_absolute():
            return path
        parts = path.parts
        if self.run_id in parts:  # keep what follows the (last) run id
            parts = parts[len(parts) - parts[::-1].index(self.run_id):]
        return self.path.joinpath(*parts)

    def spec(self) -> RunSpec:
        """The run's spec; a spec this ddpctl cannot read is one line naming run.json."""
        try:
            return RunSpec.from_json(self.record()["spec"])
        except (TypeError, ValueError, KeyError, SpecError) as e:
            raise RecordError(f"{self.path / RUN_FILE}: spec is not a valid run spec ({e})") from None

    def update_record(self, **fields: Any) -> None:
        """Add `fields` to run.json; a run directory that can no longer be written is told once (unwritable)."""
        data = self.record()
        data.update(fields)
        try:
            write_json_atomic(self.path / RUN_FILE, data)
        except OSError as e:
            self.unwritable(RUN_FILE, e)

    def event(self, kind: str, **fields: Any) -> None:
        """Append one launcher event with its time to events.jsonl (and tell the listeners)."""
        if kind in ("started", "exited") and "launcher" not in fields:  # what started: torchrun, mpirun, the script
            fields["launcher"] = self._launcher()
        record = {"time": time.time(), "event": kind, **fields}
        line = json.dumps(record, sort_keys=True)
        try:
            with open(self.path / EVENTS_FILE, "a") as f:
                f.write(line + "\n")
        except OSError as e:
            self.unwritable(EVENTS_FILE, e)
        for listener in list(_event_listeners):
            listener(record)

    def unwritable(self, name: str, error: OSError) -> None:
        """A record that cannot be written (the folder made read-only, its disk gone) is a fault like others: the
        run goes on (its nodes are followed, stopped and pulled as ever) and this is said once, with what to do."""
        if error.errno == errno.ENOSPC:  # a full disk has its own one line (launcher/execute/this_machine/disk.py)
            raise error
        if self.path in _unwritable_told:
            return
        _unwritable_told.add(self.path)
        print(f"warning: {self.path / name} cannot be written ({error.strerror or error}): the run goes on, but "
              f"from now on what happens is not recorded in {self.path}; make it writable again", file=sys.stderr,
              flush=True)

    def _launcher(self) -> str:
        """The run's --launcher (torchrun for ddpctl's trainer), as run.json records it."""
        spec = (read_json(self.path / RUN_FILE) or {}).get("spec")
        launcher = spec.get("launcher") if isinstance(spec, dict) else None
        return launcher if isinstance(launcher, str) else "torchrun"

    def events(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / EVENTS_FILE)


# Run directories already told to be unwritable (RunDir.unwritable says it once per run directory).
_unwritable_told: set[Path] = set()

# Told every event as it is recorded: the plain progress lines (launcher.execute.following.plain_progress) list them.
_event_listeners: list[Callable[[dict[str, Any]], None]] = []


def add_event_listener(listener: Callable[[dict[str, Any]], None]) -> None:
    _event_listeners.append(listener)


def remove_event_listener(listener: Callable[[dict[str, Any]], None]) -> None:
    if listener in _event_listeners:
        _event_listeners.remove(listener)


def find_run(runs_dir: Path, run: str | None) -> RunDir:
    """A run by id or path, or the newest run under runs_dir when `run` is None."""
    if run:
        candidate = Path(run)
        if not candidate.is_dir():
            candidate = runs_dir / run
        return RunDir.open(candidate)
    runs = sorted((p for p in runs_dir.glob("*/" + RUN_FILE)), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise RunDirError(f"no runs under {runs_dir}: start one with `ddpctl up`")
    return RunDir.open(runs[-1].parent)


def primary_node_out(run_path: Path, nodes: int) -> Path | None:
    """The out/ folder of the node that held global rank 0 last. c10d rendezvous assigns ranks itself (it
    ignores --node-rank), so that can be any node, and another one after a restart: take the newest summary,
    else the longest timing record."""
    outs = [run_path / "nodes" / str(k) / "out" for k in range(nodes)]
    with_summary = [o for o in outs if (o / "summary.json").is_file()]
    if with_summary:
        return max(with_summary, key=lambda o: (o / "summary.json").stat().st_mtime)
    with_timing = [o for o in outs if (o / "timing.jsonl").is_file()]
    if with_timing:
        return max(with_timing, key=lambda o: len((o / "timing.jsonl").read_bytes().splitlines()))
    return None
