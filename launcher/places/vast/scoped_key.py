"""The autostop key (autostop.py) proven when it is made, not trusted: its permission shape is unverified against
the real service. Vast's docs (api-reference/permissions.mdx) put the constraints directly under the endpoint
permission; a third-party README nests them under the HTTP method. A server that did not understand the shape we
sent could refuse it (harmless) or store the key without the rule it did not understand: a key holding all of
instance_write (destroy, rent, ...) on a rented machine. So each key is checked before it goes to a node:

1. read back (GET /api/v0/auth/apikeys/, the user's own key): the account must store exactly what we asked;
2. proven with the new key by requests outside its scope, which must be refused (401/403): reading the account
   (user_read) and reading its own instance (instance_read). Both are reads: nothing is changed by the proof.

The documented shape is tried first, then the method-nested one; a key that fails is deleted at once. Which shape
passed is recorded (ledger, run.json `autostop.key_shapes`, events), so the first real use tells which one works.
What the proof cannot show without stopping a machine is that the key CAN stop it: a watchdog whose stop is
refused records `failed` on its node, and `ddpctl status` warns about it (watchdog_state.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError
from launcher.places.vast.apikey import delete_keys
from launcher.places.vast.errors import VastError

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient

DOCUMENTED, METHOD_NESTED = "documented", "method_nested"
SHAPES = (DOCUMENTED, METHOD_NESTED)
MANAGE_PERMISSION = "api.instance.manage"  # the documented naming pattern ("api.instance.request_logs")
REFUSED = frozenset({401, 403})  # what Vast answers a scoped key lacking the permission (authentication.mdx)


@dataclass(frozen=True)
class StopKey:
    """A proven stop-only key: its id, the key itself (never shown) and the permission shape that passed."""

    key_id: int
    key: str = field(repr=False)
    shape: str


def stop_only_permissions(instance_id: int, shape: str = DOCUMENTED) -> dict[str, Any]:
    """A key that can stop this one instance and do nothing else, in the given permission shape."""
    constraints = {"id": {"eq": int(instance_id)}, "state": {"eq": "stopped"}}
    rule: dict[str, Any] = {"constraints": constraints}
    if shape == METHOD_NESTED:
        rule = {"PUT": rule}
    return {"api": {"instance_write": {MANAGE_PERMISSION: rule}}}


def make_stop_key(client: VastClient, name: str, instance_id: int, shapes: Sequence[str] = SHAPES,
                  on_rejected: Callable[[str, str, Any], None] | None = None) -> StopKey:
    """Create and prove a stop-only key for this instance, trying each shape in turn; a key that fails is deleted
    at once. Raises a one-line DdpctlError saying why each shape failed (no key of ours is left then)."""
    why: list[str] = []
    for shape in shapes:
        sent = stop_only_permissions(instance_id, shape)
        stored: Any = None
        try:
            key_id, key = client.create_api_key(name, sent)
        except VastError as exc:
            problem = f"refused: {_line(exc)}"
            if exc.status is None or exc.status >= 500:  # the answer may be lost while the key was made
                _delete_named(client, name)
        else:
            failed, stored = prove(client, key_id, key, sent, instance_id)
            if failed is None:
                return StopKey(key_id, key, shape)
            problem = failed
            left = delete_keys(client, [key_id])
            if left:
                raise DdpctlError(f"the API key {key_id} ({name}) failed its proof ({problem}) and could not be "
                                  "deleted: delete it on Vast.ai's Keys page now")
        if on_rejected is not None:
            on_rejected(shape, problem, stored)
        why.append(f"{shape.replace('_', '-')} shape: {problem}")
    raise DdpctlError("no stop-only API key passed its proof (" + "; ".join(why) + ")")


def prove(client: VastClient, key_id: int, key: str, sent: dict[str, Any],
          instance_id: int) -> tuple[str | None, Any]:
    """(None, stored) when the account stores exactly `sent` for this key and the key is refused outside its scope;
    else (what is wrong, the permissions as stored)."""
    try:
        listed = client.list_api_keys()
    except VastError as exc:
        return f"could not read it back: {_line(exc)}", None
    entry = next((k for k in listed if str(k.get("id")) == str(key_id)), None)
    if entry is None:
        return "it is not in the account's key list", None
    stored = stored_permissions(entry)
    if stored is None:
        return "the account's key list shows no permissions for it", None
    if stored != sent:
        return f"the account stores other permissions than asked: {json.dumps(stored, sort_keys=True)[:200]}", stored
    return refused_outside_scope(client, key, instance_id), stored


def stored_permissions(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A listed key's permissions as {"api": {...}} (listings may hold them as JSON text, or without "api")."""
    perms = entry.get("permissions", entry.get("rights"))
    if isinstance(perms, str):
        try:
            perms = json.loads(perms)
        except ValueError:
            return None
    if not isinstance(perms, dict):
        return None
    return perms if "api" in perms else {"api": perms}


def refused_outside_scope(client: VastClient, key: str, instance_id: int) -> str | None:
    """None when the new key is refused (401/403) reading the account and reading its own instance; else why not."""
    from launcher.places.vast.client import VastClient

    with VastClient(key, base_url=client.base_url, max_retries=3, backoff_base=client.backoff_base,
                    retry_budget_s=60.0, pace=client.pace) as probe:
        reads: list[tuple[str, Callable[[], object]]] = [
            ("reading the account", probe.show_user),
            (f"reading instance {instance_id}", lambda: probe.show_instance(instance_id))]
        for what, read in reads:
            try:
                read()
            except VastError as exc:
                if exc.status in REFUSED:
                    continue
                return f"{what} was not refused: {_line(exc)}"
            return f"{what} was not refused: it can do more than stop its instance"
    return None


def _delete_named(client: VastClient, name: str) -> None:
    """Delete any key of this name (a create whose answer was lost); best effort: the error that got us here is
    what the user is told."""
    with contextlib.suppress(VastError, KeyError, TypeError, ValueError):
        delete_keys(client, [int(k["id"]) for k in client.list_api_keys() if k.get("name") == name])


def _line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
