"""Where each rank is, from the stacks faulthandler dumped (launcher/remote/rank_stacks.py took them): a parser of
faulthandler's text and the verdict, one line naming per rank or group of ranks the innermost frame of the user's
code and whether that rank waits in a collective (which one), in data loading, or is elsewhere, e.g.
"ranks 0, 2 wait in all_reduce (train.py:52 in step); rank 1 is elsewhere, at train.py:8 in main
(`time.sleep(60)`): the ranks are not in the same collective". Pure functions: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[[^\]]*\])? \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')

# torch.distributed's collectives (distributed_c10d.py): a rank whose stack reaches one of these waits in it.
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "gather_object",
    "scatter", "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
    "recv_object_list", "new_group", "destroy_process_group",
})


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def short(self) -> str:
        """`train.py:52 in step`."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.function}"


@dataclass(frozen=True)
class Thread:
    ident: str
    current: bool  # the thread the signal interrupted (any thread of the process, not always the main one)
    frames: tuple[Frame, ...]  # innermost first, as faulthandler writes them


def parse_dump(text: str) -> list[Thread]:
    """The threads of one faulthandler dump (all_threads=True), each with its frames; lines it does not know
    (`  ...` for frames past its limit, `  <no Python frame>`) are skipped."""
    threads: list[Thread] = []
    header: tuple[str, bool] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        found = _THREAD.match(line)
        if found:
            if header is not None:
                threads.append(Thread(header[0], header[1], tuple(frames)))
            header, frames = (found.group(2), found.group(1) == "Current thread"), []
            continue
        frame = _FRAME.match(line)
        if frame and header is not None:
            frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    if header is not None:
        threads.append(Thread(header[0], header[1], tuple(frames)))
    return threads


def is_library(path: str) -> bool:
    """Whether a frame's file is the standard library's or an installed package's (not the user's code)."""
    return "-packages/" in path or "/lib/python3" in path or path.startswith("<") or path.endswith("sitecustomize.py")


def main_thread(threads: Sequence[Thread]) -> Thread | None:
    """The thread that runs the program: the one whose outermost frame is not a started thread's bootstrap."""
    for thread in threads:
        outermost = thread.frames[-1] if thread.frames else None
        if outermost is not None and not (outermost.file.endswith("threading.py")
                                          and outermost.function.startswith("_bootstrap")):
            return thread
    return threads[0] if threads else None


@dataclass(frozen=True)
class Place:
    """Where one process is: kind "collective", "backward", "data", "rendezvous" or "elsewhere"; `what` names the
    collective or the call; `user` is the innermost frame of the user's code."""

    kind: str
    what: str
    user: Frame | None


def _torch(path: str, *parts: str) -> bool:
    return any(f"torch/{p}" in path for p in parts)


def _classify(frame: Frame) -> tuple[str, str] | None:
    path, name = frame.file, frame.function
    if _torch(path, "distributed/distributed_c10d.py"):
        if name == "init_process_group":
            return "rendezvous", "init_process_group"
        if name in COLLECTIVES:
            return "collective", name
    if _torch(path, "distributed/rendezvous.py", "distributed/elastic/"):
        return "rendezvous", name
    if _torch(path, "nn/parallel/distributed.py"):
        return "collective", f"DDP's {name}"
    if _torch(path, "autograd/") and "backward" in name:
        return "backward", "backward"
    if _torch(path, "utils/data/"):
        return "data", name
    return None


def place_of(frames: Sequence[Frame]) -> Place:
    """Where a thread is: the library call its innermost user frame made, when that call is a collective,
    backward or rendezvous; data loading when a DataLoader is anywhere on the stack; else elsewhere."""
    user_at = next((i for i, f in enumerate(frames) if not is_library(f.file)), len(frames))
    user = frames[user_at] if user_at < len(frames) else None
    inner = [c for f in reversed(frames[:user_at]) if (c := _classify(f)) is not None]  # outermost call first
    if inner and inner[0][0] != "data":
        return Place(inner[0][0], inner[0][1], user)
    if inner or any(_classify(f) == ("data", f.function) for f in frames):
        return Place("data", "data loading", user)
    callee = frames[user_at - 1].function if 0 < user_at <= len(frames) else ""
    return Place("elsewhere", callee, user)


@dataclass(frozen=True)
class RankStacks:
    """One rank as the node found it: state "dumped", "exited", "no handler" or "no dump" (and "missing": it never
    registered); its dump, and those of its workers (processes below it that caught the signal too)."""

    rank: int
    node: int
    state: str
    dump: str = ""
    workers: tuple[str, ...] = ()


