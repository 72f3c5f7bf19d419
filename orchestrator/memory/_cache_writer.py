"""The memory cache's script calls to Redis, sent in pipelines.

A store makes two script calls: the mark beside its statement (awaited before the answer)
and the write-back after the answer. Each call alone is a round trip whose client side costs
about as much CPU as the store's own Postgres statement (redis-py's command path: ~100 us on
a 2-core machine, measured); sent in one pipeline, several cost ~25 us each. So:

- `later()` queues a call that nobody waits for (a write-back) and flushes the queue after
  `LINGER_S` (or at `MAX_BATCH` calls) in one pipeline;
- `now()` sends its call at once, in one pipeline with whatever is queued ahead of it: the
  previous store's write-back rides with the next store's mark, one round trip for both.

Order: a call queued before `now()` is sent before it, in the same pipeline. Calls sent in
different pipelines may run in either order (two pooled connections); the scripts compare
versions and count stores in flight, so they hold in any order (see `_store.py`).
Failures: a pipeline that fails fails every call in it. `now()` raises (the caller treats
Redis as down); queued calls are dropped with a debug line, which the scripts tolerate (a
mark expires, a tombstone stays: readers read Postgres).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

log = logging.getLogger(__name__)

__all__ = ["CacheWriter"]

LINGER_S = 0.002  # a queued call waits at most this long for company
MAX_BATCH = 64

_Call = tuple[str, list[Any], list[Any]]  # (script sha1, keys, args)


class CacheWriter:
    def __init__(self, redis: aioredis.Redis, *scripts: str) -> None:
        self._redis = redis
        self._sources = {self.sha(s): s for s in scripts}
        self._queue: list[_Call] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()

    @staticmethod
    def sha(script: str) -> str:
        """The name Redis gives `script` (EVALSHA)."""
        return hashlib.sha1(script.encode()).hexdigest()

    async def now(self, sha: str, keys: list[Any], args: list[Any]) -> Any:
        """Run the script now (with the queued calls ahead of it); its result, or raise."""
        calls = self._take()
        calls.append((sha, keys, args))
        results = await self._send(calls)
        self._log_failures(calls[:-1], results[:-1])
        result = results[-1]
        if isinstance(result, BaseException):
            raise result
        return result

    def later(self, sha: str, keys: list[Any], args: list[Any]) -> None:
        """Queue the script for the next pipeline (at most LINGER_S from now)."""
        self._queue.append((sha, keys, args))
        if len(self._queue) >= MAX_BATCH:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LINGER_S, self._flush)

    async def settle(self) -> None:
        """Send what is queued and wait for every pipeline sent by `later` so far."""
        self._flush()
        while self._flushing:
            await asyncio.gather(*self._flushing, return_exceptions=True)

    def _take(self) -> list[_Call]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        calls, self._queue = self._queue, []
        return calls

    def _flush(self) -> None:
        calls = self._take()
        if not calls:
            return
        task = asyncio.get_running_loop().create_task(self._send_queued(calls))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _send_queued(self, calls: list[_Call]) -> None:
        try:
            results = await self._send(calls)
        except (RedisError, OSError) as exc:
            log.debug("memory cache: %d queued call(s) not sent: %r", len(calls), exc)
            return
        self._log_failures(calls, results)

    async def _send(self, calls: list[_Call]) -> list[Any]:
        """Every call in one pipeline; scripts Redis does not know (restarted, flushed) are
        loaded and their calls sent again, once."""
        results = await self._pipeline(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for sha in {calls[i][0] for i in missing}:
                await self._redis.script_load(self._sources[sha])
            again = await self._pipeline([calls[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    async def _pipeline(self, calls: list[_Call]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for sha, keys, args in calls:
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    @staticmethod
    def _log_failures(calls: list[_Call], results: list[Any]) -> None:
        failed = sum(isinstance(r, BaseException) for r in results)
        if failed:
            log.debug("memory cache: %d of %d queued call(s) failed", failed, len(calls))
