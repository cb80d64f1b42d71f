"""Files in a shipped project folder that look like a training's state (snapshots, checkpoints, saved weights):
a script that resumes from whatever it finds would resume from them on the hosts. The shipping line names them,
with the .ddpctlignore line that leaves them out, before any host starts."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Saved weights and training state, by extension.
STATE_SUFFIXES = (".pt", ".pth", ".ckpt")
# A folder that holds snapshots or checkpoints, by name (snapshots/, checkpoint/, ckpts/, ...).
STATE_FOLDER = re.compile(r"^(snapshots?|checkpoints?|ckpts?)$", re.IGNORECASE)
NAMED = 3  # state items named in the line; the rest are counted


def state_items(paths: Iterable[str]) -> list[str]:
    """What of `paths` (relative, '/'-separated, as shipped) looks like training state: a snapshot or checkpoint
    folder as `NAME/` (its outermost such folder), else each file with a state suffix. Sorted, folders whole."""
    items: set[str] = set()
    for path in paths:
        parts = path.split("/")
        folder = next((i for i, part in enumerate(parts[:-1]) if STATE_FOLDER.match(part)), None)
        if folder is not None:
            items.add("/".join(parts[:folder + 1]) + "/")
        elif path.lower().endswith(STATE_SUFFIXES):
            items.add(path)
    return sorted(items)


def state_note(paths: Iterable[str]) -> str | None:
    """The shipping line's clause about state files: what is shipped and how to leave it out; None without any."""
    items = state_items(paths)
    if not items:
        return None
    named = ", ".join(items[:NAMED]) + (f" and {len(items) - NAMED} more" if len(items) > NAMED else "")
    return (f"also shipped, and a script resuming from what it finds resumes from it: {named} "
            f"(a .ddpctlignore line `{items[0]}` leaves it out)")
