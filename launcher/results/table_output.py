"""Where a table goes to stdout: a terminal's width decides there; into a pipe or a file the whole table is
written (rich would cut it to 80 columns, and `ddpctl report | less` or `> report.txt` lost columns)."""

from __future__ import annotations

import sys
from typing import Any

# Wide enough for any table of ours; rich pads no line to it (tables are as wide as their cells).
UNBOUNDED_WIDTH = 100_000


def table_console() -> Any:
    """A rich Console for stdout: the terminal's width on a terminal, no limit elsewhere."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=UNBOUNDED_WIDTH, soft_wrap=False)
