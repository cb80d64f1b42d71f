"""What tells a host program that its SSH client is gone (launcher/remote/client_watch.py): its output's reader
closed, or its parent changed; and that a program is sent with the watch only when asked (a node's supervisor
must outlive its client). The real case, ddpctl killed mid-listing: tests/faults/test_listing_ends_with_client.py."""

from __future__ import annotations

import os
import socket

from launcher.remote import client_watch, tree_sync
from launcher.remote.program import program
from launcher.runtimes.native import node_program, start_program
from launcher.transport.sync import REMOTE_SCRIPT


def test_a_pipe_whose_reader_closed_is_unread() -> None:
    read, write = os.pipe()
    try:
        assert not client_watch.output_unread(write)
        os.close(read)
        assert client_watch.output_unread(write)
        assert client_watch.client_gone(os.getppid(), write)
    finally:
        os.close(write)


def test_a_socket_whose_peer_closed_is_unread() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        assert not client_watch.output_unread(ours.fileno())
        theirs.close()
        assert client_watch.output_unread(ours.fileno())


def test_a_changed_parent_is_a_client_gone() -> None:
    read, write = os.pipe()
    try:
        assert not client_watch.client_gone(os.getppid(), write)
        assert client_watch.client_gone(os.getppid() + 1, write)
    finally:
        os.close(read)
        os.close(write)


def test_the_watch_is_sent_only_where_asked() -> None:
    assert "_WATCH = True" in REMOTE_SCRIPT and "launcher.remote.client_watch" in REMOTE_SCRIPT
    assert program(tree_sync, end_with_client=True) == REMOTE_SCRIPT
    for outliving in (start_program(), node_program()):  # the supervisor, and the state polls of a run
        assert "_WATCH = False" in outliving
