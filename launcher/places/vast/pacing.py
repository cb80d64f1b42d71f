"""Keeping to Vast.ai's rate limits before they bite: a minimum interval per endpoint, a request quota per window
for the endpoints that have one (search: about 10 a minute), and the pause a 429 asks for.

Sources (official, read; nothing copied):
- the OpenAPI files (infra/vast_api/*.yaml, from github.com/vast-ai/docs): `x-rate-limit` is a per-request
  `threshold` in seconds for most endpoints, and `requests: 10, per: minute` for search (search_offers.yaml);
- "Rate Limits and Errors", https://docs.vast.ai/api-reference/rate-limits-and-errors: limits apply per endpoint
  and identity (key and address); a 429 is plain text ("API requests too frequent: endpoint threshold=...") or
  JSON, and Vast does not send `Retry-After`: back off on your own. A `Retry-After` that a proxy in between might
  add is still waited for (harmless).
Limits count per key, not per process: shared_pacing.py keeps this state in a file every ddpctl process of the
user shares.
"""

from __future__ import annotations

import email.utils
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

Endpoint = tuple[str, str]

# Minimum seconds between two requests to one endpoint (their `x-rate-limit` thresholds; show_api_keys and
# show_user spell it `x-rateLimit`). Endpoints without one get DEFAULT_INTERVAL_S.
ENDPOINT_INTERVALS_S: dict[Endpoint, float] = {
    ("PUT", "/api/v0/asks/{id}/"): 4.5, ("DELETE", "/api/v0/instances/{id}/"): 3.0,
    ("GET", "/api/v0/instances/{id}/"): 2.0, ("GET", "/api/v1/instances/"): 1.0,
    ("PUT", "/api/v0/instances/{id}/"): 1.0, ("POST", "/api/v0/ssh/"): 1.0,
    ("POST", "/api/v0/auth/apikeys/"): 2.0, ("DELETE", "/api/v0/auth/apikeys/{id}/"): 2.0,
    ("GET", "/api/v0/auth/apikeys/"): 1.0, ("GET", "/api/v0/users/current/"): 2.0,
}
DEFAULT_INTERVAL_S = 0.5
SEARCH = ("POST", "/api/v0/bundles/")
# Endpoints limited to a number of requests per period: (most requests we send in any window, window seconds).
# Search allows 10 a minute; we keep one below it, so that a multi-node search (offers.MAX_CLUSTER_PAGES = 8
# pages) never waits, and a second search right after it waits for the window instead of being refused.
ENDPOINT_WINDOWS: dict[Endpoint, tuple[int, float]] = {SEARCH: (9, 60.0)}
_THRESHOLD = re.compile(r"threshold\s*=\s*([0-9]+(?:\.[0-9]+)?)")


def endpoint_of(method: str, path: str) -> Endpoint:
    """The endpoint a request goes to, as Vast's limiter counts it: ids in the path do not matter."""
    return method, re.sub(r"/\d+(?=/|$)", "/{id}", path)


def retry_after_s(headers: Mapping[str, str], now_unix: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date); None when absent or unreadable."""
    value = (headers.get("Retry-After") or "").strip()
    if not value:
        return None
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_unix is None else now_unix))


class Pacer:
    """Waits before each request so that it keeps to its endpoint's interval and window. `pace` scales every
    interval and window (0: none; tests run Vast's limits faster or not at all); `clock` and `sleep` are
    injectable so that a test can run minutes of pacing in no time. `store` keeps what the pacer remembers (when
    each endpoint was last called, the requests in each window): this process's memory by default, or a file
    that every ddpctl process of the user shares (shared_pacing.PacingFile; `clock` must then be wall time)."""

    def __init__(self, pace: float, clock: Callable[[], float], sleep: Callable[[float], None],
                 store: PacingStore | None = None) -> None:
        self.pace = pace
        self.clock, self.sleep = clock, sleep
        self.intervals = {ep: s * pace for ep, s in ENDPOINT_INTERVALS_S.items()}
        self.windows = {ep: (n, s * pace) for ep, (n, s) in ENDPOINT_WINDOWS.items()} if pace > 0 else {}
        self.store: PacingStore = store or MemoryStore()
        self._in_flight: dict[str, float] = {}  # the window stamp each endpoint's request in flight took
        self._lock = threading.Lock()

    def wait_turn(self, endpoint: Endpoint) -> None:
        """Sleep until `endpoint` may be called again (its interval since the last request, and its window), then
        take the turn: counted from now, in the store, before the lock is let go (so no other process takes it)."""
        while True:
            wait = self._take_turn(endpoint)
            if wait <= 0:
                return
            self.sleep(wait)

    def _take_turn(self, endpoint: Endpoint) -> float:
        interval = self.intervals.get(endpoint, DEFAULT_INTERVAL_S * self.pace)
        window = self.windows.get(endpoint)
        name = endpoint_name(endpoint)
        with self._lock, self.store.state() as state:
            now = self.clock()
            last = state.last.get(name)
            wait = 0.0 if last is None else last + interval - now
            sent = state.sent.setdefault(name, [])
            if window is not None:
                most, period = window
                sent[:] = [t for t in sent if t > now - period]
                if len(sent) >= most:  # the oldest request in the window must leave it first
                    wait = max(wait, sent[0] + period - now)
            if wait <= 0:
                state.last[name] = now
                if window is not None:
                    sent.append(now)
                    self._in_flight[name] = now
        return wait

    def answered(self, endpoint: Endpoint) -> None:
        """The answer came now: the next request to `endpoint` keeps its interval from here, and a windowed
        request counts from here too (Vast counted it when it arrived, at the latest now: counting from the send
        would let a slow request's slot free up early in Vast's eyes)."""
        name = endpoint_name(endpoint)
        with self._lock, self.store.state() as state:
            now = self.clock()
            state.last[name] = now
            taken = self._in_flight.pop(name, None)
            if taken is not None:
                sent = state.sent.setdefault(name, [])
                if taken in sent:
                    sent.remove(taken)
                sent.append(now)
                sent.sort()

    def refused(self, endpoint: Endpoint, body: str) -> float:
        """A 429: the least pause before the retry (Vast's rate-limit page says its 429s carry no Retry-After;
        one that does is waited for by the client). A plain-text threshold is kept to from now on; an endpoint
        with a window waits the whole window (every request the server counted has left it by then); others
        leave the pause to the caller's backoff (0)."""
        found = _THRESHOLD.search(body or "")
        if found:
            threshold = float(found.group(1))
            with self._lock:
                self.intervals[endpoint] = max(self.intervals.get(endpoint, 0.0), threshold)
            return threshold
        window = self.windows.get(endpoint)
        return window[1] if window is not None else 0.0


def endpoint_name(endpoint: Endpoint) -> str:
    """An endpoint as a store keeps it: "PUT /api/v0/asks/{id}/"."""
    return f"{endpoint[0]} {endpoint[1]}"


@dataclass
class PacingState:
    """What a pacer remembers: per endpoint, when it was last called, and the requests still in its window."""

    last: dict[str, float] = field(default_factory=dict)
    sent: dict[str, list[float]] = field(default_factory=dict)


class PacingStore(Protocol):
    def state(self) -> AbstractContextManager[PacingState]:
        """The state, held exclusively until the block ends (changes made in it are kept)."""
        ...


class MemoryStore:
    """One process's pacing state (the pacer's own lock guards it)."""

    def __init__(self) -> None:
        self._state = PacingState()

    @contextmanager
    def state(self) -> Iterator[PacingState]:
        yield self._state
