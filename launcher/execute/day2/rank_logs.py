"""`ddpctl logs RUN --rank R [-f | --attempt K]`: one worker's own output (its stdout.log on stdout, its stderr.log
on stderr) from the newest attempt (or attempt K), read where the run is: on its host (the pulled copy when the
host cannot be reached), or in a local run's directory; `-f` follows it, across restarts, until the run ends."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from launcher.errors import DdpctlError
from launcher.execute.following.outside_stops import DOWN_EVENT
from launcher.results.rank_layout import rank_layout
from launcher.results.restarts import attempt_number, newest_attempt_dir
from launcher.results.run_records import node_logs_dirs
from launcher.results.rundir import RunDir
from launcher.runtimes.native import OutputRequest, read_state

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions
    from launcher.transport.connection import HostConnection

FOLLOW_POLL_SECONDS = 1.0
# Without -f, how much of each file's end is read to find its last lines.
TAIL_BYTES = 1 << 20
STREAMS = ("stdout", "stderr")


@dataclass
class Chunk:
    """New bytes of one of the worker's files: attempt, where they start and end, the text."""

    attempt: int | None
    start: int
    end: int
    text: str


# Reads (stream, attempt the offset belongs to, offset, most bytes) -> the new bytes (None: no file yet).
Reader = Callable[[str, "int | None", int, int], "Chunk | None"]


def print_rank_log(run_dir: RunDir, rank: int, lines: int, follow: bool, options: UpOptions,
                   attempt: int | None = None) -> None:
    """Print global rank `rank`'s output (last `lines` of each stream) of the newest attempt or of `attempt`;
    with `follow`, what it adds until the run ends."""
    node, local_rank = rank_layout(run_dir).locate(rank)
    if not run_dir.record().get("nodes"):  # this machine's run
        from launcher.execute.this_machine.state import local_run_ended

        logs = run_dir.path / "logs"
        if attempt is not None:
            _print_attempt(logs, local_rank, rank, attempt, lines)
            return
        _print_rank(lambda *a: _read_local(logs, local_rank, *a), lambda: local_run_ended(run_dir),
                    rank, lines, follow)
        return
    from launcher.execute.hosts.run import node_workspaces, reattach

    pulled = node_logs_dirs(run_dir)[node]
    try:
        session = reattach(run_dir, options)
    except DdpctlError as e:  # e.g. rented machines already given back
        _print_pulled(pulled, local_rank, rank, lines, str(e), attempt)
        return
    conn = session.conn(node)
    try:
        conn.run(["true"], timeout=30)  # connect now: a host that is gone means the pulled copy
    except (DdpctlError, OSError) as e:
        session.close()
        _print_pulled(pulled, local_rank, rank, lines, f"node {node} cannot be reached: {e}", attempt)
        return
    with session:
        try:
            print_node_rank_log(conn, node_workspaces(run_dir)[node], run_dir.spec().python, node, local_rank, rank,
                                lines, follow, attempt, released=lambda: bool(run_dir.record().get("released_at")),
                                pulled=pulled)
        except (DdpctlError, OSError):
            if not (follow and any(e.get("event") == DOWN_EVENT for e in run_dir.events())):
                raise
            # `down` stopped the run and gave its machines back (Vast.ai) while a read was under way: the run has
            # ended, as -f waits for.
            print(f"rank {rank}: the run was ended by `ddpctl down` and node {node} is gone; what it wrote was "
                  f"pulled to {run_dir.path}", file=sys.stderr, flush=True)


def print_node_rank_log(conn: HostConnection, folder: str, python: str, node: int, local_rank: int, rank: int,
                        lines: int, follow: bool, attempt: int | None,
                        ended: Callable[[], bool] | None = None, released: Callable[[], bool] | None = None,
                        pulled: Path | None = None) -> None:
    """A worker's output read where its node writes it (`folder`: a host's workspace, or a Slurm node's folder on
    the cluster's shared file system), one command a read; `ended` says when following stops (default: when the
    node's own state says it ended, or its folder is gone). Once `released` says the machine was given back (after
    `down` pulled what it wrote), the rest is read from the `pulled` copy (--log-dir), not from a host that is gone."""
    finished = False

    def read(stream: str, attempt: int | None, offset: int, most: int) -> Chunk | None:
        nonlocal finished
        if released is not None and pulled is not None and released():
            finished = True
            return _read_local(pulled, local_rank, stream, attempt, offset, most)
        state = read_state(conn, folder, OutputRequest(local_rank, attempt, offset, most, stream), python)
        finished = state.finished or state.workspace_gone  # a deleted workspace: nothing more comes
        if state.output_to is None:
            return None
        return Chunk(state.attempt, state.output_from or 0, state.output_to, state.output)

    if attempt is None:
        _print_rank(read, ended or (lambda: finished), rank, lines, follow)
        return
    states = {stream: read_state(conn, folder, OutputRequest(local_rank, attempt, 0, TAIL_BYTES, stream), python)
              for stream in STREAMS}
    texts = {stream: state.output for stream, state in states.items()
             if state.output_to is not None and state.output_attempt == attempt}
    if not texts:
        raise DdpctlError(_no_attempt(rank, node, attempt, states["stdout"].attempt))
    _write_tails(texts, lines)


