"""The stand-in's scoped API keys, as Vast.ai documents them (api-reference/permissions.mdx, authentication.mdx):
permissions {"api": {CATEGORY: {ENDPOINT: RULE}}}; an empty category grants every endpoint of it; a RULE narrows its
endpoint with {"constraints": {PARAM: {eq|lte|gte: VALUE}}}. Nobody here can call the real service, and a third-party
README says the working form nests the rule under the HTTP method ({"PUT": {"constraints": ...}}), so how the
server reads a rule is a switch, and so is what it does with a rule it does not understand: refuse the key (400
invalid_permissions) or drop the rule silently, leaving the whole category (the dangerous case ddpctl must catch).

Keys are listed (GET /api/v0/auth/apikeys/) with their values redacted to null, as that endpoint's yaml says; its
example shows no permissions field, so where a real listing puts them is not documented: the stand-in returns them
under `permissions`, the name the create answer uses. A scoped key refused answers 401 or 403 ("a scoped key that
lacks the required permission", authentication.mdx; the body is not documented). Not shipped."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

HTTP_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})
OPERATORS = frozenset({"eq", "lte", "gte"})
# Which category each operation the stand-in serves belongs to (permissions.mdx, "Endpoint Reference by Category").
CATEGORY_OF = {
    "search_offers": "misc", "overlay": "misc",
    "create_instance": "instance_write", "destroy_instance": "instance_write", "manage_instance": "instance_write",
    "attach_ssh": "instance_write",
    "show_instance": "instance_read", "show_instances": "instance_read", "show_instance_ssh_keys": "instance_read",
    "create_ssh_key": "user_write", "create_api_key": "user_write", "delete_api_key": "user_write",
    "show_api_keys": "user_read", "show_user": "user_read",
}


@dataclass
class KeySwitches:
    """How the stand-in treats scoped keys; tests flip these."""

    shape: str = "documented"  # how a rule is read: "documented" ({"constraints"}), "method_nested" ({"PUT": ...}),
    # or any other word: a form neither of those
    unknown_shape: str = "refuse"  # a rule in another shape: "refuse" (400) or "drop" (stored without that rule)
    enforce: bool = True  # False: the server ignores scopes (a scoped key acts as its owner)
    refusal_status: int = 403  # what a refused scoped key gets: 401 or 403 (both documented)


@dataclass
class ScopedKey:
    id: int
    key: str
    name: str
    permissions: dict[str, Any]  # as stored (after any rule the server dropped)
    deleted: bool = False
    sent: dict[str, Any] = field(default_factory=dict)  # as the request gave them


def _constraints_ok(constraints: Any) -> bool:
    return isinstance(constraints, dict) and all(
        isinstance(cond, dict) and cond and set(cond) <= OPERATORS for cond in constraints.values())


def understood(rule: Any, shape: str) -> bool:
    """Whether a server reading rules in `shape` understands this endpoint rule."""
    if not isinstance(rule, dict):
        return False
    if shape == "method_nested":
        return all(m in HTTP_METHODS and isinstance(r, dict) and set(r) <= {"constraints"}
                   and _constraints_ok(r.get("constraints", {})) for m, r in rule.items())
    if shape == "documented":
        return set(rule) <= {"constraints"} and _constraints_ok(rule.get("constraints", {}))
    return not rule  # a server reading some third form: only a bare endpoint is understood


def stored_permissions(perms: Any, switches: KeySwitches) -> dict[str, Any] | None:
    """What the server keeps of `perms`: None when it refuses them; a rule it does not understand is dropped (its
    category stays, now unnarrowed) when the switch says so."""
    if not isinstance(perms, dict) or not isinstance(perms.get("api"), dict):
        return None
    api: dict[str, Any] = {}
    for category, rules in perms["api"].items():
        if not isinstance(rules, dict):
            return None
        kept = {}
        for endpoint, rule in rules.items():
            if understood(rule, switches.shape):
                kept[endpoint] = rule
            elif switches.unknown_shape != "drop":
                return None
        api[category] = kept
    return {"api": api}


def _holds(constraints: dict[str, Any], params: dict[str, Any]) -> bool:
    for param, cond in constraints.items():
        value = params.get(param)
        for op, want in cond.items():
            ok = {"eq": value == want, "lte": value is not None and value <= want,
                  "gte": value is not None and value >= want}.get(op, False)
            if not ok:
                return False
    return True


def allows(key: ScopedKey, op_name: str, method: str, params: dict[str, Any], manage_permission: str,
           switches: KeySwitches) -> bool:
    """Whether the key's stored permissions let it make this request (manage instance is the one endpoint rule
    modelled, under the permission name `manage_permission`)."""
    if not switches.enforce:
        return True
    rules = key.permissions.get("api", {}).get(CATEGORY_OF.get(op_name, ""))
    if not isinstance(rules, dict):
        return False
    if not rules:
        return True  # the whole category
    rule = rules.get(manage_permission) if op_name == "manage_instance" else None
    if not isinstance(rule, dict):
        return False
    if switches.shape == "method_nested":
        rule = rule.get(method)
        if not isinstance(rule, dict):
            return False
    return _holds(rule.get("constraints") or {}, params)


class KeyStore:
    """The account's API keys: create, list (values redacted), delete, and who a bearer token is."""

    def __init__(self, first_id: int = 301) -> None:
        self.switches = KeySwitches()
        self.keys: dict[int, ScopedKey] = {}
        self._next = first_id

    def create(self, body: dict[str, Any]) -> tuple[int, Any]:
        stored = stored_permissions(body.get("permissions"), self.switches)
        if stored is None:
            return 400, {"success": False, "error": "invalid_permissions", "msg": "Invalid permission format"}
        key = ScopedKey(self._next, "vsk-" + secrets.token_hex(16), str(body.get("name") or ""), stored,
                        sent=body["permissions"])
        self._next += 1
        self.keys[key.id] = key
        return 200, {"id": key.id, "key": key.key, "permissions": stored}

    def listing(self) -> tuple[int, Any]:
        return 200, {"apikeys": [
            {"id": k.id, "user_id": 1, "key": None, "key_type": "api", "name": k.name, "team_id": None,
             "team_name": None, "team_owner": None, "permissions": k.permissions}
            for k in self.keys.values() if not k.deleted]}

    def delete(self, key_id: int) -> tuple[int, Any]:
        key = self.keys.get(key_id)
        if key is None or key.deleted:
            return 404, {"success": False, "error": "not_found", "msg": "API key not found"}
        key.deleted = True
        return 200, "Successfully Deleted API Key"

    def live(self) -> list[ScopedKey]:
        """Keys still in the account."""
        return [k for k in self.keys.values() if not k.deleted]

    def bearer(self, header: str | None) -> ScopedKey | None:
        """The live scoped key this Authorization header carries, if any."""
        token = (header or "").removeprefix("Bearer ")
        return next((k for k in self.keys.values() if k.key == token and not k.deleted), None)

    def refusal(self, key: ScopedKey, op_name: str, method: str, path_id: str | None, body: Any,
                manage_permission: str) -> tuple[int, Any] | None:
        """None when the key may make this request, else the answer Vast gives a key lacking the permission."""
        params = dict(body if isinstance(body, dict) else {},
                      id=int(path_id) if path_id and path_id.isdigit() else path_id)
        if allows(key, op_name, method, params, manage_permission, self.switches):
            return None
        if self.switches.refusal_status == 401:
            return 401, {"success": False, "error": "auth_error", "msg": "API key lacks the required permission"}
        return 403, {"success": False, "error": "forbidden", "msg": "API key lacks permission"}
