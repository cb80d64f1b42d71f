"""The store each torchrun attempt's ranks meet in when torchrun shares its own store across restarts: a
restarted rank must find this attempt's rank 0, never the dead address a failed attempt left behind."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.trainer_support import free_port
from trainer.distributed import ATTEMPT_KEY, attempt_store
from trainer.errors import TrainerError


@pytest.fixture
def shared() -> dist.TCPStore:
    """Stands in for torchrun's agent store (a real TCPStore server)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def join_in_thread(shared: dist.TCPStore, rank: int, results: dict[int, object], **kw: float) -> threading.Thread:
    def join() -> None:
        client = dist.TCPStore("127.0.0.1", shared.port, is_master=False, timeout=timedelta(seconds=30))
        try:
            results[rank] = attempt_store(client, rank, "127.0.0.1", **kw)
        except Exception as e:  # handed to the test thread
            results[rank] = e

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    return thread


def test_ranks_skip_a_dead_attempts_announcement_and_meet_in_the_new_store(shared: dist.TCPStore) -> None:
    shared.set(ATTEMPT_KEY, f"{free_port()} deadbeefdeadbeef")  # the failed attempt's rank 0, now gone
    results: dict[int, object] = {}
    waiting = [join_in_thread(shared, rank, results) for rank in (1, 2)]
    threading.Event().wait(1.0)  # they read the stale announcement first
    assert not results, "no rank may settle on the dead attempt's store"
    rank0 = attempt_store(shared, 0, "127.0.0.1")
    for thread in waiting:
        thread.join(timeout=60)
    assert all(isinstance(results[r], dist.Store) for r in (1, 2)), results
    for rank in (1, 2):
        store = results[rank]
        assert isinstance(store, dist.Store)
        store.set(f"hello-{rank}", str(rank))
    assert rank0.get("hello-1") == b"1" and rank0.get("hello-2") == b"2"


def test_each_attempt_gets_a_store_of_its_own(shared: dist.TCPStore) -> None:
    first = attempt_store(shared, 0, "127.0.0.1")
    first.set("weights", "attempt 1")
    second = attempt_store(shared, 0, "127.0.0.1")
    assert second.port != first.port
    assert second.check(["weights"]) is False


def test_no_live_rank0_is_a_one_line_error_in_time(shared: dist.TCPStore) -> None:
    shared.set(ATTEMPT_KEY, f"{free_port()} deadbeefdeadbeef")
    results: dict[int, object] = {}
    join_in_thread(shared, 1, results, timeout=2.0, probe_timeout=0.5).join(timeout=30)
    error = results[1]
    assert isinstance(error, TrainerError) and "rank 0 announced no live store" in str(error)
