"""Memory entries: durable in Postgres, hot reads cached in Redis (TTL-aware, never the only
copy: every write goes to Postgres first and drops the cached copy).

Ownership (SPEC part 5 rule 6): an entry carries its writer's `user_uuid`, and keys are
unique per owner: two users' `config` in one namespace are two entries (migration 0011).
Non-admins see their own entries and ownerless ones (their own first); someone else's entry
is a 404 (not theirs to know about). Admins see all: a key held by several owners is a 409
naming them unless the admin picks one (`owner`).
Expired entries (`ttl` ms after their write) answer 410 until they are purged, and never
show in lists or searches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator._json import dumps
from orchestrator.auth import Principal
from orchestrator.errors import (
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    ServiceUnavailable,
    ValidationFailed,
)
from orchestrator.events import EventStore, NewEvent
from orchestrator.memory._cache_writer import CacheWriter
from orchestrator.memory._embed import Embedder, EmbedderUnavailable

log = logging.getLogger(__name__)

CACHE_TTL_S = 300
# Cached copies are "<version>|<json>" (an empty json: a tombstone, a miss), the version
# being the row's `updated_at`, which the store keeps strictly increasing per row. A copy
# is written only over an older one, so a reader that read the row before a store and
# caches it after the store's own write-back cannot put the older value back.
#
# A store does not wait for the new copy to be written: beside its statement (in
# parallel, not after it) it marks the key as being written (`_MARK`: a counter of
# stores in flight, and the cached copy turned into a tombstone at its own version), and
# it answers once both are done; the new copy is written after the answer (`_WRITE_BACK`).
# From the acknowledgement on, a reader finds either the tombstone (and reads Postgres)
# or the new copy. While stores are in flight, readers cache nothing (`_PUT_NEWER` with
# "r"); the write-back of a store that is not the last in flight only raises the
# tombstone's version, so an older store's late write-back cannot follow a newer one's.
# A write-back that never comes (the process died) leaves the counter to expire after
# PENDING_TTL_MS and the tombstone in place: readers read Postgres and cache again.
PENDING_TTL_MS = 30_000
_PUT_NEWER = """
if ARGV[4] == 'r' and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local cur = redis.call('GET', KEYS[1])
if cur then
  local bar = string.find(cur, '|', 1, true)
  if bar and tonumber(string.sub(cur, 1, bar - 1)) >= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2], 'EX', ARGV[3])
return 1
"""
_MARK = """
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur then
  local bar = string.find(cur, '|', 1, true)
  if bar and bar < string.len(cur) then
    redis.call('SET', KEYS[1], string.sub(cur, 1, bar), 'KEEPTTL')
  end
end
return 1
"""
_WRITE_BACK = """
local left = redis.call('DECR', KEYS[2])
if left <= 0 then redis.call('DEL', KEYS[2]) end
if ARGV[1] == '' then return 0 end
local body, ttl = ARGV[2], ARGV[3]
if left > 0 then body, ttl = '', ARGV[4] end
local cur = redis.call('GET', KEYS[1])
if cur then
  local bar = string.find(cur, '|', 1, true)
  if bar and tonumber(string.sub(cur, 1, bar - 1)) >= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. body, 'EX', ttl)
