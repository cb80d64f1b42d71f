"""A remote command's output read until it ends (launcher/transport/channel_output.py), on channels that behave as
paramiko's do: one whose connection dies is closed with no exit status and no EOF (paramiko's Channel._set_closed),
which must end the wait at once with the connection named, not spin for ever. The real case, sshd killed while
`up` pulls, is tests/faults/test_pull_cut.py; a session asked of a connection that has just died says so too."""

from __future__ import annotations

import os
import time

import pytest

from launcher.errors import HostError
from launcher.transport.channel_output import CONNECTION_DROPPED, NO_STATUS, CommandTimedOut, read_until_exit
from launcher.transport.paramiko_loader import paramiko
from launcher.transport.ssh import Connection, SSHTarget


class Channel:
    """What read_until_exit asks of a paramiko Channel; `closes_after` polls, the connection dies (closed, no
    status, no EOF) unless `status` came first."""

    def __init__(self, out: bytes = b"", err: bytes = b"", status: int | None = None, eof: bool = False,
                 closes_after: int | None = None) -> None:
        self.out, self.err, self.eof_received = out, err, eof
        self.exit_status = NO_STATUS if status is None else status
        self.closed, self.polls, self.closes_after = False, 0, closes_after
        self._read, self._write = os.pipe()  # what select waits on: never readable here

    def recv_ready(self) -> bool:
        self.polls += 1
        if self.closes_after is not None and self.polls >= self.closes_after:
            self.closed = True
        return bool(self.out)

    def recv(self, n: int) -> bytes:
        data, self.out = self.out[:n], self.out[n:]
        return data

    def recv_stderr_ready(self) -> bool:
        return bool(self.err)

    def recv_stderr(self, n: int) -> bytes:
        data, self.err = self.err[:n], self.err[n:]
        return data

    def exit_status_ready(self) -> bool:
        return self.closed or self.exit_status != NO_STATUS

    def recv_exit_status(self) -> int:
        return self.exit_status

    def fileno(self) -> int:
        return self._read

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def test_a_command_that_ends_gives_its_status_and_output() -> None:
    chan = Channel(out=b"hello", err=b"warn", status=3, eof=True)
    assert read_until_exit(chan, None) == (3, b"hello", b"warn")
    chan.close()


def test_a_connection_that_dies_ends_the_wait_at_once_naming_it() -> None:
    chan = Channel(out=b"partial", closes_after=5)
    started = time.monotonic()
    with pytest.raises(EOFError, match="the SSH connection dropped"):
        read_until_exit(chan, None)  # no deadline: before, this waited for ever
    assert time.monotonic() - started < 2 and str(CONNECTION_DROPPED).startswith("the SSH connection dropped")
    chan.close()


def test_a_status_that_came_before_the_close_stands() -> None:
    chan = Channel(out=b"done", status=0, closes_after=3)  # exit status, then closed with no EOF
    assert read_until_exit(chan, None) == (0, b"done", b"")
    chan.close()


def test_a_command_still_running_at_its_deadline_times_out() -> None:
    chan = Channel()
    with pytest.raises(CommandTimedOut):
        read_until_exit(chan, time.monotonic() + 0.3)
    chan.close()


class Transport:
    """A paramiko Transport whose connection dies (`dies`) or lives (`refuses`) when a session is asked of it."""

    def __init__(self, dies: bool) -> None:
        self.active, self.dies = True, dies

    def is_active(self) -> bool:
        return self.active

    def open_session(self, timeout: float | None = None) -> object:
        if self.dies:
            self.active = False  # paramiko's reader saw the connection go under the request
            raise EOFError()
        raise paramiko.ChannelException(1, "Administratively prohibited")

    def close(self) -> None:
        self.active = False


REFUSED = "cannot open a session: ChannelException(1, 'Administratively prohibited')"


@pytest.mark.parametrize(("dies", "said"), [(True, CONNECTION_DROPPED), (False, REFUSED)])
def test_a_session_refused_names_a_dead_connection_as_such(dies: bool, said: str) -> None:
    """sshd killed between two commands of a pull: the next command's session cannot open, and the line says the
    connection dropped, not only that a session could not be opened (which a live server refusing also gives)."""
    conn = Connection(SSHTarget(label="alice@203.0.113.9", hostname="203.0.113.9", port=22, user="alice"))
    conn._transport = Transport(dies)  # type: ignore[assignment]
    with pytest.raises(HostError) as refused:
        conn.run(["true"])
    assert str(refused.value).endswith(said), refused.value
