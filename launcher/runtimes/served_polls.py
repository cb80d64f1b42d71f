"""A followed run's state polls: one node program per host, started once (`node_state.py --serve`) and asked once a
poll over its SSH channel, where each poll was a new channel, a shell and a Python start on the host (CPU taken
from the cores that train, every second on every node). A channel that fails is closed. One that had ended (the
host ended its program after an idle while, the connection was made anew) is replaced at once, within the same
poll; a new one that fails, or an answer that does not come in time, fails the poll as a one-shot poll would.
The polls' owner closes a ServedPolls when it is done (`contextlib.closing`)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from launcher.errors import HostError
from launcher.remote.program import ahead_of_input
from launcher.runtimes.native import NodeState, OutputRequest, answered_state, node_program, node_request

if TYPE_CHECKING:
    from launcher.transport.connection import HostConnection

# The longest answer line read (a poll's output is at most OutputRequest.max_bytes, 64 KiB, escaped in JSON).
MAX_ANSWER_BYTES = 4 << 20


class ProgramEnded(HostError):
    """The served node program's channel ended (its program exited, or the connection closed)."""


class ServedNodeProgram:
    """The node program running on one host in `--serve` mode: `ask` sends a request line, reads the answer line."""

    def __init__(self, conn: HostConnection, python: str) -> None:
        self.label = getattr(conn, "label", "host")
        self.python = python
        self._buffer = b""
        loader, first = ahead_of_input(node_program())  # without `site` (-S): the standard library only
        self._chan = conn.open_channel_command([python, "-S", *loader, "--serve"])
        self._unsent: BaseException | None = None  # the program could not be sent: ask says why
        try:
            self._chan.settimeout(30.0)
            self._chan.sendall(first)
        except (OSError, EOFError) as e:
            self._unsent = e
        except BaseException:
            self.close()
            raise

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The answer to `request` (a JSON object); HostError when none comes within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        if self._unsent is not None:  # e.g. no such python: it ended before reading its program
            raise ProgramEnded(self.label, f"the node program could not run with {self.python}: "
                                           f"{self._stderr_tail() or self._unsent}")
        try:
            self._chan.settimeout(timeout)
            self._chan.sendall(json.dumps(request).encode() + b"\n")
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or len(self._buffer) > MAX_ANSWER_BYTES:
                    raise HostError(self.label, f"the node program gave no answer within {timeout:g} s")
                self._chan.settimeout(left)
                data = self._chan.recv(65536)
                if not data:
                    raise ProgramEnded(self.label, f"the node program could not run with {self.python}: "
                                                f"{self._stderr_tail() or 'it ended'}")
                self._buffer += data
        except TimeoutError as e:
            raise HostError(self.label, f"the node program gave no answer within {timeout:g} s") from e
        except (OSError, EOFError) as e:
            raise ProgramEnded(self.label, f"connection lost while asking the node program: {e}") from e
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            found = json.loads(line)
        except (ValueError, RecursionError):
            found = None
        if not isinstance(found, dict) or "error" in found:
            why = found.get("error") if isinstance(found, dict) else line[:200].decode(errors="replace")
            raise HostError(self.label, f"the node program could not answer: {why}")
        return found

    def _stderr_tail(self) -> str:
        err = b""
        while self._chan.recv_stderr_ready():
            err += self._chan.recv_stderr(65536)
        return " ".join(err.decode(errors="replace").split()[-30:])[:300]

    def close(self) -> None:
        """Close the channel: the program on the host reads the end of its input and ends."""
        self._chan.close()


class ServedPolls:
    """The state polls of one followed run: a ServedNodeProgram per node, opened at its first poll."""

    def __init__(self, python: str) -> None:
        self.python = python
        self._served: dict[int, ServedNodeProgram] = {}

    def read_state(self, index: int, conn: HostConnection, workspace: str,
                   output: OutputRequest | None = None) -> NodeState:
        """Node `index`'s state (as launcher.runtimes.native.read_state) from its served node program."""
        request, timeout = node_request(workspace, output)
        # No longer than a one-shot poll waits for its channel to open: a host gone silent is told as soon.
        timeout = min(timeout, float(getattr(conn, "connect_timeout", timeout)))
        served = self._served.pop(index, None)
        reused = served is not None
        while True:
            if served is None:
                served = ServedNodeProgram(conn, self.python)
            try:
                found = served.ask(request, timeout)
            except ProgramEnded:
                served.close()
                if not reused:
                    raise
                served, reused = None, False  # ended while idle: a new one, within this poll
                continue
            except BaseException:
                served.close()
                raise
            self._served[index] = served
            return answered_state(found)

    def close(self) -> None:
        """End every node's served program."""
        for served in self._served.values():
            served.close()
        self._served.clear()

