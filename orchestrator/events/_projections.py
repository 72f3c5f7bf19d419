"""Projections: read models built by consuming events in order, checkpointed in Postgres in
the same transaction as the model itself (so each event counts exactly once), and rebuilt by
replaying from position 0."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

import asyncpg

from orchestrator.events._model import Event
from orchestrator.events._store import EventStore

log = logging.getLogger(__name__)


class Projection(Protocol):
    name: str

    async def apply(self, conn: asyncpg.Connection, events: Sequence[Event]) -> None:
        """Fold a batch of events (in position order) into the read model."""

    async def reset(self, conn: asyncpg.Connection) -> None:
        """Empty the read model (before a rebuild)."""


class ProjectionRunner:
    """Feeds registered projections from the store, batch by batch."""

    def __init__(self, store: EventStore, batch: int = 500) -> None:
        self._store = store
        self._batch = batch
        self._projections: dict[str, Projection] = {}

    def register(self, projection: Projection) -> None:
        if projection.name in self._projections:
            raise ValueError(f"projection {projection.name!r} is already registered")
        self._projections[projection.name] = projection

    @property
    def names(self) -> list[str]:
        return list(self._projections)

    async def checkpoint(self, name: str) -> int:
        value = await self._store.pool.fetchval(
            "SELECT position FROM projection_checkpoints WHERE name = $1", name
        )
        return int(value or 0)

    async def catch_up(
        self, name: str, on_applied: Callable[[list[Event]], None] | None = None
    ) -> list[Event]:
        """Apply every event after the checkpoint; return the events applied now.
        `on_applied` is given each batch once its transaction committed (a later batch that
        fails does not take back the ones before it)."""
        projection = self._projections[name]
        applied: list[Event] = []
        while True:
            async with self._store.pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO projection_checkpoints (name) VALUES ($1) ON CONFLICT DO NOTHING",
                    name,
                )
                # The row lock makes concurrent runners (an old and a restarted bus) take
                # turns; each re-reads the checkpoint under it.
                position = await conn.fetchval(
                    "SELECT position FROM projection_checkpoints WHERE name = $1 FOR UPDATE", name
                )
                batch = await self._store.read_after(position, self._batch)
                if not batch:
                    return applied
                await projection.apply(conn, batch)
                await conn.execute(
                    "UPDATE projection_checkpoints SET position = $2 WHERE name = $1",
                    name,
                    batch[-1].position,
                )
            if on_applied is not None:
                on_applied(batch)
            applied.extend(batch)

    async def catch_up_all(self) -> dict[str, list[Event]]:
        return {name: await self.catch_up(name) for name in self._projections}

    async def rebuild(self, name: str) -> list[Event]:
        """Empty the read model and replay every event from position 0."""
        projection = self._projections[name]
        async with self._store.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO projection_checkpoints (name, position) VALUES ($1, 0)
                   ON CONFLICT (name) DO UPDATE SET position = 0""",
                name,
            )
            await conn.execute(
                "SELECT position FROM projection_checkpoints WHERE name = $1 FOR UPDATE", name
            )
            await projection.reset(conn)
        return await self.catch_up(name)


class EventTypeCounts:
    """Committed events per type: the `event_type_counts` table, which feeds svc_event_total."""

    name = "event_type_counts"

    async def apply(self, conn: asyncpg.Connection, events: Sequence[Event]) -> None:
        counts = Counter(e.type for e in events)
        await conn.execute(
            """INSERT INTO event_type_counts (type, count)
               SELECT * FROM unnest($1::text[], $2::bigint[])
               ON CONFLICT (type) DO UPDATE SET count = event_type_counts.count + EXCLUDED.count""",
            list(counts),
            list(counts.values()),
        )

    async def reset(self, conn: asyncpg.Connection) -> None:
        await conn.execute("DELETE FROM event_type_counts")

    @staticmethod
    async def read(pool: asyncpg.Pool) -> dict[str, int]:
        rows = await pool.fetch("SELECT type, count FROM event_type_counts ORDER BY type")
        return {r["type"]: int(r["count"]) for r in rows}
