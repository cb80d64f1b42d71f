"""A small typed client for the Vast.ai REST endpoints ddpctl uses (contract: infra/vast_api/*.yaml).

The API key travels only in the Authorization header: never in a URL, a message, a repr or a log line.
"""

from __future__ import annotations

import json as jsonlib
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests
import urllib3

from launcher.places.vast.errors import (
    VastAuthError,
    VastError,
    VastGone,
    VastNotFound,
    VastRateLimited,
    VastUnavailable,
)
from launcher.places.vast.pacing import DEFAULT_INTERVAL_S, ENDPOINT_INTERVALS_S, Pacer, endpoint_of, retry_after_s
from launcher.places.vast.shared_pacing import PacingFile, pacing_file

log = logging.getLogger(__name__)

DEFAULT_URL = "https://console.vast.ai"
URL_ENV = "DDPCTL_VAST_URL"
# Gateway errors usually clear within a second: Vast's own client (vast-cli, vastai/api/client.py,
# https://github.com/vast-ai/vast-cli) makes 3 tries, pausing 0.15 s and then 1.5 times longer. ddpctl does the
# same for requests that may be repeated; never for a create (a 5xx might have rented: provision checks by label).
GATEWAY_STATUSES = frozenset({502, 503, 504})
GATEWAY_TRIES = 3
GATEWAY_PAUSE_S = 0.15

__all__ = ["VastClient", "endpoint_of", "ENDPOINT_INTERVALS_S", "DEFAULT_INTERVAL_S", "DEFAULT_URL", "URL_ENV"]


