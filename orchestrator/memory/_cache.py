"""The memory entries' Redis cache: copies read from Postgres, dropped after every write.

Redis is never the only copy, and never written by a writer: only a reader that has just
read Postgres puts a copy there. The protocol is cache-aside with leases (as memcache's in
"Scaling Memcache at Facebook", NSDI 2013):

- Read: one script returns the key's copy, or, when the key holds nothing, sets a lease (a
  token of this read's own, for LEASE_MS) and returns it. The reader then reads Postgres,
  and fills the key only if it still holds its token (a second script). Anything else in
  the key (someone's lease, a poison) means: read Postgres, fill nothing.
- Write of one entry (store, delete, pin): beside its statement (the two round trips at
  once), a guard: one script sets the key's guard (`<key>#w`) for GUARD_MS and DELs the key
  (its copy, or a reader's lease). While the guard lives a read returns no copy and takes
  no lease: it reads Postgres and fills nothing. A statement that took GUARD_MS or longer
  (its commit may have come after the guard expired) is followed by a DEL of the key
  before the write answers.
- A write whose statement raised may still commit (a connection lost after the server had
  the statement): its key is poisoned (no lease, hence no fill, for POISON_MS, past the
  statement timeout). A write of several rows (clear, share, decay) learns its keys
  only from its statement: it poisons them inside its transaction, before the COMMIT, and
  drops them once committed.
- Redis failing: a read goes to Postgres. A DEL that fails is owed: retried in the
  background (the owner's supervisor's task `memory-cache-dels`, with the process's
  `Backoff`) until it lands, or until any copy it was meant to drop has expired; while this
  process owes one it reads Postgres only.

Why it is coherent: a fill lands only if the key still holds the reader's lease, so no guard
or DEL of the key ran between the lease and the fill, and the lease is taken before the
Postgres read. A write's guard empties the key before the write answers and lives until
after the write committed (or, past GUARD_MS, the DEL after the commit empties it again),
and no lease is taken while it lives. So a copy that is there once a write has answered
was read from Postgres after that write had committed, or it is gone. From a write's answer
on, every read on every replica returns that write or a newer one. (The guard runs beside
the statement rather than a DEL after it, so a write costs one round trip, not two in a
row; the price is that a key written in the last GUARD_MS is read from Postgres.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator._json import dumps, loads
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait

log = logging.getLogger(__name__)

__all__ = ["CACHE_TTL_S", "MemoryCache"]

CACHE_TTL_S = 300  # a copy's lifetime (shorter for an entry that expires sooner)
LEASE_MS = 2_000  # a reader's Postgres read longer than this fills nothing
POISON_MS = 60_000  # longer than a statement may run (command_timeout, 30 s)
GUARD_MS = 1_000  # longer than a write's statement usually runs (else a DEL follows it)
GUARD_SUFFIX = "#w"  # the key of a key's guard
OWED_FOR_S = CACHE_TTL_S + LEASE_MS / 1000
# An owed DEL is tried again after 0.5 s, doubling to 10 s while Redis stays away.
RETRY = Backoff(base=0.5, cap=10.0)
DEL_CHUNK = 500

# The copy, or a lease of this read's own when the key holds nothing and is not guarded.
_READ = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 'W' end
local cur = redis.call('GET', KEYS[1])
if cur then return cur end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""
# The copy, only while the key still holds the reader's lease.
_FILL = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""
# A write of one entry in flight: the guard set, the copy or lease gone.
_GUARD = """
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
redis.call('DEL', KEYS[1])
return 1
"""
_COPY = ord("{")  # a copy is a JSON object; a lease starts with "L", a poison is "X"


class MemoryCache:
    """One process's side of the protocol above, on `redis` (shared by the replicas). The
    owed DELs' retries run under `supervisor` (without one, or once it has closed: a task of
    this cache's own); `settle` ends them either way."""

    def __init__(self, redis: aioredis.Redis, supervisor: Supervisor | None = None) -> None:
        self._redis = redis
        self._supervisor = supervisor
        self._read = redis.register_script(_READ)
        self._fill = redis.register_script(_FILL)
        self._guard = redis.register_script(_GUARD)
        # key -> when its DEL last failed (monotonic): a copy it was to drop has expired
        # OWED_FOR_S later (filled before that write's commit + LEASE_MS, living CACHE_TTL_S).
        self._owed: dict[str, float] = {}
        self._retrying: asyncio.Future[None] | None = None

    @staticmethod
    def key(agent_id: str, owner: str | None, key: str) -> str:
        who = owner or ""
        return f"mem3:{len(agent_id)}:{agent_id}:{len(who)}:{who}:{key}"

    async def lookup(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the cached copy, None), or (None, a lease to fill the key with), or (None, None):
        read Postgres and fill nothing."""
        if self._owed:
            self._retry()
            return None, None
        token = "L" + os.urandom(8).hex()
        try:
            raw = await self._read(keys=[key, key + GUARD_SUFFIX], args=[token, LEASE_MS])
        except (RedisError, OSError):
            return None, None
        if isinstance(raw, str):
            raw = raw.encode()
        if raw and raw[0] == _COPY:
            return loads(raw), None
        return None, (token if raw == token.encode() else None)

    async def fill(self, key: str, lease: str, copy: dict[str, Any], ttl_s: int) -> None:
        """Put the copy read from Postgres, if the key still holds `lease`."""
        try:
            await self._fill(keys=[key], args=[lease, dumps(copy), ttl_s])
        except (RedisError, OSError):
            pass  # nothing cached: the next read reads Postgres

    async def guard(self, key: str) -> bool:
        """Beside a write's statement: the key guarded for GUARD_MS and emptied (see the
        module docstring). False if Redis could not be reached (the caller then drops the
        key after its statement)."""
        try:
            await self._guard(keys=[key, key + GUARD_SUFFIX], args=[GUARD_MS])
        except (RedisError, OSError):
            return False
        return True

    async def drop(self, *keys: str) -> None:
        """After a write has committed: the keys' copies and leases gone. On a Redis error
        the DEL is owed (see the module docstring); it never raises."""
        if not keys:
            return
        try:
            for start in range(0, len(keys), DEL_CHUNK):
                await self._redis.delete(*keys[start : start + DEL_CHUNK])
        except (RedisError, OSError) as exc:
            log.warning("memory cache: %d copies not dropped, retrying (%r)", len(keys), exc)
            now = time.monotonic()
            for k in keys:
                self._owed[k] = now
            self._retry()

    async def poison(self, *keys: str) -> None:
        """Before a commit whose outcome may be unknown: no fill of `keys` for POISON_MS
        (a drop after the commit ends it sooner)."""
        try:
            for start in range(0, len(keys), DEL_CHUNK):
                pipe = self._redis.pipeline(transaction=False)
                for key in keys[start : start + DEL_CHUNK]:
                    pipe.set(key, "X", px=POISON_MS)
                await pipe.execute()
        except (RedisError, OSError):
            await self.drop(*keys)  # owed, retried; reads here skip the cache meanwhile

    async def settle(self) -> None:
        """One more try at the owed DELs, and no retries after (shutdown; tests)."""
        if self._retrying is not None:
            await cancel_and_wait([self._retrying])
            self._retrying = None
        if self._owed:
            await self._deliver()

    def _retry(self) -> None:
        if self._retrying is not None and not self._retrying.done():
            return
        if self._supervisor is not None:
            try:
                self._retrying = self._supervisor.spawn(
                    "memory-cache-dels", self._retry_owed, restart=False
                )
                return
            except (RuntimeError, ValueError):  # closed (stopping: settle tries once more)
                pass
        self._retrying = asyncio.get_running_loop().create_task(self._retry_owed())

    async def _retry_owed(self) -> None:
        failures = 0
        while self._owed:
            await asyncio.sleep(RETRY.delay(failures + 1))
            failures = 0 if await self._deliver() else failures + 1

    async def _deliver(self) -> bool:
        """DEL what is owed; True if it went through."""
        expired = time.monotonic() - OWED_FOR_S
        owed = {k: t for k, t in self._owed.items() if t > expired}
        try:
            keys = list(owed)
            for start in range(0, len(keys), DEL_CHUNK):
                await self._redis.delete(*keys[start : start + DEL_CHUNK])
            delivered = True
        except (RedisError, OSError):
            delivered = False
        # A key owed again meanwhile (a write whose DEL failed while this one was on its
        # way, and may have committed after it ran) stays owed.
        self._owed = {
            k: t
            for k, t in self._owed.items()
            if t > expired and not (delivered and owed.get(k) == t)
        }
        return delivered