def ranks_from_answer(node: int, answer: Mapping[str, Any]) -> list[RankStacks]:
    """The RankStacks of one node's answer (launcher/remote/rank_stacks.py's JSON)."""
    found = []
    for entry in answer.get("ranks") or []:
        if isinstance(entry, dict) and isinstance(entry.get("rank"), int):
            workers = tuple(str(w.get("dump") or "") for w in entry.get("workers") or [] if isinstance(w, dict))
            found.append(RankStacks(entry["rank"], node, str(entry.get("state") or "no dump"),
                                    str(entry.get("dump") or ""), workers))
    return found


def _ranks(numbers: Sequence[int]) -> str:
    numbers = sorted(numbers)
    return f"rank {numbers[0]}" if len(numbers) == 1 else "ranks " + ", ".join(str(n) for n in numbers)


def _at(user: Frame | None, lines: Mapping[str, str]) -> str:
    if user is None:
        return "no frame of its own code"
    text = "".join(c for c in lines.get(f"{user.file}:{user.line}", "") if c.isprintable())  # no escapes
    return user.short + (f": `{text}`" if text else "")


def _worker_place(worker_dumps: Sequence[str], lines: Mapping[str, str]) -> str:
    """Where a rank's DataLoader workers are (the first with a frame of the user's code)."""
    for dump in worker_dumps:
        thread = main_thread(parse_dump(dump))
        if thread is not None:
            place = place_of(thread.frames)
            if place.user is not None:
                return f"; its DataLoader worker is at {_at(place.user, lines)}"
    return ""


def describe(rank: RankStacks, lines: Mapping[str, str]) -> tuple[str, str]:
    """(group key, what to say after `rank N`) for one rank."""
    if rank.state == "exited":
        return "exited", "{has} exited (its process is gone)"
    if rank.state == "missing":
        return "missing", "registered no stack dump (not started, or not yet at init_process_group)"
    thread = main_thread(parse_dump(rank.dump)) if rank.dump else None
    if thread is None:
        return f"none:{rank.state}", f"gave no stacks ({rank.state})"
    place = place_of(thread.frames)
    where = _at(place.user, lines)
    if place.kind == "collective":
        return f"c:{place.what}:{where}", f"wait{{s}} in {place.what} ({where})"
    if place.kind == "backward":
        return f"b:{where}", f"wait{{s}} in backward, where DDP all-reduces the gradients ({where})"
    if place.kind == "rendezvous":
        return f"r:{place.what}:{where}", f"wait{{s}} in the rendezvous, {place.what} ({where})"
    if place.kind == "data":
        return f"d:{where}", f"wait{{s}} for data loading ({where}{_worker_place(rank.workers, lines)})"
    return f"e:{where}", f"{{is}} elsewhere, at {where}"


def verdict(ranks: Sequence[RankStacks], lines: Mapping[str, str], world_size: int | None = None) -> str:
    """One line: each group of ranks in the same place, then what that means."""
    everyone = list(ranks)
    known = {r.rank for r in everyone}
    for missing in range(world_size or 0):
        if missing not in known:
            everyone.append(RankStacks(missing, -1, "missing"))
    if not everyone:
        return "no rank registered for stack dumps (a process started outside the join hook and the trainer)"
    groups: dict[str, tuple[list[int], str]] = {}
    for rank in sorted(everyone, key=lambda r: r.rank):
        key, text = describe(rank, lines)
        groups.setdefault(key, ([], text))[0].append(rank.rank)
    parts = []
    for members, text in groups.values():
        several = len(members) > 1
        parts.append(f"{_ranks(members)} " + text.replace("{s}", "" if several else "s")
                     .replace("{is}", "are" if several else "is").replace("{has}", "have" if several else "has"))
    return "; ".join(parts) + _meaning(groups)


def _meaning(groups: Mapping[str, tuple[list[int], str]]) -> str:
    kinds = [key.split(":", 1)[0] for key in groups]
    waiting = [k for k in groups if k.startswith(("c:", "b:", "r:"))]
    if "exited" in kinds and waiting:
        return ": the others wait for a rank that has exited (not a hang of the collective)"
    if "exited" in kinds:
        return ""
    if waiting and len(groups) > 1:
        return ": the ranks are not in the same collective"
    if len(waiting) == 1 and len(groups) == 1:
        return (": every rank is in the same collective and it does not complete (the network between the "
                "nodes, or a process outside this run)")
    return ""