class _Secret:
    """Holds the key so that repr(), str(), vars() and tracebacks with locals show only `***`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "_Secret(***)"

    __str__ = __repr__


class VastClient:
    """Calls the Vast.ai API with retries (exponential backoff with jitter, bounded in count and time).

    `backoff_base` seconds is the first pause; each retry doubles it up to `backoff_max`. A 429 (Vast sends no
    Retry-After; one a proxy adds is waited for, or fails at once, in one line, when past the retry budget) pauses
    at least as long as pacing.Pacer.refused says; gateway errors
    (502/503/504) get vast-cli's 3 quick tries. `clock` (monotonic seconds) and `sleep` are injectable.
    """

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 6,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        retry_budget_s: float = 180.0,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        pace: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        shared_pacing: bool = False,
    ) -> None:
        if not api_key or any(c.isspace() for c in api_key):
            raise VastAuthError("the Vast.ai API key is empty or contains whitespace; set it again with "
                                "`ddpctl vast login`")
        self._key = _Secret(api_key)
        self.base_url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_budget_s = retry_budget_s
        self._session = session or requests.Session()
        self._sleep = sleep
        self._clock = clock
        # `pace` scales every endpoint's minimum interval and window (0: none; tests run Vast's limits faster)
        self.pace = pace
        # shared_pacing: keep to the limits together with every other ddpctl process using this key (their
        # stamps are compared across processes, so wall time); else this client's own memory
        self._pacer = (Pacer(pace, time.time, sleep, PacingFile(pacing_file(api_key, self.base_url)))
                       if shared_pacing and pace > 0 else Pacer(pace, clock, sleep))
        self.rate_limited = 0  # 429 answers received (each one retried after a pause)

    def __repr__(self) -> str:
        return f"VastClient(base_url={self.base_url!r})"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> VastClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- endpoints -------------------------------------------------------------------------------------

    def search_offers(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        """POST /api/v0/bundles/: offers matching `query` (see offers.build_query)."""
        body = self._request("POST", "/api/v0/bundles/", json=dict(query))
        offers = body.get("offers") if isinstance(body, dict) else None
        if isinstance(offers, dict):  # the documented example holds one object, not a list
            return [offers]
        return list(offers or [])

    def create_instance(self, offer_id: int, request: Mapping[str, Any]) -> int:
        """PUT /api/v0/asks/{id}/: rent the offer; returns the new instance id (`new_contract`)."""
        body = self._request("PUT", f"/api/v0/asks/{int(offer_id)}/", json=dict(request), idempotent=False)
        try:
            return int(body["new_contract"])
        except (KeyError, TypeError, ValueError):
            raise VastError(f"Vast.ai create of offer {offer_id} answered without new_contract") from None

    def show_instance(self, instance_id: int) -> dict[str, Any] | None:
        """GET /api/v0/instances/{id}/: the instance object, or None when it no longer exists."""
        try:
            body = self._request("GET", f"/api/v0/instances/{int(instance_id)}/")
        except VastNotFound:
            return None
        inst = body.get("instances") if isinstance(body, dict) else None
        return inst if isinstance(inst, dict) and inst else None

    def list_instances(self, *, label: str | None = None) -> list[dict[str, Any]]:
        """GET /api/v1/instances/ (every page): this account's instances, optionally those with `label`."""
        params: dict[str, Any] = {"limit": 25}
        if label is not None:
            params["select_filters"] = jsonlib.dumps({"label": {"eq": label}})
        found: list[dict[str, Any]] = []
        while True:
            body = self._request("GET", "/api/v1/instances/", params=params)
            found.extend(body.get("instances") or [])
            token = body.get("next_token")
            if not token:
                return found
            params["after_token"] = token

    def attach_ssh_key(self, instance_id: int, public_key: str) -> None:
        """POST /api/v0/instances/{id}/ssh/: let `public_key` log in to this instance. Not idempotent (a repeat adds
        the key again): after a gateway error or a lost answer the instance's keys are looked at first, and the
        attach is sent again only when the key is not among them (vast-cli's 3 tries in all)."""
        for attempt in range(GATEWAY_TRIES):
            try:
                self._request("POST", f"/api/v0/instances/{int(instance_id)}/ssh/", json={"ssh_key": public_key},
                              idempotent=False)
                return
            except VastUnavailable:
                if attempt == GATEWAY_TRIES - 1:
                    raise
            if _key_body(public_key) in {_key_body(k) for k in self.instance_ssh_keys(instance_id)}:
                return  # it was attached: only the answer was lost
            self._sleep(GATEWAY_PAUSE_S * 1.5**attempt)

    def instance_ssh_keys(self, instance_id: int) -> list[str]:
        """GET /api/v0/instances/{id}/ssh/: the public keys attached to an instance (`ssh_keys` is documented as
        a JSON string holding a list of key objects; a plain list is read too)."""
        body = self._request("GET", f"/api/v0/instances/{int(instance_id)}/ssh/")
        keys = body.get("ssh_keys") if isinstance(body, dict) else None
        if isinstance(keys, str):
            try:
                keys = jsonlib.loads(keys)
            except ValueError:
                keys = []
        return [str(k.get("public_key") or k.get("ssh_key") or "") if isinstance(k, dict) else str(k)
                for k in keys or []]

    def create_ssh_key(self, public_key: str) -> dict[str, Any]:
        """POST /api/v0/ssh/: add `public_key` to the account (may reach only instances created later). Never
        repeated after a gateway error (a repeat holds the key twice, and the account's keys cannot be listed
        through the documented API): provisioning attaches the key to each instance anyway."""
        body = self._request("POST", "/api/v0/ssh/", json={"ssh_key": public_key}, idempotent=False)
        return dict(body.get("key") or {}) if isinstance(body, dict) else {}

    def destroy_instance(self, instance_id: int) -> None:
        """DELETE /api/v0/instances/{id}/ (raises VastNotFound when it is already gone)."""
        self._request("DELETE", f"/api/v0/instances/{int(instance_id)}/")

    def manage_instance(self, instance_id: int, state: str) -> None:
        """PUT /api/v0/instances/{id}/: stop ("stopped") or start ("running") an instance."""
        self._request("PUT", f"/api/v0/instances/{int(instance_id)}/", json={"state": state})

    def create_api_key(self, name: str, permissions: Mapping[str, Any]) -> tuple[int, str]:
        """POST /api/v0/auth/apikeys/: a new key limited to `permissions`; returns (key id, key)."""
        body = self._request("POST", "/api/v0/auth/apikeys/", json={"name": name, "permissions": dict(permissions)},
                             idempotent=False)
        try:
            return int(body["id"]), str(body["key"])
        except (KeyError, TypeError, ValueError):
            raise VastError("Vast.ai create api-key answered without id and key") from None

    def delete_api_key(self, key_id: int) -> None:
        """DELETE /api/v0/auth/apikeys/{id}/ (raises VastNotFound when it is already gone)."""
        self._request("DELETE", f"/api/v0/auth/apikeys/{int(key_id)}/")

    def list_api_keys(self) -> list[dict[str, Any]]:
        """GET /api/v0/auth/apikeys/: the account's keys, their values redacted (null)."""
        body = self._request("GET", "/api/v0/auth/apikeys/")
        return [k for k in (body.get("apikeys") or []) if isinstance(k, dict)] if isinstance(body, dict) else []

    def show_user(self) -> dict[str, Any]:
        """GET /api/v0/users/current/: the account this key belongs to."""
        body = self._request("GET", "/api/v0/users/current/")
        return dict(body) if isinstance(body, dict) else {}

    def create_overlay(self, cluster_id: int, name: str) -> None:
        """POST /api/v0/overlay/: an overlay network on a physical cluster."""
        self._request("POST", "/api/v0/overlay/", json={"cluster_id": int(cluster_id), "name": name},
                      idempotent=False)

    def join_overlay(self, name: str, instance_id: int) -> None:
        """PUT /api/v0/overlay/: add an instance to the overlay network `name`."""
        self._request("PUT", "/api/v0/overlay/", json={"name": name, "instance_id": int(instance_id)})

    def list_overlays(self) -> list[dict[str, Any]]:
        """GET /api/v0/overlay/: overlays of this account (overlay_id, name, internal_subnet, instances)."""
        body = self._request("GET", "/api/v0/overlay/")
        return list(body) if isinstance(body, list) else list(body.get("overlays") or [])

    def delete_overlay(self, name: str) -> None:
        """DELETE /api/v0/overlay/ by name."""
        self._request("DELETE", "/api/v0/overlay/", json={"overlay_name": name})

    # -- transport -------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                 idempotent: bool = True) -> Any:
        """One API call with retries; returns the decoded JSON or raises a one-line VastError.

        A request that creates something (idempotent=False) is retried only when it surely did nothing:
        429 (refused before acting) or no connection at all; a 5xx or a dropped connection might have
        rented a machine, and renting it twice would bill twice. A 500 is not retried (vast-cli does not either:
        the same request fails the same way).
        """
        deadline = self._clock() + self.retry_budget_s
        what = f"Vast.ai {method} {path}"
        endpoint = endpoint_of(method, path)
        gateway_tries = 0
        for attempt in range(self.max_retries + 1):
            last_try = attempt == self.max_retries
            self._pacer.wait_turn(endpoint)
            try:
                resp = self._session.request(
                    method, self.base_url + path, json=json, params=params, timeout=self.timeout,
                    headers={"Authorization": f"Bearer {self._key.reveal()}", "Accept": "application/json"},
                )
            except requests.RequestException as exc:
                self._pacer.answered(endpoint)
                surely_unsent = _never_sent(exc)
                error: VastError = VastUnavailable(f"{what}: no answer from {self.base_url} "
                                                   f"({type(exc).__name__})")
                if (idempotent or surely_unsent) and not last_try and self._pause(attempt, deadline, error):
                    continue
                raise error from None  # requests' exception holds the prepared request (headers): drop it
            self._pacer.answered(endpoint)
            status = resp.status_code
            if status < 400:
                return self._decode(resp, what)
            if status == 429:
                self.rate_limited += 1
                asked = retry_after_s(resp.headers)
                error = self._error(resp, what, asked)
                floor = asked if asked is not None else self._pacer.refused(endpoint, resp.text)
                if not last_try and self._pause(attempt, deadline, error, floor):
                    continue
                raise error
            error = self._error(resp, what)
            if status in GATEWAY_STATUSES and idempotent:
                gateway_tries += 1
                if gateway_tries < GATEWAY_TRIES and not last_try:
                    self._sleep(GATEWAY_PAUSE_S * 1.5 ** (gateway_tries - 1))
                    continue
            raise error
        raise AssertionError("unreachable")  # the loop returns or raises

    def _pause(self, attempt: int, deadline: float, error: VastError, floor: float = 0.0) -> bool:
        """Sleep before the next try (at least `floor` s); False when that would pass the retry budget."""
        delay = max(floor, min(self.backoff_max, self.backoff_base * 2**attempt) * random.uniform(0.5, 1.0))
        if self._clock() + delay > deadline:
            return False
        log.info("%s; retrying in %.2fs", error, delay)
        self._sleep(delay)
        return True

    def _decode(self, resp: requests.Response, what: str) -> Any:
        if not resp.content:
            return {}
        try:
            body = resp.json()
        except ValueError:
            raise VastError(f"{what}: answer is not JSON (HTTP {resp.status_code})", resp.status_code) from None
        if isinstance(body, dict) and body.get("success") is False:
            reason = body.get("msg") or body.get("message") or body.get("error")
            raise VastError(f"{what} failed: {self._clean(reason)}", resp.status_code, body.get("error"))
        return body

    def _error(self, resp: requests.Response, what: str, retry_after: float | None = None) -> VastError:
        """Turn a documented error body into one VastError: {success, error, msg}, or only `msg` or `message`
        (docs.vast.ai/api-reference/rate-limits-and-errors), or {detail}, or plain text."""
        status = resp.status_code
        try:
            body = resp.json()
        except ValueError:  # Vast's limiter and proxies answer in plain text at times
            body = {"detail": resp.text} if resp.text and "<" not in resp.text[:1] else {}
        if not isinstance(body, dict):
            body = {"detail": body} if isinstance(body, str) else {}
        code = body.get("error")
        detail = self._clean(body.get("msg") or body.get("message") or body.get("detail") or code or resp.reason or "")
        text = f"{what}: HTTP {status}" + (f" {code}" if code else "") + (f": {detail}" if detail else "")
        if status == 401 or (status == 404 and "invalid user key" in detail.lower()):
            return VastAuthError(f"Vast.ai rejected the API key (HTTP {status}); set a valid one with "
                                 "VAST_API_KEY or `ddpctl vast login`", status, code)
        if status == 404:
            return VastNotFound(text, status, code)
        if status == 410:
            return VastGone(text, status, code)
        if status == 429:
            if retry_after is not None:
                return VastRateLimited(f"{text} (rate limited; Vast.ai asks to wait {retry_after:.0f} s before "
                                       "the next request: try again then)", status, code)
            return VastRateLimited(text + " (rate limited; try again in a minute)", status, code)
        if status >= 500:
            return VastUnavailable(text, status, code)
        return VastError(text, status, code)

    def _clean(self, text: Any) -> str:
        """A server message made safe to show: one line, bounded, and never echoing the key."""
        out = " ".join(str(text or "").split())[:300]
        return out.replace(self._key.reveal(), "***")


def _key_body(public_key: str) -> str:
    """A public key without its comment: "ssh-ed25519 AAAA..." (the comment may be dropped or changed)."""
    return " ".join(public_key.split()[:2])


def _never_sent(exc: requests.RequestException) -> bool:
    """Whether the request surely never reached the server: a connect timeout, or no connection could be made
    (urllib3's NewConnectionError, found by type in the exception's chain of reasons and causes)."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if not isinstance(exc, requests.ConnectionError):
        return False
    seen: list[object] = [exc, *exc.args]
    while seen:
        error = seen.pop()
        if isinstance(error, urllib3.exceptions.NewConnectionError):
            return True
        if isinstance(error, BaseException):
            seen += [getattr(error, "reason", None), error.__cause__, error.__context__]
    return False
