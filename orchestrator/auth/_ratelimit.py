"""Per-credential request budget: a fixed one-minute window, counted in Redis, spent locally.

A replica leases part of a credential's remaining budget from Redis (one atomic script adds
the lease to the window's count) and spends it in memory: an admitted request costs a dict
lookup, not a round trip. Redis's count includes every replica's leases, so together they
never admit more than the limit in a window. A lease is the remaining budget divided by the
live replicas (each registers itself in a sorted set at every sync), so a credential's
traffic spread over the replicas leases in shrinking steps and runs the budget down to its
last request. What a replica leased and did not spend goes back at the next sync (every
`sync_s`) after the credential went quiet on it: the only way the limit under-admits is
tokens held by a replica that stopped getting the credential's requests, for up to `sync_s`
(or, if a replica dies holding a lease, for the rest of that minute).

Redis is a cache here, not a gate: when it is unreachable the limit is not enforced (fail
open, logged), so a cache outage does not take the API down; /health reports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.errors import RateLimited

log = logging.getLogger(__name__)

WINDOW_S = 60
KEY_TTL_S = 120
DEFAULT_SYNC_S = 0.2
# A replica that has not synced for this many periods no longer counts in the shares.
REPLICA_STALE_SYNCS = 10

# KEYS[1]: the window's count. ARGV: tokens given back, the limit, the replicas to share
# with (0: give back only), the key's TTL. Returns {tokens leased, the count after}.
_LEASE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0') - tonumber(ARGV[1])
if count < 0 then count = 0 end
local limit = tonumber(ARGV[2])
local replicas = tonumber(ARGV[3])
local lease = 0
if replicas > 0 and count < limit then
  lease = math.ceil((limit - count) / replicas)
end
count = count + lease
redis.call('SET', KEYS[1], count, 'EX', tonumber(ARGV[4]))
return {lease, count}
"""


@dataclass
class _Budget:
    """One credential's lease on this replica, for one window."""

    window: int
    tokens: int = 0  # leased, not yet spent
    count: int = 0  # the window's count in Redis at our last lease (every replica's leases)
    used: bool = False  # spent since the last sync
    denied_until: float = 0.0  # Redis had nothing left: refuse locally until then
    leasing: asyncio.Future[None] | None = field(default=None, repr=False)


class RateLimiter:
    def __init__(
        self,
        client: aioredis.Redis,
        per_minute: int,
        namespace: str = "rl",
        sync_s: float = DEFAULT_SYNC_S,
    ) -> None:
        self._redis = client
        self._limit = per_minute
        self._ns = namespace
        self._sync_s = sync_s
        self._id = uuid.uuid4().hex
        self._replicas = 1  # until the first sync has counted them
        self._budgets: dict[str, _Budget] = {}
        self._script: Any = client.register_script(_LEASE)
        self._last_warning = 0.0

    @property
    def enabled(self) -> bool:
        return self._limit > 0

    def _key(self, subject: str, window: int) -> str:
        return f"{self._ns}:{subject}:{window}"

    async def hit(self, subject: str, now: float | None = None) -> int:
        """Count one request; raise RateLimited when over budget; return the remaining budget
        as this replica knows it (-1 when it could not be counted)."""
        now = time.time() if now is None else now
        window = int(now // WINDOW_S)
        budget = self._budgets.get(subject)
        if budget is None or budget.window != window:
            budget = self._budgets[subject] = _Budget(window)
        while True:
            if budget.tokens > 0:
                budget.tokens -= 1
                budget.used = True
                return self._limit - budget.count + budget.tokens
            if budget.denied_until > time.monotonic():
                raise self._limited(now)
            if budget.leasing is not None:
                # Another request of this credential is leasing: share its answer.
                await asyncio.shield(budget.leasing)
                continue
            leasing = budget.leasing = asyncio.get_running_loop().create_future()
            try:
                leased = await self._lease(budget, subject, give_back=0, share=self._replicas)
            finally:
                leasing.set_result(None)
                budget.leasing = None
            if not leased:
                return -1  # Redis unreachable: fail open
            if budget.tokens == 0:
                # Nothing left in Redis; what other replicas give back shows at our next sync.
                budget.denied_until = time.monotonic() + self._sync_s
                raise self._limited(now)

    def refund(self, subject: str, now: float | None = None) -> None:
        """Give back one request that `hit` counted and that was not served after all (a
        duplicate, or refused by another limit): it returns to this replica's lease, spent
        next or given back to Redis at a sync. Within its window only."""
        now = time.time() if now is None else now
        budget = self._budgets.get(subject)
        if budget is not None and budget.window == int(now // WINDOW_S):
            budget.tokens += 1

    def _limited(self, now: float) -> RateLimited:
        return RateLimited(
            f"rate limit of {self._limit} requests per minute exceeded",
            retry_after=int(WINDOW_S - now % WINDOW_S) + 1,
        )

    async def _lease(self, budget: _Budget, subject: str, give_back: int, share: int) -> bool:
        try:
            lease, count = await self._script(
                keys=[self._key(subject, budget.window)],
                args=[give_back, self._limit, share, KEY_TTL_S],
            )
        except (RedisError, OSError) as exc:
            self._warn(exc)
            return False
        budget.tokens += int(lease)
        budget.count = int(count)
        return True

    def _warn(self, exc: BaseException) -> None:
        if time.monotonic() - self._last_warning > 10:
            self._last_warning = time.monotonic()
            log.warning("rate limit not enforced, Redis unreachable: %r", exc)

    async def run(self) -> None:
        """Sync every `sync_s`, forever (under the replica's Supervisor)."""
        while True:
            await asyncio.sleep(self._sync_s)
            await self.sync()

    async def sync(self) -> None:
        """Count the live replicas (so leases are shares), and give back what credentials
        that went quiet here since the last sync left unspent."""
        now = time.time()
        replicas_key = f"{self._ns}:replicas"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zadd(replicas_key, {self._id: now})
                stale = now - REPLICA_STALE_SYNCS * self._sync_s
                pipe.zremrangebyscore(replicas_key, "-inf", stale)
                pipe.zcard(replicas_key)
                pipe.expire(replicas_key, KEY_TTL_S)
                *_, replicas, _ = await pipe.execute()
            self._replicas = max(1, int(replicas))
        except (RedisError, OSError) as exc:
            self._warn(exc)
        current = int(now // WINDOW_S)
        quiet: list[tuple[str, _Budget, int]] = []
        for subject, budget in list(self._budgets.items()):
            if budget.leasing is not None:
                continue
            if budget.used and budget.window >= current - 1:
                budget.used = False  # still busy here: keep its lease
                continue
            # Quiet since the last sync: give back what it holds, and forget it.
            del self._budgets[subject]
            if budget.tokens > 0 and budget.window >= current - 1:
                quiet.append((subject, budget, budget.tokens))
                budget.tokens = 0
        if not quiet:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for subject, budget, give_back in quiet:
                    await self._script(
                        keys=[self._key(subject, budget.window)],
                        args=[give_back, self._limit, 0, KEY_TTL_S],
                        client=pipe,
                    )
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._warn(exc)  # those tokens stay counted: this window under-admits a little
