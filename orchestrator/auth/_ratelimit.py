"""Per-credential request budget: a fixed one-minute window counted in Redis.

Redis is a cache here, not a gate: when it is unreachable the limit is not enforced (fail
open, logged), so a cache outage does not take the API down; /health reports it.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.errors import RateLimited

log = logging.getLogger(__name__)


class RateLimiter:
    def __init__(self, client: aioredis.Redis, per_minute: int, namespace: str = "rl") -> None:
        self._redis = client
        self._limit = per_minute
        self._ns = namespace
        self._last_warning = 0.0

    @property
    def enabled(self) -> bool:
        return self._limit > 0

    async def hit(self, subject: str, now: float | None = None) -> int:
        """Count one request; raise RateLimited when over budget; return the remaining budget
        (-1 when it could not be counted)."""
        now = time.time() if now is None else now
        window = int(now // 60)
        key = f"{self._ns}:{subject}:{window}"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.incr(key)
                pipe.expire(key, 120)
                count, _ = await pipe.execute()
        except (RedisError, OSError) as exc:
            if time.monotonic() - self._last_warning > 10:
                self._last_warning = time.monotonic()
                log.warning("rate limit not enforced, Redis unreachable: %r", exc)
            return -1
        if count > self._limit:
            raise RateLimited(
                f"rate limit of {self._limit} requests per minute exceeded",
                retry_after=int(60 - now % 60) + 1,
            )
        return self._limit - int(count)
