"""The memory cache's script calls in pipelines (orchestrator/memory/_cache_writer.py),
against the session's real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from orchestrator.memory import _cache_writer
from orchestrator.memory._cache_writer import CacheWriter

# Appends its argument to a list and answers the list's length: the order calls ran in.
RECORD = "return redis.call('RPUSH', KEYS[1], ARGV[1])"
FAILS = "return redis.error_reply('no such thing')"


@pytest.fixture
async def cache(clean_redis: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(clean_redis)
    yield client
    await client.aclose()


async def _ran(cache: aioredis.Redis) -> list[str]:
    return [v.decode() for v in await cache.lrange("ran", 0, -1)]


async def test_queued_calls_go_ahead_of_the_next_call_in_its_pipeline(
    cache: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cache_writer, "LINGER_S", 3600.0)  # only `now` sends them
    writer = CacheWriter(cache, RECORD)
    sha = CacheWriter.sha(RECORD)
    writer.later(sha, ["ran"], ["a"])
    writer.later(sha, ["ran"], ["b"])
    assert await _ran(cache) == []  # queued, not sent
    assert await writer.now(sha, ["ran"], ["c"]) == 3  # ran after both
    assert await _ran(cache) == ["a", "b", "c"]
    await writer.settle()
    assert await _ran(cache) == ["a", "b", "c"]  # nothing sent twice


async def test_a_queued_call_is_sent_within_the_linger_without_company(
    cache: aioredis.Redis,
) -> None:
    writer = CacheWriter(cache, RECORD)
    writer.later(CacheWriter.sha(RECORD), ["ran"], ["alone"])
    async with asyncio.timeout(10):
        while await _ran(cache) != ["alone"]:  # noqa: ASYNC110 - polling Redis; the timer sends it
            await asyncio.sleep(_cache_writer.LINGER_S)
    await writer.settle()


async def test_a_full_queue_is_sent_at_once(
    cache: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cache_writer, "LINGER_S", 3600.0)
    writer = CacheWriter(cache, RECORD)
    sha = CacheWriter.sha(RECORD)
    for i in range(_cache_writer.MAX_BATCH):
        writer.later(sha, ["ran"], [str(i)])
    await writer.settle()  # sends nothing itself: the queue was sent when it filled
    assert await _ran(cache) == [str(i) for i in range(_cache_writer.MAX_BATCH)]


async def test_scripts_redis_forgot_are_loaded_again(cache: aioredis.Redis) -> None:
    writer = CacheWriter(cache, RECORD)
    sha = CacheWriter.sha(RECORD)
    await writer.now(sha, ["ran"], ["first"])
    await cache.script_flush()  # Redis restarted, or flushed its scripts
    writer.later(sha, ["ran"], ["queued"])
    assert await writer.now(sha, ["ran"], ["again"]) == 3
    assert await _ran(cache) == ["first", "queued", "again"]


async def test_a_failing_call_raises_and_the_calls_beside_it_still_run(
    cache: aioredis.Redis,
) -> None:
    writer = CacheWriter(cache, RECORD, FAILS)
    writer.later(CacheWriter.sha(RECORD), ["ran"], ["beside"])
    with pytest.raises(ResponseError, match="no such thing"):
        await writer.now(CacheWriter.sha(FAILS), [], [])
    assert await _ran(cache) == ["beside"]


async def test_redis_down_fails_the_call_and_drops_what_was_queued(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    gone = aioredis.from_url(
        f"unix://{tmp_path_factory.mktemp('no-redis')}/redis.sock", socket_connect_timeout=1
    )
    writer = CacheWriter(gone, RECORD)
    writer.later(CacheWriter.sha(RECORD), ["ran"], ["lost"])
    with pytest.raises((RedisError, OSError)):
        await writer.now(CacheWriter.sha(RECORD), ["ran"], ["now"])
    writer.later(CacheWriter.sha(RECORD), ["ran"], ["lost too"])
    await writer.settle()  # a queued call that cannot be sent is dropped, not raised
    await gone.aclose()
