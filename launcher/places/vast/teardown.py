"""Stopping the bill: destroy instances and verify they are gone; what they cost so far."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from launcher.places.vast.client import VastClient
from launcher.places.vast.errors import VastError, VastNotFound
from launcher.places.vast.models import RentedInstance, TeardownResult, gone_after_destroy

log = logging.getLogger(__name__)


def destroy_verified(
    client: VastClient,
    instance_id: int,
    *,
    verify_timeout: float = 60.0,
    poll_interval: float = 2.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> TeardownResult:
    """Destroy one instance and wait until show_instance no longer finds it, or shows it released (cur_state
    `unloaded`, models.GONE_STATES: a destroyed machine can stay listed for a while).

    Never raises for API errors: the result says whether the instance is verified gone.
    """
    deadline = clock() + verify_timeout
    destroy_calls = 0
    try:
        while True:
            if destroy_calls < 3:
                destroy_calls += 1
                with contextlib.suppress(VastNotFound):  # already gone: verified below
                    client.destroy_instance(instance_id)
            shown = client.show_instance(instance_id)
            if shown is None or gone_after_destroy(shown):
                return TeardownResult(instance_id, True, clock())
            if clock() >= deadline:
                return TeardownResult(instance_id, False, None,
                                      f"instance {instance_id} still exists {verify_timeout:.0f}s after destroy; "
                                      "check the Vast.ai console, it may still be billing")
            sleep(poll_interval)
    except VastError as exc:
        log.warning("destroying instance %s: %s", instance_id, exc)
        return TeardownResult(instance_id, False, None, str(exc))


def teardown(
    client: VastClient,
    instance_ids: Iterable[int],
    *,
    overlay_name: str | None = None,
    verify_timeout: float = 60.0,
    poll_interval: float = 2.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> list[TeardownResult]:
    """Destroy every instance (each verified gone), then delete the overlay network if one was made.

    Returns one result per instance, in order; a failure on one does not stop the others.
    """
    results = [
        destroy_verified(client, iid, verify_timeout=verify_timeout, poll_interval=poll_interval,
                         clock=clock, sleep=sleep)
        for iid in instance_ids
    ]
    if overlay_name is not None:
        try:
            client.delete_overlay(overlay_name)
        except VastNotFound:
            pass
        except VastError as exc:  # an empty overlay costs nothing; say so and go on
            log.warning("deleting overlay %s: %s", overlay_name, exc)
    return results


def cost_so_far(
    instances: Iterable[RentedInstance], now: float, ended_at: Mapping[int, float] | None = None
) -> float:
    """Dollars spent: each instance's hourly price times the hours from its creation to its destruction
    (`ended_at[instance_id]`) or to `now` while it still runs."""
    ended_at = ended_at or {}
    total = 0.0
    for inst in instances:
        end = min(now, ended_at.get(inst.instance_id, now))
        total += inst.dph * max(0.0, end - inst.created_at) / 3600.0
    return total