return 1
"""
_MARK_SHA, _WRITE_BACK_SHA = CacheWriter.sha(_MARK), CacheWriter.sha(_WRITE_BACK)
FILL_BATCH = 32
FILL_POLL_S = 1.0  # entries another process stored (agent workers) are found this fast
# After a wake-up the filler waits this long for more stores: one embedding call (and one
# SELECT, one UPDATE) for a burst instead of one per store, which costs the stores far less
# CPU; an entry is findable by vector this much later (by key and text at once).
FILL_LINGER_S = 0.2
# The filler yields to the stores: it fills once this process has stored nothing for
# FILL_QUIET_S, or once an entry has waited FILL_MAX_WAIT_S (then it keeps filling until it
# has caught up, so a steady stream of stores cannot starve it). An embedding and its HNSW
# insert cost more CPU than the store itself (on two cores, filling alongside held the
# stores to 0.31-0.41x a plain INSERT; issue 17).
FILL_QUIET_S = 0.02
FILL_MAX_WAIT_S = 2.0
FILL_MAX_ATTEMPTS = 5
FILL_BACKOFF_MAX_S = 30.0
PROBE_TEXT = "hello"
EMBED_MAX_CHARS = 8000  # longer values are embedded by their start (models cap their input)
FLOAT32_MAX = 3.4028234663852886e38
REFLECTION_PREFIX = "reflection:"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Entry:
    agent_id: str
    key: str
    value: str
    user_uuid: str | None
    created_at: int
    expires_at: int | None
    pinned: bool

    def expired(self, at: int) -> bool:
        return self.expires_at is not None and self.expires_at <= at

    def wire(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "created_at": self.created_at}


def _visible(principal: Principal, arg: int) -> str:
    # The parameter is referenced either way: asyncpg wants every argument used.
    if principal.is_admin:
        return f"(${arg}::text IS NOT NULL OR TRUE)"
    return f"(user_uuid IS NULL OR user_uuid = ${arg})"


PREPARE_LOCK = 947738


def _version(text: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (text or "0").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _vector(values: list[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


def _like(glob: str) -> str:
    """A glob (`*`, `?`) as a LIKE pattern (with `\\` escaping LIKE's own wildcards)."""
    out = []
    for ch in glob:
        if ch in "%_\\":
            out.append("\\" + ch)
        elif ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        else:
            out.append(ch)
    return "".join(out)


class MemoryStore:
    def __init__(
        self,
        pool: asyncpg.Pool,
        events: EventStore,
        redis: aioredis.Redis | None,
        dim: int,
        *,
        pgvector: bool = False,
        embedder: Embedder | None = None,
        auto_embed: bool | None = None,
        ef_search: int = 100,
    ) -> None:
        """`embedder` makes embeddings here (query texts, and `run_filler`); `auto_embed`
        marks entries stored without an embedding for a filler to embed (default: when
        this store has an embedder; agent workers set it without one)."""
        self._pool = pool
        self._events = events
        self._redis = redis
        self._dim = dim
        self.pgvector = pgvector
        self.embedder = embedder
        self._auto_embed = embedder is not None if auto_embed is None else auto_embed
        self._ef_search = int(ef_search)
        self._distrust_until = 0.0
        self._fill_wake = asyncio.Event()
        self._last_store = 0.0  # monotonic time of this process's last store to embed
        self._unfilled_since: float | None = None  # of the oldest such store not yet filled
        self._iterative = False
        self._put_newer = redis.register_script(_PUT_NEWER) if redis is not None else None
        # A store's mark and write-back go through one writer, which sends the write-back
        # of one store in the same pipeline as the next one's mark (`_cache_writer.py`).
        self._writer = CacheWriter(redis, _MARK, _WRITE_BACK) if redis is not None else None

    async def prepare(self) -> None:
        """With pgvector: the `embedding vector(dim)` column and its HNSW (cosine) index,
        created once under a lock (replicas start together)."""
        if not self.pgvector:
            return
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", PREPARE_LOCK)
            await conn.execute(
                "ALTER TABLE memory_entries ADD COLUMN IF NOT EXISTS embedding "
                f"vector({int(self._dim)})"
            )
            await conn.execute(
                "CREATE INDEX IF NOT EXISTS memory_entries_embedding ON memory_entries"
                " USING hnsw (embedding vector_cosine_ops)"
            )
            version = await conn.fetchval(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            )
        # hnsw.iterative_scan exists from pgvector 0.8; setting it on older ones is an error.
        self._iterative = _version(version) >= (0, 8)

    # --- cache (best effort) --------------------------------------------------------------

    @staticmethod
    def _cache_key(agent_id: str, owner: str | None, key: str) -> str:
        who = owner or ""
        return f"mem2:{len(agent_id)}:{agent_id}:{len(who)}:{who}:{key}"

    @staticmethod
    def _pending_key(cache_key: str) -> str:
        return "mem2w" + cache_key[4:]

    async def _cached(self, agent_id: str, owner: str | None, key: str) -> Entry | None:
        if self._redis is None or time.monotonic() < self._distrust_until:
            return None
        try:
            raw = await self._redis.get(self._cache_key(agent_id, owner, key))
        except (RedisError, OSError):
            return None
        if raw is None:
            return None
        _, _, body = (raw.decode() if isinstance(raw, bytes) else raw).partition("|")
        if not body:  # a tombstone: deleted since
            return None
        data = json.loads(body)
        return Entry(agent_id=agent_id, key=key, **data)

    @staticmethod
    def _body(entry: Entry) -> tuple[str, int]:
        """The cached copy's JSON and its TTL in seconds."""
        ttl = CACHE_TTL_S
        if entry.expires_at is not None:
            ttl = min(ttl, max(1, (entry.expires_at - now_ms()) // 1000))
        body = dumps(
            {
                "value": entry.value,
                "user_uuid": entry.user_uuid,
                "created_at": entry.created_at,
                "expires_at": entry.expires_at,
                "pinned": entry.pinned,
            }
        )
        return body.decode(), ttl

    async def _cache(
        self, entry: Entry, version: int, *, gone: bool = False, reader: bool = False
    ) -> None:
        """Put `entry` (or, `gone`, a tombstone) in the cache unless a copy of a version as
        new or newer is there (`reader`: a copy read from Postgres, and not while a store
        of the key is in flight). A write that fails may leave an older copy behind: this
        process then reads from Postgres until such a copy has expired."""
        if self._put_newer is None:
            return
        body, ttl = ("", CACHE_TTL_S) if gone else self._body(entry)
        key = self._cache_key(entry.agent_id, entry.user_uuid, entry.key)
        try:
            await self._put_newer(
                keys=[key, self._pending_key(key)], args=[version, body, ttl, "r" if reader else ""]
            )
        except (RedisError, OSError):
            self._distrust_until = time.monotonic() + CACHE_TTL_S

    async def _mark_writing(self, cache_key: str) -> bool:
        """The key's cached copy is about to be replaced (see `_MARK`); False if Redis failed
        (this process then distrusts the cache, as after any failed cache write)."""
        if self._writer is None:
            return True
        try:
            await self._writer.now(
                _MARK_SHA, [cache_key, self._pending_key(cache_key)], [PENDING_TTL_MS]
            )
        except (RedisError, OSError):
            self._distrust_until = time.monotonic() + CACHE_TTL_S
            return False
        return True

    def _after_store(self, cache_key: str, entry: Entry | None, version: int | None) -> None:
        """Write the new copy (or, `entry` None: only end the mark) after the answer: queued
        for the writer's next pipeline. If it fails, the mark expires by itself and the
        tombstone stays: readers use Postgres."""
        if self._writer is None:
            return
        body, ttl = self._body(entry) if entry is not None else ("", 0)
        self._writer.later(
            _WRITE_BACK_SHA,
            [cache_key, self._pending_key(cache_key)],
            ["" if version is None else version, body, ttl, PENDING_TTL_MS // 1000],
        )

    async def settle(self) -> None:
        """Send the cache write-backs queued so far and wait for them (tests, shutdown)."""
        if self._writer is not None:
            await self._writer.settle()

    async def _forget_cached(self, agent_id: str, *rows: tuple[str | None, str]) -> None:
        """Drop the cached copies of (owner, key) entries of `agent_id`."""
        if rows and self._redis is not None:
            try:
                await self._redis.delete(*(self._cache_key(agent_id, o, k) for o, k in rows))
            except (RedisError, OSError):
                # A copy we could not drop may still be in Redis once it is back: read from
                # Postgres until any such copy has expired.
                self._distrust_until = time.monotonic() + CACHE_TTL_S

    # --- writes -----------------------------------------------------------------------------

    async def store(
        self,
        agent_id: str,
        key: str,
        value: str,
        principal: Principal,
        *,
        ttl_ms: int | None = None,
        embedding: list[float] | None = None,
    ) -> Entry:
        if embedding is not None and len(embedding) != self._dim:
            raise ValidationFailed(
                f"embedding: {len(embedding)} dimensions, this service uses {self._dim}",
                extra={"fields": [{"field": "embedding"}]},
            )
        ts = now_ms()
        expires = ts + ttl_ms if ttl_ms else None
        # The caller's own entry: another owner's same-named entry is untouched.
        pending = embedding is None and self._auto_embed
        events = [
            NewEvent(
                "memory.stored",
                {"agent_id": agent_id, "key": key, "ttl_ms": ttl_ms, "bytes": len(value)},
                principal.user_uuid,
            )
        ]
        if key.startswith(REFLECTION_PREFIX):
            events.append(
                NewEvent(
                    "memory.reflected", {"agent_id": agent_id, "key": key}, principal.user_uuid
                )
            )
        cache_key = self._cache_key(agent_id, principal.user_uuid, key)
        # The cache mark runs beside the statement (see `_MARK`): both finish before "ok".
        marking = (
            asyncio.ensure_future(self._mark_writing(cache_key))
            if self._writer is not None
            else None
        )
        try:
            # The entry and its events in one statement, autocommitted: one round trip and
            # one commit, like a plain INSERT (BEGIN, INSERT, append, COMMIT were four).
            row, _ = await self._events.append_with(
                self._pool,
                _store_sql(self.pgvector),
                [agent_id, key, value, principal.user_uuid, ts, expires, embedding, pending],
                events,
            )
        except BaseException:
            if marking is not None:
                marked = await asyncio.shield(marking)
                if marked:
                    self._after_store(cache_key, None, None)
            raise
        assert row is not None
        if pending:
            self._last_store = time.monotonic()
            if self._unfilled_since is None:
                self._unfilled_since = self._last_store
            self._fill_wake.set()
        entry = Entry(
            agent_id, key, value, row["user_uuid"], row["created_at"], expires, row["pinned"]
        )
        if marking is not None:
            version = row["updated_at"]
            try:
                # Shielded: the entry is committed, so the cache must learn of it even if
                # this caller goes away now (an unmarked old copy would be served for up
                # to CACHE_TTL_S).
                marked = await asyncio.shield(marking)
            except asyncio.CancelledError:
                marking.add_done_callback(
                    lambda done: (
                        self._after_store(cache_key, entry, version)
                        if not done.cancelled() and done.result()
                        else None
                    )
                )
                raise
            if marked:
                self._after_store(cache_key, entry, version)
        return entry

    # --- embeddings (best effort, after the write) -----------------------------------------

    async def embed_query(self, text: str, user: str | None = None) -> list[float]:
        """The embedding of a search text for `user` (whose turn it waits for among the
        tenants on a local embedder); 503 when no embedder can make one."""
        if self.embedder is None:
            raise ServiceUnavailable(
                "text: no embedder is configured (embedder: none); give an embedding"
            )
        [vector] = await self._embed_checked([text[:EMBED_MAX_CHARS]], user=user)
        return vector

    async def fill_embeddings(self, batch: int = FILL_BATCH) -> int:
        """Embed up to `batch` pending entries, oldest first; how many were embedded.

        No transaction is held while the embedder works (a provider call can take long):
        the rows are read, embedded, and written back only where they are unchanged since
        (`updated_at`), so a store meanwhile wins. When a batch fails, its entries are tried
        one at a time: if some succeed, the embedder works and each failing entry is
        charged an attempt (given up after FILL_MAX_ATTEMPTS), so one bad entry never blocks
        the others; if none succeeds and a known-good text fails too, the embedder is down:
        EmbedderUnavailable, nothing is charged, and the filler backs off."""
        if self.embedder is None:
            return 0
        rows = await self._pool.fetch(
            "SELECT agent_id, owner, key, value, updated_at FROM memory_entries WHERE embed_pending"
            " ORDER BY updated_at LIMIT $1",
            batch,
        )
        if not rows:
            return 0
        texts = [r["value"][:EMBED_MAX_CHARS] for r in rows]
        try:
            vectors: list[list[float] | None] = list(await self._embed_checked(texts, behind=True))
        except EmbedderUnavailable as batch_error:
            vectors = [None] * len(texts)
            if len(texts) > 1:
                for i, text in enumerate(texts):
                    with contextlib.suppress(EmbedderUnavailable):
                        [vectors[i]] = await self._embed_checked([text], behind=True)
            if all(v is None for v in vectors):
                # Nothing worked: the embedder is down, unless a known-good text embeds.
                try:
                    await self._embed_checked([PROBE_TEXT], behind=True)
                except EmbedderUnavailable:
                    raise batch_error from None
        done = [(r, v) for r, v in zip(rows, vectors, strict=True) if v is not None]
        failed = [r for r, v in zip(rows, vectors, strict=True) if v is None]
        if failed:
            await self._pool.execute(
                "UPDATE memory_entries m SET embed_attempts = embed_attempts + 1,"
                " embed_pending = embed_attempts + 1 < $4"
                " FROM unnest($1::text[], $2::text[], $3::bigint[], $5::text[])"
                " AS f(agent_id, key, at, owner) WHERE m.agent_id = f.agent_id"
                " AND m.owner = f.owner AND m.key = f.key AND m.updated_at = f.at",
                [r["agent_id"] for r in failed],
                [r["key"] for r in failed],
                [r["updated_at"] for r in failed],
                FILL_MAX_ATTEMPTS,
                [r["owner"] for r in failed],
            )
            log.warning("memory embeddings: %d entries could not be embedded", len(failed))
        if done:
            vector_set = ", embedding = v.raw::vector" if self.pgvector else ""
            # The vectors go as one flat real[] in asyncpg's binary encoding, each row taking
            # its slice: formatting them as text cost the event loop ~5 ms a batch (issue 17:
            # the stores' CPU while the filler ran).
            await self._pool.execute(
                "UPDATE memory_entries m SET embedding_raw = v.raw, embed_pending = false"
                f"{vector_set} FROM (SELECT u.agent_id, u.key, u.at, u.owner,"
                " ($4::real[])[(u.i - 1) * $6 + 1 : u.i * $6] AS raw"
                " FROM unnest($1::text[], $2::text[], $3::bigint[], $5::text[])"
                " WITH ORDINALITY AS u(agent_id, key, at, owner, i)) AS v"
                " WHERE m.agent_id = v.agent_id AND m.owner = v.owner AND m.key = v.key"
                " AND m.updated_at = v.at AND m.embed_pending",
                [r["agent_id"] for r, _ in done],
                [r["key"] for r, _ in done],
                [r["updated_at"] for r, _ in done],
                [x for _, v in done for x in v],
                [r["owner"] for r, _ in done],
                self._dim,
            )
        return len(done)

    async def _embed_checked(
        self, texts: list[str], *, behind: bool = False, user: str | None = None
    ) -> list[list[float]]:
        """Embeddings of the right dimension and finite float32 values, or EmbedderUnavailable.
        `behind`: for the filler (the embedder may give its CPU to the stores first)."""
        assert self.embedder is not None
        if user is None:
            vectors = await self.embedder.embed(texts, behind=behind)
        else:  # only then: embedders made before `user` (tests' own) need not take it
            vectors = await self.embedder.embed(texts, behind=behind, user=user)
        if len(vectors) != len(texts):
            raise EmbedderUnavailable(f"{self.embedder.name}: {len(vectors)} for {len(texts)}")
        for vector in vectors:
            if len(vector) != self._dim:
                raise EmbedderUnavailable(
                    f"{self.embedder.name} makes {len(vector)}-dimension embeddings; this"
                    f" service uses {self._dim} (memory_embedding_dim)"
                )
            if not all(math.isfinite(x) and abs(x) <= FLOAT32_MAX for x in vector):
                raise EmbedderUnavailable(f"{self.embedder.name} returned a non-finite value")
        return vectors

    async def run_filler(self) -> None:
        """Embed pending entries until cancelled: within FILL_LINGER_S for this store's
        writes (in batches), within FILL_POLL_S for other processes', backing off while the
        embedder fails."""
        backoff = FILL_POLL_S
        while True:
            await self._until_quiet()
            # Cleared before the batch is read: a store from here on wakes the next round.
            self._fill_wake.clear()
            try:
                started = time.monotonic()
                filled = await self.fill_embeddings()
                if filled < FILL_BATCH:
                    # Caught up with what was stored before this batch was read; a store
                    # since is the oldest unfilled one now (counted from `started`).
                    self._unfilled_since = None if self._last_store <= started else started
                backoff = FILL_POLL_S
            except EmbedderUnavailable as exc:
                log.warning("memory embeddings: %s", exc.message)
                filled = 0
                backoff = min(FILL_BACKOFF_MAX_S, backoff * 2)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("memory embeddings: database trouble (%r)", exc)
                filled = 0
                backoff = min(FILL_BACKOFF_MAX_S, backoff * 2)
            if filled >= FILL_BATCH:
                continue  # a full batch: likely more waiting
            if not self._fill_wake.is_set():
                try:
                    await asyncio.wait_for(self._fill_wake.wait(), backoff)
                except TimeoutError:
                    continue
            await asyncio.sleep(FILL_LINGER_S)

    async def _until_quiet(self) -> None:
        """Wait while this process's stores keep coming (FILL_QUIET_S between them), but not
        past FILL_MAX_WAIT_S after the oldest unfilled one."""
        while True:
            now = time.monotonic()
            quiet_at = self._last_store + FILL_QUIET_S
            since = self._unfilled_since
            due_at = quiet_at if since is None else min(quiet_at, since + FILL_MAX_WAIT_S)
            if now >= due_at:
                return
            await asyncio.sleep(due_at - now)

    # --- reads ------------------------------------------------------------------------------

    async def _resolve(
        self, agent_id: str, key: str, principal: Principal, owner: str | None = None
    ) -> Entry:
        """The entry `principal` means by `key`: their own, else the ownerless one; for an
        admin, also the only other owner's (several: 409 naming them, pick with `owner`)."""
        if owner is not None and not principal.is_admin and owner != principal.user_uuid:
            raise Forbidden("only an admin names another owner's entry")
        first = owner if owner is not None else principal.user_uuid
        cached = await self._cached(agent_id, first, key)
        if cached is not None:
            return cached
        if owner is not None:
            owners: list[str] | None = [owner]
        else:
            owners = None if principal.is_admin else [principal.user_uuid, ""]
        rows = await self._pool.fetch(
            "SELECT value, user_uuid, created_at, expires_at, pinned, updated_at"
            " FROM memory_entries"
            " WHERE agent_id = $1 AND key = $2 AND ($3::text[] IS NULL OR owner = ANY($3))"
            " ORDER BY owner = $4 DESC, owner = '' DESC, owner LIMIT 51",
            agent_id,
            key,
            owners,
            principal.user_uuid,
        )
        if not rows:
            raise NotFound(f"memory key {key!r} not found in {agent_id!r}")
        top = rows[0]
        if len(rows) > 1 and top["user_uuid"] not in (None, principal.user_uuid):
            holders = [r["user_uuid"] for r in rows]
            raise Conflict(
                f"memory key {key!r} is held by several users: name one with user_uuid",
                extra={"owners": holders[:50]},
            )
        entry = Entry(
            agent_id,
            key,
            top["value"],
            top["user_uuid"],
            top["created_at"],
            top["expires_at"],
            top["pinned"],
        )
        if not entry.expired(now_ms()):
            await self._cache(entry, top["updated_at"], reader=True)
        return entry

    async def get(
        self, agent_id: str, key: str, principal: Principal, owner: str | None = None
    ) -> Entry:
        entry = await self._resolve(agent_id, key, principal, owner)
        ts = now_ms()
        if entry.expired(ts):
            raise Gone(f"memory key {key!r} expired")
        await self._pool.execute(
            "UPDATE memory_entries SET accessed_at = $3, access_count = access_count + 1"
            " WHERE agent_id = $1 AND key = $2 AND owner = $4",
            agent_id,
            key,
            ts,
            entry.user_uuid or "",
        )
        self._events.enqueue(
            [NewEvent("memory.accessed", {"agent_id": agent_id, "key": key}, principal.user_uuid)]
        )
        return entry

    async def delete(
        self, agent_id: str, key: str, principal: Principal, owner: str | None = None
    ) -> None:
        entry = await self._resolve(agent_id, key, principal, owner)
        if entry.user_uuid != principal.user_uuid and not principal.is_admin:
            raise Forbidden("only the owner deletes an entry")
        version = await self._pool.fetchval(
            "DELETE FROM memory_entries WHERE agent_id = $1 AND key = $2 AND owner = $3"
            " RETURNING updated_at",
            agent_id,
            key,
            entry.user_uuid or "",
        )
        if version is None:
            await self._forget_cached(agent_id, (entry.user_uuid, key))
        else:
            # A tombstone, not a DEL: a reader that read the row before the delete cannot
            # cache it again afterwards (newer than the row's own version, to replace it).
            await self._cache(entry, version + 1, gone=True)

    async def pin(
        self,
        agent_id: str,
        key: str,
        pinned: bool,
        principal: Principal,
        owner: str | None = None,
    ) -> None:
        entry = await self._resolve(agent_id, key, principal, owner)
        await self._pool.execute(
            "UPDATE memory_entries SET pinned = $3 WHERE agent_id = $1 AND key = $2 AND owner = $4",
            agent_id,
            key,
            pinned,
            entry.user_uuid or "",
        )
        await self._forget_cached(agent_id, (entry.user_uuid, key))

    async def clear(self, agent_id: str, principal: Principal) -> int:
        """The caller's own entries in this namespace (an admin: every entry in it)."""
        where = "TRUE" if principal.is_admin else "user_uuid = $2"
        rows = await self._pool.fetch(
            f"DELETE FROM memory_entries WHERE agent_id = $1 AND {where} RETURNING user_uuid, key",
            agent_id,
            *([] if principal.is_admin else [principal.user_uuid]),
        )
        await self._forget_cached(agent_id, *((r["user_uuid"], r["key"]) for r in rows))
        return len(rows)

    async def entries(
        self, agent_id: str, principal: Principal, limit: int, offset: int, prefix: str = ""
    ) -> list[Entry]:
        rows = await self._pool.fetch(
            "SELECT key, value, user_uuid, created_at, expires_at, pinned FROM memory_entries"
            f" WHERE agent_id = $1 AND {_visible(principal, 5)}"
            " AND (expires_at IS NULL OR expires_at > $2) AND key LIKE $6 || '%'"
            " ORDER BY created_at DESC, key LIMIT $3 OFFSET $4",
            agent_id,
            now_ms(),
            limit,
            offset,
            principal.user_uuid,
            prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_"),
        )
        return [_entry(agent_id, r) for r in rows]

    async def search(
        self, agent_id: str, query: str, principal: Principal, limit: int
    ) -> list[Entry]:
        """Full-text (English stemming), best rank first."""
        rows = await self._pool.fetch(
            "SELECT key, value, user_uuid, created_at, expires_at, pinned,"
            " ts_rank_cd(search, q) AS rank FROM memory_entries,"
            " websearch_to_tsquery('english', $2) AS q"
            f" WHERE agent_id = $1 AND search @@ q AND {_visible(principal, 5)}"
            " AND (expires_at IS NULL OR expires_at > $3)"
            " ORDER BY rank DESC, created_at DESC LIMIT $4",
            agent_id,
            query,
            now_ms(),
            limit,
            principal.user_uuid,
        )
        return [_entry(agent_id, r) for r in rows]

    async def vector_search(
        self,
        agent_id: str,
        embedding: list[float],
        principal: Principal,
        limit: int,
        threshold: float,
    ) -> list[tuple[Entry, float]]:
        """Cosine similarity (1 - distance), most similar first; entries without an
        embedding are left out."""
        if not self.pgvector:
            raise ServiceUnavailable("vector search needs pgvector, which is not available")
        if len(embedding) != self._dim:
            raise ValidationFailed(
                f"embedding: {len(embedding)} dimensions, this service uses {self._dim}",
                extra={"fields": [{"field": "embedding"}]},
            )
        async with self._pool.acquire() as conn, conn.transaction():
            # More candidates than pgvector's default 40 (recall), and iterative scans so a
            # namespace or owner filter still fills `limit`.
            await conn.execute(
                f"SET LOCAL hnsw.ef_search = {self._ef_search}"
                + ("; SET LOCAL hnsw.iterative_scan = relaxed_order" if self._iterative else "")
            )
            rows = await conn.fetch(
                "SELECT key, value, user_uuid, created_at, expires_at, pinned, similarity FROM ("
                " SELECT *, 1 - (embedding <=> $2::text::vector) AS similarity FROM memory_entries"
                f" WHERE agent_id = $1 AND embedding IS NOT NULL AND {_visible(principal, 6)}"
                " AND (expires_at IS NULL OR expires_at > $3)"
                " ORDER BY embedding <=> $2::text::vector LIMIT $4) AS nearest"
                " WHERE similarity >= $5 ORDER BY similarity DESC",
                agent_id,
                _vector(embedding),
                now_ms(),
                limit,
                threshold,
                principal.user_uuid,
            )
        return [(_entry(agent_id, r), float(r["similarity"])) for r in rows]

    async def decay(self, half_life_days: float, threshold: float) -> int:
        """Importance = 0.5^(days since last access / half_life_days) x (1 + 0.1 x accesses),
        at most 1; unpinned entries under `threshold` (and expired ones) are forgotten.
        Returns how many were forgotten."""
        ts = now_ms()
        day_ms = 86_400_000.0
        async with self._events.transaction() as tx:
            decayed = await tx.conn.fetch(
                # Recomputed from scratch (not compounded): age since the last access
                # halves it every half-life; each access adds 10 % (use keeps memories).
                "UPDATE memory_entries SET importance = least(1.0, power(0.5,"
                " greatest($1::bigint - accessed_at, 0)::float8 / ($2::float8 * $3::float8))"
                " * (1 + 0.1 * access_count)) WHERE NOT pinned"
                " RETURNING agent_id",
                ts,
                half_life_days,
                day_ms,
            )
            gone = await tx.conn.fetch(
                "DELETE FROM memory_entries WHERE NOT pinned AND (importance < $1"
                " OR (expires_at IS NOT NULL AND expires_at <= $2)) RETURNING agent_id, key,"
                " user_uuid",
                threshold,
                ts,
            )
            per_agent: dict[str, int] = {}
            for r in decayed:
                per_agent[r["agent_id"]] = per_agent.get(r["agent_id"], 0) + 1
            forgotten: dict[str, list[tuple[str | None, str]]] = {}
            for r in gone:
                forgotten.setdefault(r["agent_id"], []).append((r["user_uuid"], r["key"]))
            events = [
                NewEvent("memory.decayed", {"agent_id": a, "count": n})
                for a, n in per_agent.items()
            ] + [
                NewEvent(
                    "memory.forgotten",
                    {"agent_id": a, "keys": [k for _, k in keys[:100]], "count": len(keys)},
                )
                for a, keys in forgotten.items()
            ]
            if events:
                await tx.append(events)
        for agent, keys in forgotten.items():
            await self._forget_cached(agent, *keys)
        return len(gone)

    async def share(self, source: str, target: str, pattern: str) -> int:
        """Copy `source`'s entries whose key matches the glob into `target` (owners kept;
        a copy replaces a same-named entry whole, owner and embedding included). Returns how
        many were copied."""
        ts = now_ms()
        vector_col = ", embedding" if self.pgvector else ""
        rows = await self._pool.fetch(
            "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at, updated_at,"
            f" expires_at, pinned, importance, accessed_at, embedding_raw, embed_pending,"
            f" embed_attempts{vector_col})"
            " SELECT $2, key, value, user_uuid, $4, $4, expires_at, pinned, importance, $4,"
            f" embedding_raw, embed_pending, embed_attempts{vector_col} FROM memory_entries"
            " WHERE agent_id = $1 AND key LIKE $3 AND (expires_at IS NULL OR expires_at > $4)"
            # A copy replaces a same-named entry whole: value, owner, vector and its state.
            " ON CONFLICT (agent_id, owner, key) DO UPDATE SET value = EXCLUDED.value,"
            " updated_at = EXCLUDED.updated_at,"
            " expires_at = EXCLUDED.expires_at, pinned = EXCLUDED.pinned,"
            " importance = EXCLUDED.importance, embedding_raw = EXCLUDED.embedding_raw,"
            " embed_pending = EXCLUDED.embed_pending, embed_attempts = EXCLUDED.embed_attempts"
            + (", embedding = EXCLUDED.embedding" if self.pgvector else "")
            + " RETURNING user_uuid, key",
            source,
            target,
            _like(pattern),
            ts,
        )
        await self._forget_cached(target, *((r["user_uuid"], r["key"]) for r in rows))
        return len(rows)

    async def stats(self, pgvector: bool) -> dict[str, Any]:
        row = await self._pool.fetchrow(
            "SELECT count(*) AS n, count(DISTINCT agent_id) AS agents FROM memory_entries"
        )
        return {
            "total_entries": int(row["n"]),
            "total_agents": int(row["agents"]),
            "pg_enabled": True,
            "pgvector_enabled": pgvector,
        }


@functools.cache
def _store_sql(pgvector: bool) -> str:
    """A store's upsert (`MemoryStore.store`): one row version, the pgvector column (when
    there is one) written with the rest."""
    vcol, vval, vset = (
        (", embedding", ", $7::real[]::vector", " embedding = EXCLUDED.embedding,")
        if pgvector
        else ("", "", "")
    )
    return (
        "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at,"
        f" updated_at, expires_at, accessed_at, embedding_raw, embed_pending{vcol})"
        f" VALUES ($1, $2, $3, $4, $5, $5, $6, $5, $7, $8{vval})"
        " ON CONFLICT (agent_id, owner, key) DO UPDATE SET value = EXCLUDED.value,"
        # Strictly increasing per row: the version the cache compares (two stores in one
        # millisecond, or a clock behind, still make a newer version).
        " updated_at = greatest(EXCLUDED.updated_at, memory_entries.updated_at + 1),"
        " expires_at = EXCLUDED.expires_at,"
        f" embedding_raw = EXCLUDED.embedding_raw,{vset} importance = 1.0,"
        " embed_pending = EXCLUDED.embed_pending, embed_attempts = 0"
        " RETURNING created_at, user_uuid, pinned, updated_at"
    )


def _entry(agent_id: str, r: asyncpg.Record) -> Entry:
    return Entry(
        agent_id,
        r["key"],
        r["value"],
        r["user_uuid"],
        r["created_at"],
        r["expires_at"],
        r["pinned"],
    )
