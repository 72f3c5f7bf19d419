"""Per-credential request budget: a fixed one-minute window counted in Redis."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from orchestrator.errors import RateLimited


class RateLimiter:
    def __init__(self, client: aioredis.Redis, per_minute: int, namespace: str = "rl") -> None:
        self._redis = client
        self._limit = per_minute
        self._ns = namespace

    @property
    def enabled(self) -> bool:
        return self._limit > 0

    async def hit(self, subject: str, now: float | None = None) -> int:
        """Count one request; raise RateLimited when over budget; return the remaining budget."""
        now = time.time() if now is None else now
        window = int(now // 60)
        key = f"{self._ns}:{subject}:{window}"
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, 120)
            count, _ = await pipe.execute()
        if count > self._limit:
            raise RateLimited(
                f"rate limit of {self._limit} requests per minute exceeded",
                retry_after=int(60 - now % 60) + 1,
            )
        return self._limit - int(count)
