"""The last few lines of a worker's output, made safe to show under the progress display."""

from __future__ import annotations

from collections import deque

from launcher.execute.failures.worker_log import without_control_chars
from launcher.results.script_progress import PROTOCOL_KEY, protocol_message

TAIL_LINES = 5
MAX_LINE_CHARS = 200


def clean_line(line: str) -> str:
    """A line as a terminal would leave it: what follows its last carriage return (progress bars redraw with
    \\r), escape sequences and other control characters dropped, tabs as spaces, cut to a screen's width."""
    return without_control_chars(line.rsplit("\r", 1)[-1]).replace("\t", "    ").rstrip()[:MAX_LINE_CHARS]


class OutputTail:
    """The newest lines of one output stream, fed in pieces as they arrive (a line is whole once its newline
    has come; the unfinished one is shown too)."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._partial = ""

    def feed(self, text: str) -> list[str]:
        """Take the next piece of output; return the lines it completed, cleaned (the progress protocol's own
        lines are for ddpctl, not shown)."""
        pieces = (self._partial + text).split("\n")
        self._partial = pieces.pop()
        done = [clean_line(p) for p in pieces if protocol_message(p) is None]
        self._lines.extend(done)
        return done

    def restart(self) -> None:
        """A new attempt's output begins: an unfinished line of the old one will never be finished."""
        if self._partial:
            self._lines.append(clean_line(self._partial))
        self._partial = ""

    def lines(self) -> list[str]:
        """What to show, oldest first: the last whole lines and the unfinished one."""
        unfinished_protocol = self._partial.lstrip().startswith("{") and PROTOCOL_KEY in self._partial
        partial = "" if unfinished_protocol else clean_line(self._partial)
        shown = list(self._lines) + ([partial] if partial else [])
        return shown[-(self._lines.maxlen or TAIL_LINES):]
