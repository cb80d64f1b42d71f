"""Keeping to Vast.ai's rate limits before they bite: a minimum interval per endpoint, a request quota per window
for the endpoints that have one (search: about 10 a minute), and the pause a 429 asks for.

Sources (official, read; nothing copied):
- the OpenAPI files (infra/vast_api/*.yaml, from github.com/vast-ai/docs): `x-rate-limit` is a per-request
  `threshold` in seconds for most endpoints, and `requests: 10, per: minute` for search (search_offers.yaml);
- "Rate Limits and Errors", https://docs.vast.ai/api-reference/rate-limits-and-errors: limits apply per endpoint
  and identity; a 429 is plain text ("API requests too frequent: endpoint threshold=...") or JSON; some 429s carry
  a `Retry-After` header (the daily search quota's points at the reset, hours away): when present wait at least
  that long, else back off on your own.
"""

from __future__ import annotations

import email.utils
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

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
    injectable so that a test can run minutes of pacing in no time."""

    def __init__(self, pace: float, clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
        self.pace = pace
        self.clock, self.sleep = clock, sleep
        self.intervals = {ep: s * pace for ep, s in ENDPOINT_INTERVALS_S.items()}
        self.windows = {ep: (n, s * pace) for ep, (n, s) in ENDPOINT_WINDOWS.items()} if pace > 0 else {}
        self._last: dict[Endpoint, float] = {}
        self._sent: dict[Endpoint, deque[float]] = {}
        self._lock = threading.Lock()

    def wait_turn(self, endpoint: Endpoint) -> None:
        """Sleep until `endpoint` may be called again (its interval since the last answer, and its window)."""
        while True:
            wait = self._wait_for(endpoint)
            if wait <= 0:
                return
            self.sleep(wait)

    def _wait_for(self, endpoint: Endpoint) -> float:
        interval = self.intervals.get(endpoint, DEFAULT_INTERVAL_S * self.pace)
        now = self.clock()
        with self._lock:
            last = self._last.get(endpoint)
            wait = 0.0 if last is None else last + interval - now
            window = self.windows.get(endpoint)
            if window is not None:
                most, period = window
                sent = self._sent.setdefault(endpoint, deque())
                while sent and sent[0] <= now - period:
                    sent.popleft()
                if len(sent) >= most:  # the oldest request in the window must leave it first
                    wait = max(wait, sent[0] + period - now)
        return wait

    def answered(self, endpoint: Endpoint) -> None:
        """Count a request as made now (interval from its answer; the window counts it whether refused or not)."""
        now = self.clock()
        with self._lock:
            self._last[endpoint] = now
            if endpoint in self.windows:
                self._sent.setdefault(endpoint, deque()).append(now)

    def refused(self, endpoint: Endpoint, body: str) -> float:
        """A 429 without Retry-After: the least pause before the retry. A plain-text threshold is kept to from
        now on; an endpoint with a window waits the whole window (every request the server counted has left it by
        then); others leave the pause to the caller's backoff (0)."""
        found = _THRESHOLD.search(body or "")
        if found:
            threshold = float(found.group(1))
            with self._lock:
                self.intervals[endpoint] = max(self.intervals.get(endpoint, 0.0), threshold)
            return threshold
        window = self.windows.get(endpoint)
        return window[1] if window is not None else 0.0
