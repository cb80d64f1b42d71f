"""Each rank's last collectives, from torch's flight recorder (TORCH_FR_BUFFER_SIZE: a ring of the process group's
recent collectives, kept by gloo and NCCL alike): a rank that registered for stack dumps also dumps its flight
record into <logs>/stacks/fr-rank-R.pkl when `fr-request` there is touched (launcher/runtimes/join_hook.py,
trainer/stack_dumps.py: a thread of the rank, which runs while the main thread waits inside a collective), and
NCCL writes fr-trace-rank-R on a collective's timeout (TORCH_FR_DUMP_TEMP_FILE). Read here on the node, where the
dumps are, and reduced to a few fields per rank (launcher/remote/rank_stacks.py sends them with the stacks).

The dumps are pickles written by the ranks' processes; they are read with an unpickler that refuses every global
(a dump holds only dicts, lists, tuples, strings and numbers), so that a crafted file executes nothing, and
bounded in size. Standard library only (runs on the hosts).
"""

import io
import os
import pickle
import time

TYPE_CHECKING = False  # typing is not imported on the hosts (launcher/remote/__init__.py); mypy still reads it
if TYPE_CHECKING:
    from typing import Any

REQUEST_FILE = "fr-request"
DUMP_PREFIXES = ("fr-rank-", "fr-trace-rank-")  # on request; on an NCCL timeout
MAX_DUMP_BYTES = 64 << 20  # 2,000 entries with their frames are a few MB
WAIT_SECONDS = 3.0  # the ranks' threads look for a request twice a second


class _PlainData(pickle.Unpickler):
    """Builds containers and scalars only: every global (a class, a function) is refused."""

    def find_class(self, module: str, name: str) -> "Any":
        raise pickle.UnpicklingError(f"global {module}.{name} refused (a flight record holds plain data)")


def read_dump(path: str) -> "dict[str, Any]":
    """The dump as a dict; ValueError saying why where it is not one (too large, not a plain pickle, no entries)."""
    size = os.path.getsize(path)
    if size > MAX_DUMP_BYTES:
        raise ValueError(f"{size} bytes, more than {MAX_DUMP_BYTES}")
    with open(path, "rb") as f:
        data = f.read(MAX_DUMP_BYTES + 1)
    try:
        dump = _PlainData(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - any fault of a foreign file is the same answer: not readable
        raise ValueError(f"not a flight record ({type(e).__name__}: {e})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise ValueError("not a flight record (no entries)")
    return dump


def _frame(entry: "dict[str, Any]") -> str:
    """The innermost frame outside torch of the collective's call, as file:line."""
    for frame in entry.get("frames") or []:
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename") or "")
        if filename and "/torch/" not in filename:
            return f"{os.path.basename(filename)}:{frame.get('line')}"
    return ""


def summary(rank: int, dump: "dict[str, Any]") -> "dict[str, Any]":
    """Per process group, the newest collective the rank entered (its number is the same on every rank of the
    group) and the newest it completed. gloo records no completion (its entries stay `scheduled`): the collective
    a rank entered last is what compares across ranks on every backend."""
    groups: dict[str, dict[str, Any]] = {}
    for entry in dump["entries"]:
        if not isinstance(entry, dict) or entry.get("is_p2p") or not isinstance(entry.get("collective_seq_id"), int):
            continue
        group = entry.get("process_group")
        name = str(group[0]) if isinstance(group, (list, tuple)) and group else str(entry.get("pg_id", "0"))
        found = groups.setdefault(name, {"group": name, "last_entered": None, "last_completed": None})
        said = {"seq": entry["collective_seq_id"], "op": str(entry.get("profiling_name") or "?"),
                "state": str(entry.get("state") or "?"), "at": _frame(entry)}
        if found["last_entered"] is None or said["seq"] > found["last_entered"]["seq"]:
            found["last_entered"] = said
        if said["state"] == "completed" and (found["last_completed"] is None
                                             or said["seq"] > found["last_completed"]["seq"]):
            found["last_completed"] = said
    return {"rank": rank, "version": str(dump.get("version") or ""),
            "groups": sorted(groups.values(), key=lambda g: g["group"])}


def request(folder: str) -> float:
    """Ask every rank of this node for its flight record now; the time asked."""
    asked = time.time()
    path = os.path.join(folder, REQUEST_FILE)
    with open(path, "a"):
        pass
    os.utime(path, (asked, asked))
    return asked


def collect(folder: str, ranks: "list[int]", asked: "float | None", wait: float = WAIT_SECONDS) -> "list[dict]":
    """Each rank's summary from its newest dump (those written after `asked` awaited up to `wait` s for `ranks`),
    or its error; none for a rank that wrote none (no process group, or a torch without a flight recorder)."""
    deadline = time.monotonic() + wait
    while asked is not None and time.monotonic() < deadline:
        fresh = {r for r in ranks if _mtime(os.path.join(folder, f"{DUMP_PREFIXES[0]}{r}.pkl")) >= asked}
        if fresh >= set(ranks):
            break
        time.sleep(0.1)
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        prefix = next((p for p in DUMP_PREFIXES if name.startswith(p)), None)
        number = name[len(prefix):].split(".")[0] if prefix else ""
        if not number.isdigit() or name.endswith(".tmp"):
            continue
        try:
            found.append(dict(summary(int(number), read_dump(os.path.join(folder, name))), file=name))
        except (OSError, ValueError) as e:
            found.append({"rank": int(number), "file": name, "error": str(e)[:200]})
    newest: dict[int, dict[str, Any]] = {}  # one a rank: the dump on request over NCCL's older one
    for item in found:
        if item["rank"] not in newest or item["file"].startswith(DUMP_PREFIXES[0]):
            newest[item["rank"]] = item
    return [newest[r] for r in sorted(newest)]


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
