"""Runs on a host inside a program ddpctl started over SSH (standard library only; part of the program's text,
launcher/remote/program.py with `end_with_client`): end the program when its client is gone. sshd does not end
a command without a terminal when the connection drops; such a command learns of it only when it next writes, and a
listing of a large tree (or one that was edited to walk the whole file system) writes once, at its end: it would
run on for minutes at full CPU after ddpctl was killed. A thread checks twice a second whether the process that
started the program (the SSH session) is still its parent, and whether anyone still reads its output (the pipe or
socket to sshd), and ends the program with status 129 (as SIGHUP would) when either is gone. A program that forks
to go on in the background (launcher/remote/daemon.py) keeps its child: a fork copies no thread."""

import os
import select
import sys
import threading
import time

GONE_STATUS = 129  # 128 + SIGHUP: the status a shell gives a command its terminal hung up on
CHECK_SECONDS = 0.5


def output_unread(fd: int) -> bool:
    """Whether `fd` (a pipe's or socket's writing end) has lost its reader: poll says so with POLLERR or POLLHUP."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def client_gone(parent: int, fd: int) -> bool:
    """Whether the program's client is gone: its parent is not `parent` any more, or `fd` has no reader."""
    return os.getppid() != parent or output_unread(fd)


def end_with_client(seconds: float = CHECK_SECONDS) -> None:
    """Start the watch (a daemon thread): os._exit(GONE_STATUS) once client_gone."""
    parent = os.getppid()
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        fd = 1

    def watch() -> None:
        while not client_gone(parent, fd):
            time.sleep(seconds)
        os._exit(GONE_STATUS)

    threading.Thread(target=watch, name="ddpctl-client-watch", daemon=True).start()
