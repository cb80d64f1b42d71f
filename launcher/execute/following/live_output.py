"""While `up` follows a run: global rank 0's output under the progress display, a script's progress read from
it, and torchrun's restarts as `restarted` events (node, attempt, cause) and one line each on the console.

On hosts the output comes with each node's state poll (launcher.runtimes.native.read_state: the bytes added since
the last poll, one command per node per poll); on this machine it is read from the run directory's logs/."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from launcher.execute.failures.restart_causes import ended_notes, node_labels, restart_cause, restart_line
from launcher.execute.following.live_tail import OutputTail
from launcher.results.progress import ProgressDisplay, console
from launcher.results.rank_layout import rank_layout
from launcher.results.restarts import attempt_number, newest_attempt_dir, restarts_phrase
from launcher.results.run_records import logged_restarts, record_restarts, restarts_told
from launcher.results.rundir import RunDir
from launcher.results.script_progress import ScriptProgress
from launcher.runtimes.native import NodeState, OutputRequest

MAX_BYTES_PER_POLL = 65536


class LiveOutput:
    """Rank 0's output, the script's progress and the restarts of a run being followed."""

    def __init__(self, run_dir: RunDir, progress: ProgressDisplay, show: bool = True) -> None:
        self._run_dir = run_dir
        self._progress = progress
        self._show = show
        self.rank0_node, self.rank0_local = rank_layout(run_dir).locate(0)
        self._tail = OutputTail()
        self._script = ScriptProgress()
        self._attempt: int | None = None
        self._offset = 0
        self._restarts = logged_restarts(run_dir)  # per node: the newest attempt seen (a run followed again
        # is not counted twice)
        self._labels = node_labels(run_dir)
        self._notes: list[dict[int, Any]] = [{} for _ in self._labels]  # per node: attempt -> ended.json
        self._told = {entry["attempt"] for entry in restarts_told(run_dir)}  # attempts whose line was printed

    @property
    def restarts(self) -> int:
        """The most restarts any node's torchrun made so far (each agent counts its own)."""
        return max(self._restarts.values(), default=0)

    def requests(self, nodes: int) -> list[OutputRequest | None]:
        """What each node's state poll should also fetch: rank 0's new output on its node."""
        request = OutputRequest(self.rank0_local, self._attempt, self._offset, MAX_BYTES_PER_POLL)
        return [request if node == self.rank0_node else None for node in range(nodes)]

    def observe(self, states: list[NodeState | None]) -> list[NodeState | None]:
        """Take a poll's states: note restarts, show rank 0's new output; a script's progress (from its output)
        becomes the state's progress record where the node has none of its own."""
        for node, state in enumerate(states):
            if state is not None and node < len(self._notes):
                self._notes[node].update(state.ended)
        for node, state in enumerate(states):
            if state is not None:
                self.note_attempt(node, state.attempt)
        rank0 = states[self.rank0_node] if self.rank0_node < len(states) else None
        if rank0 is not None and rank0.output_to is not None:
            self.take(rank0.output_attempt, rank0.output_from or 0, rank0.output_to, rank0.output)
        record = self._script.record
        if record is None:
            return states
        return [dataclasses.replace(s, progress=record) if s is not None and i == self.rank0_node and
                not s.progress else s for i, s in enumerate(states)]

    def note_attempt(self, node: int, attempt: int | None) -> None:
        """A node's newest attempt: each new one past 0 is a restart, logged once with its cause; each attempt's
        restart is told once on the console, whichever node showed it first."""
        new = record_restarts(self._run_dir, node, attempt, self._restarts,
                              lambda number: restart_cause(self._notes, number, self._labels))
        for number, cause in new:
            if number not in self._told:
                self._told.add(number)
                console.print(restart_line(number, cause), markup=False, highlight=False, soft_wrap=True)

    def take(self, attempt: int | None, start: int, end: int, text: str) -> None:
        """Bytes start..end of rank 0's stdout.log in `attempt`."""
        if attempt != self._attempt or start != self._offset:  # a new attempt, or bytes skipped
            self._tail.restart()
            self._script.feed("\n")
        self._attempt, self._offset = attempt, end
        new_lines = self._tail.feed(text)
        self._script.feed(text)
        title = "rank 0" + (f" ({restarts_phrase(self.restarts)})" if self.restarts else "") + ":"
        if self._show:
            self._progress.show_output(title, self._tail.lines(), new_lines)

    def local_record(self, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """This machine: read rank 0's new output from the run directory; the record to show (the trainer's
        own progress.json when there is one, else the script's)."""
        logs = self._run_dir.path / "logs"
        newest = newest_attempt_dir(logs)
        if newest is not None:
            attempt = attempt_number(newest.name)
            if attempt != self._restarts.get(0, 0):
                self._notes[0] = ended_notes(logs)
            self.note_attempt(0, attempt)
            previous = self._attempt
            if previous is not None and previous != attempt:  # the rest of the attempt that ended
                for old in logs.glob(f"*/attempt_{previous}"):
                    self._take_file(previous, old / str(self.rank0_local) / "stdout.log", self._offset)
            self._take_file(attempt, newest / str(self.rank0_local) / "stdout.log",
                            self._offset if attempt == self._attempt else 0)
        return record or self._script.record

    def _take_file(self, attempt: int | None, path: Path, start: int) -> None:
        data = _read_from(path, start, MAX_BYTES_PER_POLL)
        if data is not None and (data[1] or attempt != self._attempt):
            skipped, chunk = data
            self.take(attempt, start + skipped, start + skipped + len(chunk), chunk.decode(errors="replace"))


def _read_from(path: Path, start: int, most: int) -> tuple[int, bytes] | None:
    """(bytes skipped, the bytes after `start`, at most `most` of the newest); None when there is no file."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            begin = max(start if start <= size else 0, size - most)
            f.seek(begin)
            return begin - start, f.read(size - begin)
    except OSError:
        return None
