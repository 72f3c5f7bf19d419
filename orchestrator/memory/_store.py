"""Memory entries: durable in Postgres, hot reads cached in Redis (TTL-aware, never the only
copy: every write goes to Postgres first and drops the cached copy).

Ownership (SPEC part 5 rule 6): an entry carries its writer's `user_uuid`; non-admins see
their own entries and ownerless ones; admins see all. Reading, deleting and pinning someone
else's entry is a 404 (it is not theirs to know about); overwriting it is a 403.
Expired entries (`ttl` ms after their write) answer 410 until they are purged, and never
show in lists or searches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.auth import Principal
from orchestrator.errors import Forbidden, Gone, NotFound, ValidationFailed
from orchestrator.events import EventStore, NewEvent

log = logging.getLogger(__name__)

CACHE_TTL_S = 300
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


class MemoryStore:
    def __init__(
        self, pool: asyncpg.Pool, events: EventStore, redis: aioredis.Redis, dim: int
    ) -> None:
        self._pool = pool
        self._events = events
        self._redis = redis
        self._dim = dim

    # --- cache (best effort) --------------------------------------------------------------

    @staticmethod
    def _cache_key(agent_id: str, key: str) -> str:
        return f"mem:{len(agent_id)}:{agent_id}:{key}"

    async def _cached(self, agent_id: str, key: str) -> Entry | None:
        try:
            raw = await self._redis.get(self._cache_key(agent_id, key))
        except (RedisError, OSError):
            return None
        if raw is None:
            return None
        data = json.loads(raw)
        return Entry(agent_id=agent_id, key=key, **data)

    async def _cache(self, entry: Entry) -> None:
        ttl = CACHE_TTL_S
        if entry.expires_at is not None:
            ttl = min(ttl, max(1, (entry.expires_at - now_ms()) // 1000))
        data = {
            "value": entry.value,
            "user_uuid": entry.user_uuid,
            "created_at": entry.created_at,
            "expires_at": entry.expires_at,
            "pinned": entry.pinned,
        }
        with contextlib.suppress(RedisError, OSError):
            await self._redis.set(
                self._cache_key(entry.agent_id, entry.key), json.dumps(data), ex=ttl
            )

    async def _forget_cached(self, agent_id: str, *keys: str) -> None:
        if keys:
            with contextlib.suppress(RedisError, OSError):
                await self._redis.delete(*(self._cache_key(agent_id, k) for k in keys))

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
        async with self._events.transaction() as tx:
            owner = await tx.conn.fetchval(
                "SELECT user_uuid FROM memory_entries WHERE agent_id = $1 AND key = $2 FOR UPDATE",
                agent_id,
                key,
            )
            if owner is not None and owner != principal.user_uuid and not principal.is_admin:
                raise Forbidden(f"memory key {key!r} belongs to another user")
            row = await tx.conn.fetchrow(
                "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at,"
                " updated_at, expires_at, accessed_at, embedding_raw)"
                " VALUES ($1, $2, $3, $4, $5, $5, $6, $5, $7)"
                " ON CONFLICT (agent_id, key) DO UPDATE SET value = EXCLUDED.value,"
                " updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at,"
                " embedding_raw = EXCLUDED.embedding_raw, importance = 1.0,"
                " user_uuid = coalesce(memory_entries.user_uuid, EXCLUDED.user_uuid)"
                " RETURNING created_at, user_uuid, pinned",
                agent_id,
                key,
                value,
                principal.user_uuid,
                ts,
                expires,
                embedding,
            )
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
            await tx.append(events)
        await self._forget_cached(agent_id, key)
        return Entry(
            agent_id, key, value, row["user_uuid"], row["created_at"], expires, row["pinned"]
        )

    # --- reads ------------------------------------------------------------------------------

    async def _load(self, agent_id: str, key: str) -> Entry | None:
        cached = await self._cached(agent_id, key)
        if cached is not None:
            return cached
        row = await self._pool.fetchrow(
            "SELECT value, user_uuid, created_at, expires_at, pinned FROM memory_entries"
            " WHERE agent_id = $1 AND key = $2",
            agent_id,
            key,
        )
        if row is None:
            return None
        entry = Entry(
            agent_id,
            key,
            row["value"],
            row["user_uuid"],
            row["created_at"],
            row["expires_at"],
            row["pinned"],
        )
        if not entry.expired(now_ms()):
            await self._cache(entry)
        return entry

    async def _mine(self, agent_id: str, key: str, principal: Principal) -> Entry:
        entry = await self._load(agent_id, key)
        if entry is None or not (
            principal.is_admin or entry.user_uuid in (None, principal.user_uuid)
        ):
            raise NotFound(f"memory key {key!r} not found in {agent_id!r}")
        return entry

    async def get(self, agent_id: str, key: str, principal: Principal) -> Entry:
        entry = await self._mine(agent_id, key, principal)
        ts = now_ms()
        if entry.expired(ts):
            raise Gone(f"memory key {key!r} expired")
        await self._pool.execute(
            "UPDATE memory_entries SET accessed_at = $3, access_count = access_count + 1"
            " WHERE agent_id = $1 AND key = $2",
            agent_id,
            key,
            ts,
        )
        self._events.enqueue(
            [NewEvent("memory.accessed", {"agent_id": agent_id, "key": key}, principal.user_uuid)]
        )
        return entry

    async def delete(self, agent_id: str, key: str, principal: Principal) -> None:
        entry = await self._mine(agent_id, key, principal)
        if entry.user_uuid not in (None, principal.user_uuid) and not principal.is_admin:
            raise Forbidden("only the owner deletes an entry")
        await self._pool.execute(
            "DELETE FROM memory_entries WHERE agent_id = $1 AND key = $2", agent_id, key
        )
        await self._forget_cached(agent_id, key)

    async def pin(self, agent_id: str, key: str, pinned: bool, principal: Principal) -> None:
        await self._mine(agent_id, key, principal)
        await self._pool.execute(
            "UPDATE memory_entries SET pinned = $3 WHERE agent_id = $1 AND key = $2",
            agent_id,
            key,
            pinned,
        )
        await self._forget_cached(agent_id, key)

    async def clear(self, agent_id: str, principal: Principal) -> int:
        """The caller's own entries in this namespace (an admin: every entry in it)."""
        where = "TRUE" if principal.is_admin else "user_uuid = $2"
        rows = await self._pool.fetch(
            f"DELETE FROM memory_entries WHERE agent_id = $1 AND {where} RETURNING key",
            agent_id,
            *([] if principal.is_admin else [principal.user_uuid]),
        )
        await self._forget_cached(agent_id, *(r["key"] for r in rows))
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
