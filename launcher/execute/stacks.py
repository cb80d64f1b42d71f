"""Every rank's Python stack, taken from a live run (`ddpctl stacks RUN`, and before a stalled run is stopped):
each node's ranks are signalled to dump their stacks (launcher/remote/rank_stacks.py, on the host over SSH or
here for a run on this machine), the dumps are kept in the run directory (stacks/<time>/node-K.json and
node-K-rank-R.txt) and read into one verdict line (launcher/results/stack_verdict.py), also recorded as a
`stacks` event.

Processes in Docker containers are not reached (the host's login user cannot signal into the container), and
ranks of an MPI launch that never call init_process_group register no dump: both show as no stacks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import DdpctlError
from launcher.remote import flight_records, proctree, rank_stacks
from launcher.remote.program import on_stdin, program
from launcher.results.flight_verdict import flight_verdict
from launcher.results.rundir import RunDir, write_bytes_atomic, write_json_atomic
from launcher.results.stack_verdict import RankStacks, ranks_from_answer, verdict
from launcher.transport.connection import HostConnection
from launcher.transport.hostsession import HostSession
from launcher.transport.parallel import run_on_hosts

STACKS_FOLDER = "stacks"


@dataclass(frozen=True)
class StacksTaken:
    verdict: str
    folder: Path


def stacks_program() -> str:
    return program(rank_stacks, proctree, flight_records, end_with_client=True)


def node_stacks(conn: HostConnection, workspace: str, python: str = "python3") -> dict[str, Any]:
    """One node's answer: its ranks' dumps (launcher/remote/rank_stacks.py run on the host)."""
    loader, text = on_stdin(stacks_program())
    result = conn.run([python, "-S", *loader, workspace], timeout=120, stdin=text)
    try:
        found = json.loads(result.stdout) if result.exit_code == 0 else None
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, dict):
        why = " ".join((result.stderr or result.stdout or f"exit {result.exit_code}").split()[-20:])
        raise DdpctlError(f"{getattr(conn, 'label', 'host')}: the stacks could not be taken: {why[:300]}")
    return found


def take_stacks(run_dir: RunDir, session: HostSession | None, workspaces: list[str]) -> StacksTaken:
    """Take every node's stacks (over `session`, or here when it is None), keep them, and return the verdict."""
    python = run_dir.spec().python
    if session is None:
        answers: list[dict[str, Any] | None] = [rank_stacks.take(w) for w in workspaces]
        errors: list[str | None] = [None] * len(workspaces)
    else:
        outcomes = run_on_hosts(list(range(len(workspaces))),
                                lambda i: node_stacks(session.conn(i), workspaces[i], python), timeout=150,
                                label=session.label_of)
        answers = [o.value for o in outcomes]
        errors = [None if o.error is None else " ".join(str(o.error).split()) for o in outcomes]
    return keep_stacks(run_dir, answers, errors)


def keep_stacks(run_dir: RunDir, answers: list[dict[str, Any] | None], errors: list[str | None]) -> StacksTaken:
    """Write the nodes' answers into stacks/<time>/ and record the verdict they give."""
    folder = run_dir.path / STACKS_FOLDER / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    folder.mkdir(parents=True, exist_ok=True)
    ranks: list[RankStacks] = []
    lines: dict[str, str] = {}
    worlds: list[int] = []
    for node, answer in enumerate(answers):
        if answer is None:
            continue
        write_json_atomic(folder / f"node-{node}.json", answer)
        found = ranks_from_answer(node, answer)
        for rank in (r for r in found if r.dump or r.workers):  # an exited rank has none
            text = rank.dump + "".join(f"\n# a process below rank {rank.rank}\n{w}" for w in rank.workers)
            write_bytes_atomic(folder / f"node-{node}-rank-{rank.rank}.txt", text.encode())
        ranks += found
        lines.update({str(k): str(v) for k, v in (answer.get("lines") or {}).items()})
        worlds += [int(e["world_size"]) for e in answer.get("ranks") or []
                   if isinstance(e, dict) and isinstance(e.get("world_size"), int)]
    said = verdict(ranks, lines, max(worlds) if worlds else None)
    flown = flight_verdict([f for a in answers if a for f in a.get("flight_records") or [] if isinstance(f, dict)])
    if flown:
        said += f"; {flown}"
    unreached = [f"node {i}: {e}" for i, e in enumerate(errors) if e is not None]
    if unreached:
        said += "; not reached: " + "; ".join(unreached)
    write_bytes_atomic(folder / "verdict.txt", (said + "\n").encode())
    run_dir.event("stacks", verdict=said, folder=str(folder.relative_to(run_dir.path)))
    return StacksTaken(said, folder)


def stall_verdict(run_dir: RunDir, session: HostSession | None, workspaces: list[str]) -> str:
    """The verdict for a stalled run about to be stopped, with where its stacks are kept; a failure to take them
    is said instead (the stop goes on either way)."""
    try:
        taken = take_stacks(run_dir, session, workspaces)
    except (DdpctlError, OSError) as e:
        return f"its stacks could not be taken ({' '.join(str(e).split())})"
    return f"{taken.verdict} (stacks in {taken.folder})"
