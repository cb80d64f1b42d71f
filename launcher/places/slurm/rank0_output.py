"""While `up` follows a scheduled job: global rank 0's own output, live, read from the shared file system.

Each poll is one command on the login node: the newest attempt folder of rank 0's node (torchrun's
`logs/<id>/attempt_<N>/<local rank>/stdout.log`) and the bytes added since the last poll. Rank 0's node is the one
whose trainer writes out/progress.json (rank 0 writes it); for a script, c10d's own rule: group ranks follow the
nodes' rendezvous addresses, here their host names, as text. What is shown goes through the display of host runs
(launcher.execute.following.live_tail, the live tail on a terminal, stamped plain lines elsewhere)."""

from __future__ import annotations

from launcher.execute.following.live_tail import OutputTail
from launcher.places.slurm.job_output import expand_hostlist
from launcher.remote import shell_text
from launcher.results.progress import ProgressDisplay, RunProgress
from launcher.spec.run_spec import RunSpec
from launcher.transport.ssh import Connection

MAX_BYTES_PER_POLL = 65536
RANK0_OUTPUT_SCRIPT = shell_text("rank0_output.sh")  # launcher/remote/rank0_output.sh: its arguments there


class Rank0Output:
    """Rank 0's output of a job being followed, shown as it grows."""

    def __init__(self, spec: RunSpec, remote_dir: str, display: ProgressDisplay) -> None:
        self._spec, self._remote_dir, self._display = spec, remote_dir, display
        self._tail = OutputTail()
        self._node: int | None = None  # rank 0's node, once known
        self._attempt, self._offset = "", 0

    def poll(self, conn: Connection, nodelist: str) -> None:
        """Read and show what rank 0 wrote since the last poll (nothing when its log is not there yet)."""
        by_name = _first_by_name(expand_hostlist(nodelist), self._spec.nnodes)
        # Known, else for a script c10d's rule, for our trainer the node whose rank 0 writes progress.json (-1).
        wanted = self._node if self._node is not None else by_name if self._spec.user_command else -1
        result = conn.run(["sh", "-c", RANK0_OUTPUT_SCRIPT, "ddpctl-rank0", self._remote_dir,
                           str(self._spec.nnodes), "0", str(wanted), str(by_name), str(self._offset),
                           self._attempt or "-", str(MAX_BYTES_PER_POLL)], timeout=30)
        head, _, body = result.stdout.partition("\n")
        words = head.split()
        if not result.ok or len(words) != 10 or words[0] != "NODE" or words[3] == "-":
            return
        node, attempt, size, start, rule = int(words[1]), words[3], int(words[5]), int(words[7]), words[9]
        if rule in ("given", "progress") or self._spec.user_command:
            self._node = node
        if attempt != self._attempt or start != self._offset:  # a new attempt (a restart), or bytes skipped
            self._tail.restart()
        self._attempt, self._offset = attempt, size
        new_lines = self._tail.feed(body)
        if body:
            title = "rank 0" + (f" (attempt {attempt})" if attempt != "0" else "") + ":"
            self._display.show_output(title, self._tail.lines(), new_lines)

    def job_state(self, state: str) -> None:
        """On a terminal, every node's row shows the job's state (plain lines tell it once already)."""
        if isinstance(self._display, RunProgress):
            for node in range(self._spec.nnodes):
                self._display.update(node, None, state=state.lower())


def _first_by_name(hosts: list[str], nodes: int) -> int:
    """The node holding group rank 0 by c10d's rule (rendezvous addresses, here host names, compared as text)."""
    names = hosts[:nodes]
    if len(names) != nodes or not names:
        return 0
    return min(range(nodes), key=lambda k: names[k])
