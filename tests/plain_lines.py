"""What `up` and `sweep` write where their output is not a terminal: lines with a time stamp in front
(launcher/execute/following/plain_progress.py). Tests that look for a line's start read it without the stamp."""

from __future__ import annotations

import re

STAMPED_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d ", re.M)


def unstamped(text: str) -> str:
    """`text` with the time stamp in front of each line taken off."""
    return STAMPED_LINE.sub("", text)
