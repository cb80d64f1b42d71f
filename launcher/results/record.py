"""run.json as a typed, versioned record: read and checked in one place, so a corrupt, truncated, wrong-type or
foreign file is one line naming the file and what is wrong (never a traceback, never "no run.json").

Fields a version does not know are kept in `extra` (providers and runtimes add their own, e.g. `instances`,
`nodes`, `hosts`), so reading and writing back never loses them. Older files (no `record_version`) read the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.errors import RunDirError

RECORD_VERSION = 2  # 1: every run.json written before the version was recorded

# Typed fields: JSON name -> the Python types its value may have (None allowed where the field is optional).
_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "spec": (dict,),
    "code_hash": (str, type(None)),
    "versions": (dict, type(None)),
    "created": (int, float, type(None)),
    "launcher_host": (str, type(None)),
    "options": (dict, type(None)),
    "from_run": (str, type(None)),
    "image_id": (str, type(None)),
    "node_facts": (list, type(None)),
}


class RecordError(RunDirError):
    """A record file that cannot be read as what it claims to be; the message names the file."""


@dataclass
class RunRecord:
    """What run.json holds: the run, the resolved options that re-run it, and where the run came from."""

    run_id: str
    spec: dict[str, Any]
    code_hash: str | None = None
    versions: dict[str, Any] | None = None
    created: float | None = None
    launcher_host: str | None = None
    options: dict[str, Any] | None = None  # resolved launch options, as config keys (`ddpctl up --from`)
    from_run: str | None = None  # the run this one was started from with --from
    image_id: str | None = None  # the docker image's ID or digest, when the run used one
    node_facts: list[dict[str, Any]] | None = None  # one dict per node: python, torch, CUDA, driver, GPU names
    record_version: int = RECORD_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: str = "run.json") -> RunRecord:
        """A record from parsed JSON; RecordError naming `where` and the first thing wrong."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: not a ddpctl run record (a JSON {type(data).__name__}, not an object)")
        if "run_id" not in data or "spec" not in data:
            missing = " and ".join(k for k in ("run_id", "spec") if k not in data)
            raise RecordError(f"{where}: not a ddpctl run record (no {missing})")
        version = data.get("record_version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise RecordError(f"{where}: record_version {version!r} is not a version number")
        if version > RECORD_VERSION:
            raise RecordError(f"{where}: record_version {version} is newer than this ddpctl reads "
                              f"({RECORD_VERSION}): upgrade ddpctl")
        for key, types in _TYPES.items():
            value = data.get(key)
            if key in data and (not isinstance(value, types) or isinstance(value, bool)):
                want = " or ".join("null" if t is type(None) else _JSON_NAMES.get(t, t.__name__) for t in types)
                raise RecordError(f"{where}: {key} is {_json_type(value)}, expected {want}")
        if isinstance(data.get("node_facts"), list) and not all(isinstance(n, dict) for n in data["node_facts"]):
            raise RecordError(f"{where}: node_facts must be a list of objects, one per node")
        known = {f.name for f in fields(cls)} - {"extra", "record_version"}
        return cls(**{k: data[k] for k in known if k in data}, record_version=version,
                   extra={k: v for k, v in data.items() if k not in known and k != "record_version"})

    def to_json(self) -> dict[str, Any]:
        """The record as JSON (optional fields left out while unset); written back at the current version."""
        data: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is not None:
                data[f.name] = value
        data["record_version"] = RECORD_VERSION
        return data


_JSON_NAMES = {str: "a string", dict: "an object", list: "a list", int: "a number", float: "a number"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _JSON_NAMES.get(type(value), type(value).__name__)


def load_json_file(path: Path) -> Any:
    """Parsed JSON of `path`; RecordError naming the file when it is unreadable, empty, truncated or not JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise RecordError(f"{path}: empty (a write was cut short?)")
    try:
        return json.loads(text)
    except RecursionError:
        raise RecordError(f"{path}: nested too deeply to be a run record") from None
    except json.JSONDecodeError as e:
        truncated = " (truncated?)" if text.rstrip()[-1:] not in ("}", "]") else ""
        raise RecordError(f"{path}: not valid JSON{truncated}: {e.msg} (line {e.lineno}, column {e.colno})") from None


def load_run_record(path: Path) -> RunRecord:
    """The run record in the file `path` (a run.json)."""
    return RunRecord.from_json(load_json_file(path), str(path))
