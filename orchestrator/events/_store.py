"""The event store: appends (with the state change that caused them, in one transaction),
reads, pre- and post-commit hooks. There is deliberately no update or delete path; the
database rejects both too (a trigger)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg

from orchestrator.events._catalog import (
    InvalidEventData,
    UnknownEventType,
    aggregate_of,
    event_type,
    upcast,
    validate,
)
from orchestrator.events._model import Event, EventQuery, EventRejected, NewEvent, SeqConflict

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "orch_events"
# Appends take this transaction-scoped lock so that global positions commit in order: a
# reader that has seen position N can never later find a smaller one (no skipped events).
_APPEND_LOCK = 0x0E7E17
_COLUMNS = "position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid"

PreCommitHook = Callable[[NewEvent], Awaitable[NewEvent]]
PostCommitHook = Callable[[list[Event]], Awaitable[None]]


def row_to_event(row: asyncpg.Record) -> Event:
    """A stored row as an Event; an older version of its type is upcast to the current one."""
    data = json.loads(row["data"]) if isinstance(row["data"], str) else dict(row["data"])
    version = row["version"]
    try:
        current = event_type(row["type"]).version
    except UnknownEventType:  # a type retired from the catalog: shown as stored
        current = version
    if version < current:
        data, version = upcast(row["type"], version, data), current
    return Event(
        position=row["position"],
        id=str(row["id"]),
        type=row["type"],
        version=version,
        aggregate_id=row["aggregate_id"],
        seq=row["seq"],
        timestamp=row["timestamp"],
        data=data,
        user_uuid=row["user_uuid"],
    )


@dataclass
class EventTransaction:
    """An open transaction: change state with `conn`, record what happened with `append`.
    Post-commit hooks run once the transaction has committed."""

    store: EventStore
    conn: asyncpg.Connection
    appended: list[Event] = field(default_factory=list)

    async def append(
        self, events: Sequence[NewEvent], *, expected_seq: int | None = None
    ) -> list[Event]:
        committed = await self.store.append_in(self.conn, events, expected_seq=expected_seq)
        self.appended.extend(committed)
        return committed


class EventStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._pre: list[PreCommitHook] = []
        self._post: list[PostCommitHook] = []

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    def add_pre_commit_hook(self, hook: PreCommitHook) -> None:
        """Runs on each event before it is written; returns it (maybe enriched) or raises
        `EventRejected`, which aborts the whole append."""
        self._pre.append(hook)

    def add_post_commit_hook(self, hook: PostCommitHook) -> None:
        """Runs after commit with the committed events; a failure is logged, never undone."""
        self._post.append(hook)

    # --- writing -----------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[EventTransaction]:
        async with self._pool.acquire() as conn:
            tx = EventTransaction(self, conn)
            async with conn.transaction():
                yield tx
        await self._after_commit(tx.appended)

    async def append(
        self, events: Sequence[NewEvent], *, expected_seq: int | None = None
    ) -> list[Event]:
        """Append in a transaction of its own."""
        async with self.transaction() as tx:
            return await tx.append(events, expected_seq=expected_seq)

    async def append_in(
        self,
        conn: asyncpg.Connection,
        events: Sequence[NewEvent],
        *,
        expected_seq: int | None = None,
    ) -> list[Event]:
        """Append inside the caller's open transaction (which runs post-commit hooks)."""
        if not events:
            return []
        if not conn.is_in_transaction():
            raise RuntimeError("append_in needs an open transaction")
        prepared = [await self._prepare(e) for e in events]
        aggregates = {agg for _, agg, _, _ in prepared}
        if expected_seq is not None and len(aggregates) != 1:
            raise EventRejected("expected_seq needs all events to belong to one aggregate")
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _APPEND_LOCK)
        last = {
            r["aggregate_id"]: r["last"]
            for r in await conn.fetch(
                "SELECT aggregate_id, max(seq) AS last FROM events"
                " WHERE aggregate_id = ANY($1::text[]) GROUP BY aggregate_id",
                list(aggregates),
            )
        }
        if expected_seq is not None:
            (aggregate,) = aggregates
            actual = last.get(aggregate, 0)
            if actual != expected_seq:
                raise SeqConflict(
                    f"aggregate {aggregate!r} is at seq {actual}, not the expected {expected_seq}",
                    extra={
                        "aggregate_id": aggregate,
                        "expected_seq": expected_seq,
                        "actual_seq": actual,
                    },
                )
        now = int(time.time() * 1000)
        columns: dict[str, list[Any]] = {
            k: [] for k in ("id", "type", "version", "agg", "seq", "data", "user")
        }
        for new, aggregate, version, data in prepared:
            last[aggregate] = last.get(aggregate, 0) + 1
            columns["id"].append(uuid.uuid4())
            columns["type"].append(new.type)
            columns["version"].append(version)
            columns["agg"].append(aggregate)
            columns["seq"].append(last[aggregate])
            columns["data"].append(json.dumps(data))
            columns["user"].append(new.user_uuid)
        rows = await conn.fetch(
            f"""INSERT INTO events (id, type, version, aggregate_id, seq, timestamp, data,
                                    user_uuid)
                SELECT i, t, v, a, s, $7, d::jsonb, u
                FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::bigint[],
                            $6::text[], $8::text[]) AS x(i, t, v, a, s, d, u)
                RETURNING {_COLUMNS}""",
            columns["id"],
            columns["type"],
            columns["version"],
            columns["agg"],
            columns["seq"],
            columns["data"],
            now,
            columns["user"],
        )
        committed = sorted((row_to_event(r) for r in rows), key=lambda e: e.position)
        # Delivered at commit; the payload is only a hint (readers go by position).
        await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, str(committed[-1].position))
        return committed

    async def _prepare(self, new: NewEvent) -> tuple[NewEvent, str, int, dict[str, Any]]:
        for hook in self._pre:
            new = await hook(new)
        try:
            kind, data = validate(new.type, new.data)
            aggregate = aggregate_of(kind, data)
        except (UnknownEventType, InvalidEventData) as exc:
            raise EventRejected(str(exc)) from exc
        if new.aggregate_id is not None and new.aggregate_id != aggregate:
            raise EventRejected(
                f"{new.type}: aggregate_id {new.aggregate_id!r} does not match "
                f"{kind.aggregate_key}={aggregate!r}"
            )
        return replace(new, data=data), aggregate, kind.version, data

    async def _after_commit(self, events: list[Event]) -> None:
        if not events:
            return
        for hook in self._post:
            try:
                await hook(events)
            except Exception:
                log.exception("post-commit hook %r failed for %d event(s)", hook, len(events))

    # --- reading -----------------------------------------------------------------------

    async def read_after(self, position: int, limit: int = 500) -> list[Event]:
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE position > $1 ORDER BY position LIMIT $2",
            position,
            limit,
        )
        return [row_to_event(r) for r in rows]

    async def position_before(self, aggregate: str | None, from_seq: int) -> int | None:
        """Where a stream starting at `from_seq` resumes: the position just before the first
        event of `aggregate` with seq >= from_seq (for all aggregates, from_seq is a position).
        None when there is no such event yet: the stream starts live."""
        if aggregate is None:
            return max(0, from_seq - 1)
        first = await self._pool.fetchval(
            "SELECT min(position) FROM events WHERE aggregate_id = $1 AND seq >= $2",
            aggregate,
            from_seq,
        )
        return None if first is None else int(first) - 1

    async def head(self) -> int:
        """The last committed position (0 for an empty store)."""
        return int(await self._pool.fetchval("SELECT coalesce(max(position), 0) FROM events"))

    async def query(self, q: EventQuery) -> tuple[list[Event], int]:
        """A page of events in position order, and how many match in all."""
        where, args = ["true"], []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if q.aggregate is not None:
            where.append(f"aggregate_id = {arg(q.aggregate)}")
            if q.from_seq:
                where.append(f"seq >= {arg(q.from_seq)}")
        elif q.from_seq:
            where.append(f"position >= {arg(q.from_seq)}")
        if q.user_uuid is not None:
            where.append(f"user_uuid = {arg(q.user_uuid)}")
        if q.types:
            where.append(f"type = ANY({arg(list(q.types))}::text[])")
        clause = " AND ".join(where)
        total = await self._pool.fetchval(f"SELECT count(*) FROM events WHERE {clause}", *args)
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE {clause} ORDER BY position"
            f" LIMIT {arg(q.limit)} OFFSET {arg(q.offset)}",
            *args,
        )
        return [row_to_event(r) for r in rows], int(total)
