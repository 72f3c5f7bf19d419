"""The interventions' channel outbox in Postgres (`intervention_posts`, migration 0027): per
intervention, its question (`ask`) and, once decided, the update of that question
(`outcome`). The interventions store writes the rows in its own transactions; the poster
(orchestrator/channels/_approvals.py) reads what is due here and records how sending went.

A post is sent only under its claim (kind `intervention_post`, key `<intervention>:<kind>`),
and each write checks that claim in its transaction (orchestrator/runtime/claims.py): at
most one sender at a time, and one that lost its claim writes nothing. An ask sent while a
decision dropped it (the press raced the post) queues its outcome here, so the question
still shows how it was decided."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from orchestrator.runtime.claims import ClaimStore, Fence

__all__ = ["POST_CLAIM", "Post", "PostStore"]

POST_CLAIM = "intervention_post"
# Qualified: inside the claims subquery a bare `kind` would be the claim's own column.
_KEY = "(p.intervention_id || ':' || p.kind)"
_SHARD = "substr(p.channel_id, 4)::bigint % $1 = $2"


@dataclass(frozen=True)
class Post:
    intervention_id: str
    kind: str  # ask | outcome
    channel_id: str
    state: str  # pending | sent | failed | dropped
    ref: dict[str, Any] | None
    attempts: int

    @property
    def key(self) -> str:
        return f"{self.intervention_id}:{self.kind}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _post(row: asyncpg.Record) -> Post:
    ref = row["ref"]
    return Post(
        intervention_id=row["intervention_id"],
        kind=row["kind"],
        channel_id=row["channel_id"],
        state=row["state"],
        ref=json.loads(ref) if isinstance(ref, str) else ref,
        attempts=row["attempts"],
    )


_COLUMNS = "intervention_id, kind, channel_id, state, ref, attempts"


class PostStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def due(self, shard: int, shards: int, me: str, limit: int = 50) -> list[Post]:
        """Pending posts of this shard's channels due now and not claimed by another poster;
        asks before outcomes (an outcome needs its ask's `ref`)."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM intervention_posts p WHERE p.state = 'pending'"
            f" AND p.next_attempt_at <= $3 AND {_SHARD} AND "
            + ClaimStore.unclaimed_sql(POST_CLAIM, _KEY, "$5")
            + " ORDER BY p.kind, p.next_attempt_at LIMIT $4",
            max(1, shards),
            shard,
            _now_ms(),
            limit,
            me,
        )
        return [_post(r) for r in rows]

    async def next_due(self, shard: int, shards: int) -> int | None:
        value: int | None = await self._pool.fetchval(
            "SELECT min(p.next_attempt_at) FROM intervention_posts p WHERE p.state = 'pending'"
            f" AND {_SHARD} AND " + ClaimStore.unclaimed_sql(POST_CLAIM, _KEY),
            max(1, shards),
            shard,
        )
        return value

    async def load(self, intervention_id: str, kind: str) -> Post | None:
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM intervention_posts WHERE intervention_id = $1 AND kind = $2",
            intervention_id,
            kind,
        )
        return _post(row) if row is not None else None

    async def sent(self, post: Post, ref: dict[str, Any] | None, *, fence: Fence) -> None:
        """Sent (with the platform's `ref` of an ask). An ask a decision dropped meanwhile
        queues its outcome. Releases the claim in the same commit."""
        async with self._pool.acquire() as conn, conn.transaction():
            await fence.check(conn)
            was = await conn.fetchval(
                "SELECT state FROM intervention_posts WHERE intervention_id = $1 AND kind = $2"
                " FOR UPDATE",
                post.intervention_id,
                post.kind,
            )
            await conn.execute(
                "UPDATE intervention_posts SET state = 'sent', ref = $3::jsonb, error = NULL,"
                " attempts = attempts + 1 WHERE intervention_id = $1 AND kind = $2"
                " AND state IN ('pending', 'dropped')",
                post.intervention_id,
                post.kind,
                None if ref is None else json.dumps(ref),
            )
            if was == "dropped" and post.kind == "ask":
                await conn.execute(
                    "INSERT INTO intervention_posts (intervention_id, kind, channel_id,"
                    " next_attempt_at) VALUES ($1, 'outcome', $2, $3) ON CONFLICT DO NOTHING",
                    post.intervention_id,
                    post.channel_id,
                    _now_ms(),
                )
            await fence.release_in(conn)

    async def _fenced(self, fence: Fence, sql: str, *args: Any) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await fence.check(conn)
            await conn.execute(sql, *args)
            await fence.release_in(conn)

    async def retry_later(self, post: Post, error: str, delay_s: float, *, fence: Fence) -> None:
        await self._fenced(
            fence,
            "UPDATE intervention_posts SET attempts = attempts + 1, error = $3,"
            " next_attempt_at = $4 WHERE intervention_id = $1 AND kind = $2",
            post.intervention_id,
            post.kind,
            error[:1000],
            _now_ms() + int(delay_s * 1000),
        )

    async def give_up(self, post: Post, error: str, *, fence: Fence) -> None:
        await self._fenced(
            fence,
            "UPDATE intervention_posts SET state = 'failed', attempts = attempts + 1,"
            " error = $3 WHERE intervention_id = $1 AND kind = $2 AND state = 'pending'",
            post.intervention_id,
            post.kind,
            error[:1000],
        )

    async def drop(self, post: Post, error: str, *, fence: Fence) -> None:
        """Nothing to send any more (its channel or intervention is gone)."""
        await self._fenced(
            fence,
            "UPDATE intervention_posts SET state = 'dropped', error = $3"
            " WHERE intervention_id = $1 AND kind = $2 AND state = 'pending'",
            post.intervention_id,
            post.kind,
            error[:1000],
        )
