"""A remote command's output read from its SSH channel until the command ends, or until the connection under it
dies: a channel whose transport has gone (sshd killed, the link cut) is closed by paramiko with no exit status and
no EOF, so waiting for those two alone would wait for ever (and, as a closed channel is always readable, spin)."""

from __future__ import annotations

import select
import time
from typing import Any

# What a dead transport is, in words (paramiko says "Server connection dropped: " with nothing after it).
CONNECTION_DROPPED = "the SSH connection dropped (the host's sshd ended or the network failed)"
NO_STATUS = -1  # paramiko's exit_status until the remote's exit-status message comes


class CommandTimedOut(Exception):
    """The command was still running at its deadline."""


def read_until_exit(chan: Any, deadline: float | None) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of the command running on `chan` (a paramiko Channel); CommandTimedOut past
    `deadline` (time.monotonic()); EOFError(CONNECTION_DROPPED) when the connection dies before the status comes."""
    out, err = bytearray(), bytearray()
    while True:
        if chan.recv_ready():
            out += chan.recv(65536)
        elif chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        elif chan.exit_status_ready() and chan.eof_received:
            break
        elif chan.closed:  # closed under us: a status that came before stands, else the connection died
            if chan.exit_status != NO_STATUS:
                break
            raise EOFError(CONNECTION_DROPPED)
        else:
            wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if wait <= 0:
                raise CommandTimedOut
            select.select([chan], [], [], wait)
    return chan.recv_exit_status(), bytes(out), bytes(err)
