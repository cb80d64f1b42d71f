"""A rank that failed because a peer went away: a consequence, not a cause.

When one rank dies, the ranks in a collective with it fail a moment later: their connection closed or reset, the
backend's "remote worker crashing". Which failure is seen first is decided by when each node's torchrun (or the
launcher's poll) looks, so under load the consequence can carry the earlier time. Those failures rank after any
other failure, and are the cause only when nothing else failed."""

from __future__ import annotations

import re
from collections.abc import Iterable

PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer|caused by a remote worker crashing|"
                       r"remote process exited|NCCL communicator was aborted|DistNetworkError")


def lost_a_peer(lines: Iterable[str]) -> bool:
    """Whether these lines (a failure's message or traceback) say that a peer went away."""
    return any(PEER_LOST.search(line) for line in lines)
