"""Memory entries: durable in Postgres, hot reads cached in Redis (never the only copy).

Ownership (SPEC part 5 rule 6): an entry carries its writer's `user_uuid`. A key is unique
within its agent namespace (SPEC part 2; `memory_key_scope = "agent"`): a store of a key
another user holds is a 403 (the partial unique index of migration 0029 decides, so two
users racing for a new key cannot both win; another user's expired entry gives the key up
to the next store). With `memory_key_scope = "owner"` keys are
unique per owner instead: two users' `config` in one namespace are two entries, the later
marked `per_owner` (outside that index), as are duplicates left from before 0029.
Non-admins see their own entries and ownerless ones (their own first); someone else's entry
is a 404 (not theirs to know about). Admins see all: a key held by several owners (only
`per_owner` entries make that possible) is a 409 naming them unless the admin picks one.
Expired entries (`ttl` ms after their write) answer 410 until they are purged, and never
show in lists or searches.

The cache (`_cache.py`): a read fills a copy only under a lease it took before reading
Postgres; every write drops the copies of the entries it changed after its statement and
before it answers. A write runs to its end (statement, then the drop) even if its caller
goes away, so a committed change is never left behind an older copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import redis.asyncio as aioredis

from orchestrator.auth import Principal
from orchestrator.errors import (
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    ServiceUnavailable,
    ValidationFailed,
)
from orchestrator.events import EventStore, EventTransaction, NewEvent
from orchestrator.memory._cache import CACHE_TTL_S, GUARD_MS, MemoryCache
from orchestrator.memory._embed import Embedder
from orchestrator.memory._filler import EmbeddingFiller
from orchestrator.memory._sql import like_pattern, share_sql, store_ctes
from orchestrator.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

_T = TypeVar("_T")
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
# Migration 0029's partial unique index: one entry per (agent_id, key) but `per_owner` ones.
AGENT_KEY_INDEX = "memory_entries_agent_key"


def _version(text: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (text or "0").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _vector(values: list[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


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
        supervisor: Supervisor | None = None,
        key_scope: str = "agent",
        admin_delete: bool = False,
    ) -> None:
        """`embedder` makes embeddings here (query texts, and `run_filler`); `auto_embed`
        marks entries stored without an embedding for a filler to embed (default: when
        this store has an embedder; agent workers set it without one). `supervisor`: the
        process's, which runs the cache's retries of owed DELs. `key_scope`: the
        `memory_key_scope` setting ("agent": a key is unique within the namespace; "owner":
        per owner). `admin_delete`: the `memory_admin_delete` setting (False, the spec: delete,
        clear, pin and unpin touch the caller's own entries only, ownerless ones admins only;
        True: admins change anyone's and clear a whole namespace)."""
        if key_scope not in ("agent", "owner"):
            raise ValueError(f"memory_key_scope: agent or owner, not {key_scope!r}")
        self._per_owner = key_scope == "owner"
        self._admin_delete = admin_delete
        self._pool = pool
        self._events = events
        self._dim = dim
        self.pgvector = pgvector
        self._auto_embed = embedder is not None if auto_embed is None else auto_embed
        self._ef_search = int(ef_search)
        self._iterative = False
        self._filler = EmbeddingFiller(pool, dim, pgvector, embedder)
        self._cache = MemoryCache(redis, supervisor) if redis is not None else None
        # Writes whose callers went away, still running to their end (`_to_the_end`).
        self._writes: set[asyncio.Task[Any]] = set()

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

    # --- cache -----------------------------------------------------------------------------

    @staticmethod
    def _copy(entry: Entry) -> tuple[dict[str, Any], int]:
        """The cached copy of `entry` and its TTL in seconds."""
        ttl = CACHE_TTL_S
        if entry.expires_at is not None:
            ttl = min(ttl, max(1, (entry.expires_at - now_ms()) // 1000))
        copy = {
            "value": entry.value,
            "user_uuid": entry.user_uuid,
            "created_at": entry.created_at,
            "expires_at": entry.expires_at,
            "pinned": entry.pinned,
        }
        return copy, ttl

    async def _to_the_end(self, write: Coroutine[Any, Any, _T]) -> _T:
        """Run `write` (a statement, then its cache drop) in a task of its own: if the caller
        is cancelled, the write still finishes, so no committed change is left with an older
        copy in the cache (and no statement is cut off before we know its outcome)."""
        task = asyncio.ensure_future(write)
        self._writes.add(task)
        task.add_done_callback(self._written)
        return await asyncio.shield(task)

    def _written(self, task: asyncio.Task[Any]) -> None:
        self._writes.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller, if gone, cannot

    async def _write_one(
        self, agent_id: str, owner: str | None, key: str, statement: Coroutine[Any, Any, _T]
    ) -> _T:
        """`statement` on one entry, its key guarded beside it (orchestrator/memory/_cache.py);
        dropped after it too when the guard may have expired before its commit, or could not
        be set. If the statement raised (it may still commit: a connection lost), the key
        is poisoned instead."""
        cache = self._cache
        if cache is None:
            return await statement
        cache_key = cache.key(agent_id, owner, key)

        async def guarded() -> _T:
            sent = time.monotonic()
            guard = asyncio.ensure_future(cache.guard(cache_key))
            try:
                done = await statement
            except BaseException:
                await guard
                await cache.poison(cache_key)
                raise
            late = (time.monotonic() - sent) * 1000 >= GUARD_MS
            if not await guard or late:
                await cache.drop(cache_key)
            return done

        return await self._to_the_end(guarded())

    async def _write_rows(
        self, write: Callable[[EventTransaction], Awaitable[list[asyncpg.Record]]]
    ) -> list[asyncpg.Record]:
        """`write(tx)`: statements in one transaction, returning the (`agent_id`,
        `user_uuid`, `key`) of the entries they changed. Those keys are poisoned before the
        COMMIT (whose outcome may be unknown: a connection lost after the server had it)
        and dropped once it has committed; the keys are not known after a failure, so they
        are marked while they are."""
        cache = self._cache

        async def run() -> list[asyncpg.Record]:
            async with self._events.transaction() as tx:
                rows = await write(tx)
                if cache is not None and rows:
                    await cache.poison(*self._keys(cache, rows))
            if cache is not None and rows:
                await cache.drop(*self._keys(cache, rows))
            return rows

        if cache is None:
            return await run()
        return await self._to_the_end(run())

    @staticmethod
    def _keys(cache: MemoryCache, rows: list[asyncpg.Record]) -> list[str]:
        return [cache.key(r["agent_id"], r["user_uuid"], r["key"]) for r in rows]

    async def settle(self) -> None:
        """Wait for the writes whose callers went away, and try the owed cache drops once
        more (shutdown, before Redis closes; tests)."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if self._cache is not None:
            await self._cache.settle()

    # --- embeddings (`_filler.py`) ----------------------------------------------------------

    @property
    def embedder(self) -> Embedder | None:
        return self._filler.embedder

    async def embed_query(self, text: str, user: str | None = None) -> list[float]:
        """The embedding of a search text for `user`; 503 when no embedder can make one."""
        return await self._filler.embed_query(text, user)

    async def fill_embeddings(self) -> int:
        """Embed a batch of pending entries; how many were embedded."""
        return await self._filler.fill_embeddings()

    async def run_filler(self) -> None:
        """Embed pending entries until cancelled."""
        await self._filler.run_filler()

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
        # The caller's own entry: another owner's same-named entry is never touched (a 403
        # under "agent" scope; a second entry under "owner" scope) unless it has expired:
        # under "agent" scope the same statement deletes it first (_sql.store_ctes), with no
        # event (the events of a statement are fixed before it runs; decay's purge of an
        # expired entry is the one that says `memory.forgotten`).
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
        # The entry and its events in one statement, autocommitted: one round trip and one
        # commit, like a plain INSERT (BEGIN, INSERT, append, COMMIT were four).
        args = [agent_id, key, value, principal.user_uuid, ts, expires, embedding, pending]
        args.append(self._per_owner)
        # Under "owner" scope a race with another owner's first store of the key is won by
        # one; the other, written again, sees that entry and marks its own `per_owner`.
        for attempt in range(2 if self._per_owner else 1):
            statement = self._events.write(
                list(store_ctes(self.pgvector)), args, events, returning="entry"
            )
            try:
                row, _ = await self._write_one(agent_id, principal.user_uuid, key, statement)
                break
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name != AGENT_KEY_INDEX:
                    raise
                if not self._per_owner:
                    raise Forbidden(
                        f"memory key {key!r} in {agent_id!r} belongs to another user"
                    ) from None
                if attempt:
                    raise
        assert row is not None
        if pending:
            self._filler.stored()
        return Entry(
            agent_id, key, value, row["user_uuid"], row["created_at"], expires, row["pinned"]
        )

    # --- reads ------------------------------------------------------------------------------

    async def _resolve(
        self, agent_id: str, key: str, principal: Principal, owner: str | None = None
    ) -> Entry:
        """The entry `principal` means by `key`: their own, else the ownerless one; for an
        admin, also the only other owner's (several: 409 naming them, pick with `owner`)."""
        if owner is not None and not principal.is_admin and owner != principal.user_uuid:
            raise Forbidden("only an admin names another owner's entry")
        first = owner if owner is not None else principal.user_uuid
        # Only the entry under `first`'s own key is cached (the one Postgres ranks first).
        lease = cache_key = None
        if self._cache is not None:
            cache_key = self._cache.key(agent_id, first, key)
            copy, lease = await self._cache.lookup(cache_key)
            if copy is not None:
                return Entry(agent_id=agent_id, key=key, **copy)
        if owner is not None:
            owners: list[str] | None = [owner]
        else:
            owners = None if principal.is_admin else [principal.user_uuid, ""]
        rows = await self._pool.fetch(
            "SELECT value, user_uuid, created_at, expires_at, pinned FROM memory_entries"
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
        mine = (entry.user_uuid or "") == (first or "")
        if lease is not None and mine and not entry.expired(now_ms()):
            assert self._cache is not None and cache_key is not None
            await self._cache.fill(cache_key, lease, *self._copy(entry))
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
        # Not awaited (the read does not wait for its audit event), but its failure is
        # taken and logged here, not as "Future exception was never retrieved".
        self._events.append(
            [NewEvent("memory.accessed", {"agent_id": agent_id, "key": key}, principal.user_uuid)]
        ).add_done_callback(_accessed_appended)
        return entry

    def _check_owner(self, entry: Entry, principal: Principal, verb: str) -> None:
        """Delete, pin and unpin (SPEC part 4: owner only): the caller's own entry; an
        ownerless one (from before entries had owners) admins only; another user's only
        with `memory_admin_delete` (403: admins see it; non-admins never got this far)."""
        if entry.user_uuid == principal.user_uuid:
            return
        if not principal.is_admin:
            raise Forbidden(f"only the owner {verb} an entry")
        if entry.user_uuid is not None and not self._admin_delete:
            raise Forbidden(
                f"only the owner {verb} an entry (an admin too with memory_admin_delete)"
            )

    async def delete(
        self, agent_id: str, key: str, principal: Principal, owner: str | None = None
    ) -> None:
        entry = await self._resolve(agent_id, key, principal, owner)
        self._check_owner(entry, principal, "deletes")

        async def delete() -> None:
            # memory.forgotten with the row it removed, in its transaction; none when a
            # concurrent delete took the row first.
            async with self._events.transaction() as tx:
                status = await tx.conn.execute(
                    "DELETE FROM memory_entries WHERE agent_id = $1 AND key = $2 AND owner = $3",
                    agent_id,
                    key,
                    entry.user_uuid or "",
                )
                if status != "DELETE 0":
                    await tx.append([_forgotten(agent_id, [key], "deleted", entry.user_uuid)])

        await self._write_one(agent_id, entry.user_uuid, key, delete())

    async def pin(
        self,
        agent_id: str,
        key: str,
        pinned: bool,
        principal: Principal,
        owner: str | None = None,
    ) -> None:
        entry = await self._resolve(agent_id, key, principal, owner)
        self._check_owner(entry, principal, "pins or unpins")
        await self._write_one(
            agent_id,
            entry.user_uuid,
            key,
            self._pool.execute(
                "UPDATE memory_entries SET pinned = $3"
                " WHERE agent_id = $1 AND key = $2 AND owner = $4",
                agent_id,
                key,
                pinned,
                entry.user_uuid or "",
            ),
        )

    async def clear(self, agent_id: str, principal: Principal) -> int:
        """The caller's own entries in this namespace; an admin's clear also takes the
        ownerless ones (with `memory_admin_delete`: every entry in it, anyone's)."""
        if principal.is_admin and self._admin_delete:
            where = "($2::text IS NOT NULL OR TRUE)"  # asyncpg wants every argument used
        elif principal.is_admin:
            where = "(user_uuid = $2 OR user_uuid IS NULL)"
        else:
            where = "user_uuid = $2"

        async def clear(tx: EventTransaction) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await tx.conn.fetch(
                f"DELETE FROM memory_entries WHERE agent_id = $1 AND {where}"
                " RETURNING agent_id, user_uuid, key",
                agent_id,
                principal.user_uuid,
            )
            # One memory.forgotten per owner whose entries went (each sees their own).
            by_owner: dict[str | None, list[str]] = {}
            for r in rows:
                by_owner.setdefault(r["user_uuid"], []).append(r["key"])
            if by_owner:
                await tx.append(
                    [_forgotten(agent_id, keys, "cleared", o) for o, keys in by_owner.items()]
                )
            return rows

        return len(await self._write_rows(clear))

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
        return len(await self._write_rows(lambda tx: self._decay(tx, half_life_days, threshold)))

    async def _decay(
        self, tx: EventTransaction, half_life_days: float, threshold: float
    ) -> list[asyncpg.Record]:
        """`decay`'s statements; the entries it forgot."""
        ts = now_ms()
        day_ms = 86_400_000.0
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
        gone: list[asyncpg.Record] = await tx.conn.fetch(
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
            NewEvent("memory.decayed", {"agent_id": a, "count": n}) for a, n in per_agent.items()
        ] + [_forgotten(a, [k for _, k in keys], "decayed") for a, keys in forgotten.items()]
        if events:
            await tx.append(events)
        return gone

    async def share(self, source: str, target: str, pattern: str) -> int:
        """Copy `source`'s entries whose key matches the glob into `target` (owners kept;
        a copy replaces a same-named entry whole, owner and embedding included: under
        "agent" scope whoever held the key in `target`, under "owner" scope the same
        owner's). Returns how many were copied."""
        ts = now_ms()
        evict, sql = share_sql(self.pgvector, self._per_owner)
        like = like_pattern(pattern)

        copied: list[asyncpg.Record] = []

        async def write(tx: EventTransaction) -> list[asyncpg.Record]:
            gone = [] if self._per_owner else await tx.conn.fetch(evict, source, target, like, ts)
            copied[:] = await tx.conn.fetch(sql, source, target, like, ts)
            return gone + copied

        await self._write_rows(write)
        return len(copied)

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


def _forgotten(agent_id: str, keys: list[str], reason: str, owner: str | None = None) -> NewEvent:
    """memory.forgotten: the keys (the first 100) and how many went, and why. Owned by the
    entries' owner (a decay's and an ownerless entry's: the system's, admins see it)."""
    data = {"agent_id": agent_id, "keys": keys[:100], "count": len(keys), "reason": reason}
    return NewEvent("memory.forgotten", data, owner)


def _accessed_appended(appended: asyncio.Future[Any]) -> None:
    if not appended.cancelled() and (failed := appended.exception()) is not None:
        log.warning("memory.accessed event not recorded (%r)", failed)


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
