"""Reading the event store: by position up to the horizon (followers), and pages.

Appends in different transactions commit concurrently, so a position can be visible while a
smaller one is still in flight. Every read that follows positions therefore stops at the
horizon (`horizon()`, read in an earlier statement than the rows): nothing at or below it
can still appear, so a reader that has seen position N never later finds a smaller one, and
following the store by position skips nothing (migrations 0014 and 0024).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from orchestrator._json import loads
from orchestrator.auth import Principal
from orchestrator.events._catalog import UnknownEventType, event_type, upcast
from orchestrator.events._model import Event, EventPage, EventQuery, owner_scope

_COLUMNS = "position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid"


def row_to_event(row: asyncpg.Record) -> Event:
    """A stored row as an Event; an older version of its type is upcast to the current one."""
    data = loads(row["data"]) if isinstance(row["data"], str) else dict(row["data"])
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


class EventReader:
    """The reading half of the store. Call its methods outside explicit REPEATABLE READ
    transactions (the rows must be read by a newer snapshot than the horizon's)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._in_flight = False
        # The highest horizon this reader has found: the next one is probed from here
        # (`events_horizon_from`, migration 0024), so its cost follows the positions drawn
        # since, not the connections.
        self._known = 0

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def in_flight(self) -> bool:
        """At the last read, some append was in flight: a position may be waiting behind it,
        and it will show without a NOTIFY if that transaction rolls back (poll soon)."""
        return self._in_flight

    async def horizon(self) -> int:
        """A position no later-committing event can be at or below: read events up to it in a
        later statement (a newer snapshot) and none can be missed."""
        row = await self._pool.fetchrow(
            "SELECT horizon, allocated FROM events_horizon_from($1)", self._known
        )
        assert row is not None
        horizon = int(row["horizon"])
        self._in_flight = row["allocated"] > horizon
        self._known = max(self._known, horizon)
        return horizon

    async def read_after(self, position: int, limit: int = 500) -> list[Event]:
        """Committed events after `position` in position order, up to the horizon."""
        horizon = await self.horizon()
        if horizon <= position:
            return []
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE position > $1 AND position <= $2"
            " ORDER BY position LIMIT $3",
            position,
            horizon,
            limit,
        )
        return [row_to_event(r) for r in rows]

    async def position_before(self, aggregate: str, from_seq: int) -> int:
        """Where a stream starting at `from_seq` resumes: the position just before the first
        event of `aggregate` with seq >= from_seq; the current head when the aggregate has
        no such event yet."""
        first = await self._pool.fetchval(
            "SELECT min(position) FROM events WHERE aggregate_id = $1 AND seq >= $2",
            aggregate,
            from_seq,
        )
        return await self.head() if first is None else int(first) - 1

    async def head(self) -> int:
        """Where a follower starts to see only what commits from now on: every event at or
        below it is already visible (0 for an empty store)."""
        return await self.horizon()

    async def query(self, q: EventQuery, principal: Principal) -> tuple[list[Event], int]:
        """`page` as (events, total)."""
        found = await self.page(q, principal)
        return found.events, found.total

    async def page(self, q: EventQuery, principal: Principal) -> EventPage:
        """A page of the events `principal` may read (its own; an admin's `q.user_uuid` or
        every tenant's) in position order, and how many match in all: counted exactly up to
        `q.count_limit`, the planner's estimate above it (so paging never counts the table).

        `from_seq` keeps events whose seq (per aggregate, SPEC part 2) is at least it, for
        one aggregate or all; `from_position` is the global cursor. Across all aggregates the
        page stops at the horizon, so paging by `from_position = last position + 1` skips
        nothing that commits late. Within one aggregate seq is gapless and an aggregate's
        appends commit in order: paging by seq (or position) skips nothing either."""
        owner = owner_scope(principal, q.user_uuid)
        where, args = ["true"], []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if q.aggregate is not None:
            where.append(f"aggregate_id = {arg(q.aggregate)}")
        else:
            where.append(f"position <= {arg(await self.horizon())}")
        if q.from_seq:
            where.append(f"seq >= {arg(q.from_seq)}")
        if q.from_position:
            where.append(f"position >= {arg(q.from_position)}")
        if owner is not None:
            where.append(f"user_uuid = {arg(owner)}")
        if q.types:
            where.append(f"type = ANY({arg(list(q.types))}::text[])")
        clause, n = " AND ".join(where), len(args)
        counted = await self._pool.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM events WHERE {clause} LIMIT ${n + 1}) AS m",
            *args,
            q.count_limit + 1,
        )
        total, exact = int(counted), True
        if total > q.count_limit:
            plan = await self._pool.fetchval(
                f"EXPLAIN (FORMAT JSON) SELECT 1 FROM events WHERE {clause}", *args
            )
            estimate = int(json.loads(plan)[0]["Plan"]["Plan Rows"])
            total, exact = max(total, estimate), False
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE {clause} ORDER BY position"
            f" LIMIT ${n + 1} OFFSET ${n + 2}",
            *args,
            q.limit,
            q.offset,
        )
        return EventPage([row_to_event(r) for r in rows], total, exact)
