"""Creates whose answer never came. Vast.ai may rent a machine and still answer 500 (or the connection drops), and
its instance list lags behind creates, so one look is not enough. Every create is first recorded as an intent
(ledger.py's `create_intents`); a create without an answer is looked up by the run's label until it is found or a
grace has passed; what is still unresolved is looked up again by `status --rented` and `down`, which adopt what
they find into the ledger (then shown and destroyed like every other machine of the run)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.places.vast.errors import VastError, VastUnavailable
from launcher.places.vast.ledger import Ledger, open_intents
from launcher.places.vast.models import gone_after_destroy

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient

# How long a create without an answer may take to show up in the instance list; after that, an intent that no
# listed instance answers is taken as not rented.
RECONCILE_GRACE_S = 180.0


def answer_lost(exc: VastError) -> bool:
    """Whether a failed create may still have rented: a 5xx or no answer at all (a 4xx or a `success: false`
    answer is Vast saying no, and a create without `new_contract` in its answer is unsure too)."""
    return isinstance(exc, VastUnavailable) or exc.status is None


def _machine_matches(listed: dict[str, Any], machine_id: int | None) -> bool:
    shown = listed.get("machine_id")
    return machine_id is None or shown is None or int(shown) == int(machine_id)


def find_created(client: VastClient, label: str, machine_id: int | None, known: set[int], *, grace: float,
                 poll_interval: float, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any] | None:
    """The instance a create without an answer made: listed with `label` on the offer's machine and not one of
    `known`; asked again every `poll_interval` s until found or `grace` s have passed (then None)."""
    deadline = clock() + grace
    while True:
        for listed in client.list_instances(label=label):
            if int(listed["id"]) not in known and _machine_matches(listed, machine_id):
                return listed
        if clock() >= deadline:
            return None
        sleep(poll_interval)


def run_label(ledger: Ledger) -> str:
    """The label this run's instances were created with (the run id unless run.json says otherwise)."""
    vast = ledger.run_dir.record().get("vast")
    label = vast.get("label") if isinstance(vast, dict) else None
    return str(label or ledger.run_dir.run_id)


def reconcile_run(client: VastClient, ledger: Ledger, *, grace: float = RECONCILE_GRACE_S,
                  clock: Callable[[], float] = time.time) -> list[int]:
    """Adopt every instance listed with the run's label that the ledger lacks (and is not released), closing the
    intents they answer; an open intent older than `grace` that nothing answers is marked not_rented. Returns the
    ids adopted. One list request; nothing is written when nothing changed."""
    intents = open_intents(ledger.intents)
    known = {int(i["instance_id"]) for i in ledger.instances}
    adopted: list[int] = []
    for listed in client.list_instances(label=run_label(ledger)):
        if int(listed["id"]) in known or gone_after_destroy(listed):
            continue
        intent = next((i for i in intents if _machine_matches(listed, i.get("machine_id"))), None)
        if intent is not None:
            intents.remove(intent)
        ledger.adopt(listed, intent)
        adopted.append(int(listed["id"]))
    now = clock()
    stale = [i for i in intents if now - float(i.get("sent_at") or 0.0) > grace]
    for intent in stale:
        intent["state"] = "not_rented"
    if adopted or stale:
        ledger.save()
    return adopted
