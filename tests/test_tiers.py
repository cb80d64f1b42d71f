"""The tier guard (tests/tiers.py): a unit test cannot start a process or open a network connection."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess

import pytest

from tests.tiers import CrossedBoundary


def test_a_unit_test_that_starts_a_process_fails_naming_the_tier_to_use() -> None:
    with pytest.raises(CrossedBoundary, match=r"started a process: mark it @pytest.mark.integration"):
        subprocess.run(["true"], check=True)
    with pytest.raises(CrossedBoundary):
        os.system("true")
    with pytest.raises(CrossedBoundary):
        multiprocessing.get_context("spawn").Process(target=print).start()


def test_a_unit_test_that_connects_over_the_network_fails() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(CrossedBoundary):
        sock.connect(("127.0.0.1", 9))


def test_a_unit_test_may_use_a_socket_pair() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"


@pytest.mark.integration
def test_an_integration_test_may_start_processes() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0
