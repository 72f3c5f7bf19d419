"""Failed authentications per client address, refused before any token lookup.

Garbage tokens each cost a hash and, on a cache miss, a database query. Each address has a
token bucket of failures: `max_failures` at once, refilled at `max_failures / window_s` per
second (20 per 10 s: a burst of 20, then one every 0.5 s). It is kept in Redis as one
"theoretical arrival time" per address (GCRA), so the bound holds across replicas and has no
window edges at which it resets; each replica lets at most one more failure through before
it learns the address is blocked. The check is a local lookup, so a good request pays
nothing; only failures touch Redis. When Redis is unreachable each replica counts on its own.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.errors import RateLimited

log = logging.getLogger(__name__)
MAX_TRACKED = 50_000

# One failure: the address's arrival time moves `interval` past max(itself, now); answers how
# far ahead of now it is (seconds). Redis's clock, so replicas on other hosts agree.
_RECORD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
tat = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return string.format('%.6f', tat - now)
"""


class FailedAuthThrottle:
    def __init__(
        self,
        client: aioredis.Redis | None,
        max_failures: int,
        window_s: float,
        namespace: str = "authfail",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = client
        self._max = max_failures
        self._window = window_s
        self._interval = window_s / max_failures if max_failures > 0 else 0.0
        self._ns = namespace
        self._clock = clock
        self._script = client.register_script(_RECORD) if client is not None else None
        self._blocked: dict[str, float] = {}  # address -> end of its block (clock)
        self._local: dict[str, float] = {}  # address -> arrival time, while Redis is away

    @property
    def enabled(self) -> bool:
        return self._max > 0

    def check(self, address: str | None) -> None:
        """Raise RateLimited while `address` is blocked."""
        if not self.enabled or address is None:
            return
        until = self._blocked.get(address)
        if until is None:
            return
        left = until - self._clock()
        if left <= 0:
            self._blocked.pop(address, None)
            return
        raise RateLimited(
            "too many failed authentications from this address", retry_after=math.ceil(left)
        )

    async def failed(self, address: str | None) -> None:
        """Record one failure of `address`; block it when its bucket is empty."""
        if not self.enabled or address is None:
            return
        ahead = await self._record(address)
        wait = ahead + self._interval - self._window
        if wait > 1e-6:
            # The next failure would overflow the bucket: blocked until it has room again.
            now = self._clock()
            if len(self._blocked) >= MAX_TRACKED:
                self._blocked = {a: u for a, u in self._blocked.items() if u > now}
            self._blocked[address] = now + wait

    async def _record(self, address: str) -> float:
        if self._script is not None:
            try:
                ahead = await self._script(keys=[f"{self._ns}:{address}"], args=[self._interval])
                return float(ahead)
            except (RedisError, OSError) as exc:
                log.debug("failed authentications counted locally, Redis unreachable: %r", exc)
        now = self._clock()
        if len(self._local) >= MAX_TRACKED:
            self._local = {a: t for a, t in self._local.items() if t > now}
            if len(self._local) >= MAX_TRACKED:
                self._local.clear()
        tat = max(self._local.get(address, now), now) + self._interval
        self._local[address] = tat
        return tat - now
