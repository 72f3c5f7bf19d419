"""Failed authentications per client address, refused before any token lookup.

Garbage tokens each cost a hash and, on a cache miss, a database query. Failures are counted
in Redis per address and fixed window, so the bound holds across replicas (each replica lets
at most one more failure through before it learns the address is blocked); the check itself
is a local lookup, so a good request pays nothing. When Redis is unreachable each replica
counts on its own.
"""

from __future__ import annotations

import logging
import math
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.errors import RateLimited

log = logging.getLogger(__name__)
MAX_TRACKED = 50_000


class FailedAuthThrottle:
    def __init__(
        self,
        client: aioredis.Redis | None,
        max_failures: int,
        window_s: float,
        namespace: str = "authfail",
    ) -> None:
        self._redis = client
        self._max = max_failures
        self._window = window_s
        self._ns = namespace
        self._blocked: dict[str, float] = {}  # address -> wall-clock end of its block
        self._local: dict[tuple[str, int], int] = {}  # (address, window) -> failures

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
        left = until - time.time()
        if left <= 0:
            self._blocked.pop(address, None)
            return
        raise RateLimited(
            "too many failed authentications from this address", retry_after=math.ceil(left)
        )

    async def failed(self, address: str | None) -> None:
        if not self.enabled or address is None:
            return
        now = time.time()
        window = int(now // self._window)
        count = await self._count(address, window)
        if count >= self._max:
            if len(self._blocked) >= MAX_TRACKED:
                self._blocked = {a: u for a, u in self._blocked.items() if u > now}
            self._blocked[address] = (window + 1) * self._window

    async def _count(self, address: str, window: int) -> int:
        if self._redis is not None:
            key = f"{self._ns}:{address}:{window}"
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.incr(key)
                    pipe.expire(key, math.ceil(self._window) + 1)
                    count, _ = await pipe.execute()
                return int(count)
            except (RedisError, OSError) as exc:
                log.debug("failed-auth count kept locally, Redis unreachable: %r", exc)
        if len(self._local) >= MAX_TRACKED:
            self._local = {k: v for k, v in self._local.items() if k[1] >= window}
            if len(self._local) >= MAX_TRACKED:
                self._local.clear()
        self._local[(address, window)] = self._local.get((address, window), 0) + 1
        return self._local[(address, window)]
