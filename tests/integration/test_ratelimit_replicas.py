"""The rate limit spent locally by several replicas over one real Redis (issue 17)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from orchestrator.auth import RateLimiter
from orchestrator.errors import RateLimited
from tests.conftest import make_supervisor

SYNC_S = 0.05


@contextlib.asynccontextmanager
async def replicas(redis_url: str, n: int, limit: int) -> AsyncIterator[list[RateLimiter]]:
    """`n` limiters, each with its own Redis client and its sync loop (as replicas run it)."""
    namespace = f"rl-{uuid.uuid4().hex[:8]}"
    clients = [aioredis.from_url(redis_url) for _ in range(n)]
    supervisor = make_supervisor("test-replicas")
    limiters = [RateLimiter(c, limit, namespace=namespace, sync_s=SYNC_S) for c in clients]
    for i, limiter in enumerate(limiters):
        supervisor.spawn(f"sync-{i}", limiter.run)
    try:
        yield limiters
    finally:
        await supervisor.aclose()
        for client in clients:
            await client.aclose()


async def test_replicas_hammered_together_admit_the_limit_within_10_percent(
    redis_url: str,
) -> None:
    limit, workers_per_replica = 300, 6
    now = time.time()  # one window for the whole test, whatever the clock does meanwhile
    admitted = 0
    last_admit = time.monotonic()

    async def worker(limiter: RateLimiter) -> None:
        nonlocal admitted, last_admit
        while True:
            try:
                await limiter.hit("carol", now)
                admitted += 1
                last_admit = time.monotonic()
                await asyncio.sleep(0)  # a local admission does not yield by itself
            except RateLimited:
                await asyncio.sleep(SYNC_S / 5)
            # Done once the budget is spent: nothing admitted anywhere for 10 syncs (by then
            # every lease a quiet replica held has gone back and been leased again).
            if time.monotonic() - last_admit > 10 * SYNC_S:
                return

    async with replicas(redis_url, 3, limit) as limiters:
        async with asyncio.timeout(20):
            await asyncio.gather(
                *(worker(lim) for lim in limiters for _ in range(workers_per_replica))
            )
    assert 0.9 * limit <= admitted <= 1.1 * limit, admitted
    assert admitted <= limit  # leases are counted in Redis: never more


async def test_an_admitted_request_costs_no_redis_round_trip(redis_url: str) -> None:
    """Within a lease, requests are counted in memory (the old limiter made one round trip
    per request)."""
    async with replicas(redis_url, 2, 600) as (one, _other):
        await one.hit("dave")  # leases a share
        probe = aioredis.from_url(redis_url)
        try:
            before = (await probe.info("stats"))["total_commands_processed"]
            for _ in range(100):
                await one.hit("dave")
            after = (await probe.info("stats"))["total_commands_processed"]
        finally:
            await probe.aclose()
    # INFO itself, and the two replicas' syncs meanwhile (4 commands each), at most.
    assert after - before < 30, after - before


async def test_a_quiet_replica_gives_its_lease_back(redis_url: str) -> None:
    """A replica that leased a share and went quiet gives it back at its next sync, so the
    credential's requests on another replica can use the whole budget."""
    limit = 100
    async with replicas(redis_url, 2, limit) as (first, second):
        await first.hit("erin")
        served, deadline = 1, time.monotonic() + 5
        while served < limit:
            try:
                await second.hit("erin")
                served += 1
            except RateLimited:
                assert time.monotonic() < deadline, f"only {served} of {limit} served"
                await asyncio.sleep(SYNC_S)
        try:
            await second.hit("erin")
            raise AssertionError("admitted over the limit")
        except RateLimited:
            pass