def print_pulled_rank_log(run_dir: RunDir, rank: int, lines: int, attempt: int | None, why: str) -> None:
    """A rank's output as pulled to this machine (`why`: the place where it runs cannot be read now)."""
    node, local_rank = rank_layout(run_dir).locate(rank)
    _print_pulled(run_dir.path / "nodes" / str(node) / "logs", local_rank, rank, lines, why, attempt)


def _print_pulled(pulled: Path, local_rank: int, rank: int, lines: int, why: str, attempt: int | None) -> None:
    """The end of a rank's output as pulled to this machine (a run whose hosts are gone cannot be followed)."""
    print(f"{why}; showing the copy pulled to {pulled}", file=sys.stderr, flush=True)
    if attempt is not None:
        _print_attempt(pulled, local_rank, rank, attempt, lines)
        return
    _print_rank(lambda *a: _read_local(pulled, local_rank, *a), lambda: True, rank, lines, False)


def _print_attempt(logs: Path, local_rank: int, rank: int, attempt: int, lines: int) -> None:
    """The end of each stream of one attempt of a worker, from a --log-dir on this machine."""
    folders = [d / str(local_rank) for d in logs.glob(f"*/attempt_{attempt}") if (d / str(local_rank)).is_dir()]
    if not folders:
        newest = newest_attempt_dir(logs)
        raise DdpctlError(_no_attempt(rank, None, attempt, attempt_number(newest.name) if newest else None))
    texts = {}
    for stream in STREAMS:
        path = folders[0] / f"{stream}.log"
        if path.is_file():
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - TAIL_BYTES))
                texts[stream] = f.read().decode(errors="replace")
    _write_tails(texts, lines)


def _no_attempt(rank: int, node: int | None, attempt: int, newest: int | None) -> str:
    where = f" on node {node}" if node is not None else ""
    have = "it has none yet" if newest is None else f"its attempts are 0 to {newest}"
    return f"--attempt {attempt}: rank {rank}{where} has no output of attempt {attempt} ({have})"


def _write_tails(texts: dict[str, str], lines: int) -> None:
    outputs: dict[str, TextIO] = {"stdout": sys.stdout, "stderr": sys.stderr}
    for stream, text in texts.items():
        outputs[stream].write("".join(text.splitlines(keepends=True)[-lines:]))
        outputs[stream].flush()


def _read_local(logs: Path, local_rank: int, stream: str, attempt: int | None, offset: int,
                most: int) -> Chunk | None:
    """New bytes of a worker's file in a --log-dir on this machine (a local run's, or a pulled copy)."""
    newest = newest_attempt_dir(logs)
    if newest is None:
        return None
    number = attempt_number(newest.name)
    if attempt is not None and attempt != number:  # the rest of the attempt read last, then the new one
        for old in logs.glob(f"*/attempt_{attempt}"):
            path = old / str(local_rank) / f"{stream}.log"
            if path.is_file() and path.stat().st_size > offset:
                newest, number = old, attempt
    start = offset if number == attempt else 0
    try:
        with open(newest / str(local_rank) / f"{stream}.log", "rb") as f:
            size = f.seek(0, 2)
            begin = max(start if start <= size else 0, size - most)
            f.seek(begin)
            data = f.read(size - begin)
    except OSError:
        return None
    return Chunk(number, begin, begin + len(data), data.decode(errors="replace"))


def _print_rank(read: Reader, ended: Callable[[], bool], rank: int, lines: int, follow: bool) -> None:
    """The last `lines` of each stream, then (with `follow`) each new piece until `ended` said so before a read."""
    outputs: dict[str, TextIO] = {"stdout": sys.stdout, "stderr": sys.stderr}
    where: dict[str, tuple[int | None, int]] = {}
    for stream in STREAMS:
        chunk = read(stream, None, 0, TAIL_BYTES)
        if chunk is not None:
            text = "".join(chunk.text.splitlines(keepends=True)[-lines:])
            outputs[stream].write(text)
            outputs[stream].flush()
            where[stream] = (chunk.attempt, chunk.end)
    if not where:
        waiting = "; waiting for it (Ctrl-C to stop)" if follow else " (the run is starting, or it never started)"
        print(f"rank {rank} has no output yet{waiting}", file=sys.stderr, flush=True)
    while follow:
        done = ended()  # before reading: what it wrote before it ended is still shown
        for stream in STREAMS:
            attempt, offset = where.get(stream, (None, 0))
            chunk = read(stream, attempt, offset, TAIL_BYTES)
            if chunk is None:
                continue
            if stream == "stdout" and stream in where and chunk.attempt != attempt:
                print(f"--- rank {rank}: torchrun restarted the workers (attempt {chunk.attempt}) ---",
                      file=sys.stderr, flush=True)
            outputs[stream].write(chunk.text)
            outputs[stream].flush()
            where[stream] = (chunk.attempt, chunk.end)
        if done:
            break
        time.sleep(FOLLOW_POLL_SECONDS)
