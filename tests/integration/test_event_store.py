"""The event store against the real Postgres."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.errors import Forbidden
from orchestrator.events import (
    EventFeed,
    EventQuery,
    EventRejected,
    EventStore,
    EventTypeCounts,
    NewEvent,
    ProjectionRunner,
    SeqConflict,
    SubscriberTooSlow,
)

ADMIN = Principal("test", is_admin=True)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await connect(database_url, max_size=20)
    yield database
    await database.close()


def task_event(
    task_id: str, kind: str = "task.created", user: str | None = "alice", **data: object
) -> NewEvent:
    return NewEvent(kind, {"task_id": task_id, **data}, user_uuid=user)


async def test_append_and_read_back(db: Database) -> None:
    store = EventStore(db.pool)
    [first] = await store.append([task_event("t1", prompt="hi")])
    assert (first.type, first.version, first.aggregate_id, first.seq) == (
        "task.created",
        1,
        "t1",
        1,
    )
    assert first.data["prompt"] == "hi" and first.user_uuid == "alice"
    assert uuid.UUID(first.id) and first.timestamp > 1_700_000_000_000
    again = await store.read_after(0)
    assert again == [first]


async def test_concurrent_appends_give_a_gapless_seq(db: Database) -> None:
    store = EventStore(db.pool)

    async def writer(n: int) -> None:
        for i in range(10):
            await store.append([task_event("busy", "task.dispatched", note=f"{n}-{i}")])

    await asyncio.gather(*(writer(n) for n in range(16)))
    events, total = await store.query(EventQuery(aggregate="busy", limit=1000), ADMIN)
    assert total == 160
    assert [e.seq for e in events] == list(range(1, 161))
    positions = [e.position for e in events]
    assert positions == sorted(positions)


async def test_concurrent_transactions_keep_seq_and_position_order(db: Database) -> None:
    """Concurrent transactions on their own connections (no group commit): the database
    lock alone keeps seq gapless and positions in commit order."""
    store = EventStore(db.pool)
    order: list[int] = []

    async def writer(n: int) -> None:
        for i in range(5):
            async with store.transaction() as tx:
                [event] = await tx.append([task_event("hot", "task.dispatched", note=f"{n}")])
                await asyncio.sleep(0.001 * (i % 3))  # hold the transaction open a little
            order.append(event.position)

    await asyncio.gather(*(writer(n) for n in range(12)))
    events, _ = await store.query(EventQuery(aggregate="hot", limit=1000), ADMIN)
    assert [e.seq for e in events] == list(range(1, 61))
    # Positions are handed out in commit order: seq order and position order agree.
    assert [e.position for e in events] == sorted(e.position for e in events)
    assert sorted(order) == [e.position for e in events]


async def test_nul_in_data_is_bad_input(db: Database) -> None:
    store = EventStore(db.pool)
    with pytest.raises(EventRejected, match="NUL"):
        await store.append([task_event("nul", prompt="a\x00b")])


async def test_expected_seq(db: Database) -> None:
    store = EventStore(db.pool)
    await store.append([task_event("opt")], expected_seq=0)
    await store.append([task_event("opt", "task.dispatched")], expected_seq=1)
    with pytest.raises(SeqConflict) as info:
        await store.append([task_event("opt", "task.failed", error="x")], expected_seq=1)
    assert info.value.status_code == 409
    assert info.value.extra == {"aggregate_id": "opt", "expected_seq": 1, "actual_seq": 2}
    _, total = await store.query(EventQuery(aggregate="opt"), ADMIN)
    assert total == 2


async def test_the_database_rejects_update_and_delete(db: Database) -> None:
    store = EventStore(db.pool)
    await store.append([task_event("immutable")])
    for sql in ("UPDATE events SET type = 'x'", "DELETE FROM events", "TRUNCATE events"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await db.pool.execute(sql)
    assert len(await store.read_after(0)) == 1


@pytest.mark.parametrize(
    "bad",
    [
        NewEvent("task.teleported", {"task_id": "t"}),
        NewEvent("task.completed", {"task_id": "t", "worker_id": "w", "status": "ok"}),
        NewEvent("task.created", {"prompt": "no task id"}),
        NewEvent("task.created", {"task_id": "t"}, aggregate_id="other"),
    ],
)
async def test_invalid_events_are_rejected_and_nothing_is_written(
    db: Database, bad: NewEvent
) -> None:
    store = EventStore(db.pool)
    with pytest.raises(EventRejected) as info:
        await store.append([task_event("fine"), bad])
    assert info.value.status_code == 400 and info.value.message
    assert await store.read_after(0) == []


async def test_state_change_and_events_commit_together(db: Database) -> None:
    store = EventStore(db.pool)
    await db.pool.execute("CREATE TABLE jobs (id text PRIMARY KEY)")
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.conn.execute("INSERT INTO jobs VALUES ('j1')")
            await tx.append([task_event("j1")])
            raise RuntimeError("the caller fails after appending")
    assert await db.pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert await store.read_after(0) == []
    async with store.transaction() as tx:
        await tx.conn.execute("INSERT INTO jobs VALUES ('j2')")
        await tx.append([task_event("j2")])
    assert await db.pool.fetchval("SELECT count(*) FROM jobs") == 1
    assert [e.aggregate_id for e in await store.read_after(0)] == ["j2"]


async def test_hooks(db: Database) -> None:
    store = EventStore(db.pool)
    seen: list[int] = []

    async def enrich(event: NewEvent) -> NewEvent:
        if event.data.get("prompt") == "forbidden":
            raise EventRejected("policy: that prompt is not allowed")
        return NewEvent(event.type, {**event.data, "mode": "general"}, event.user_uuid)

    async def broken(events: list) -> None:
        raise RuntimeError("a notification service is down")

    async def record(events: list) -> None:
        seen.extend(e.position for e in events)

    store.add_pre_commit_hook(enrich)
    store.add_post_commit_hook(broken)
    store.add_post_commit_hook(record)
    [event] = await store.append([task_event("h1", prompt="ok")])
    assert event.data["mode"] == "general"
    assert seen == [event.position]  # the failing hook neither lost the event nor the next hook
    with pytest.raises(EventRejected, match="policy"):
        await store.append([task_event("h2", prompt="forbidden")])
    assert [e.aggregate_id for e in await store.read_after(0)] == ["h1"]


async def test_upcasting_an_older_version(db: Database) -> None:
    # A task.completed written at version 1 (duration in seconds), before the schema changed.
    await db.pool.execute(
        """INSERT INTO events (id, type, version, aggregate_id, seq, timestamp, data, user_uuid)
           VALUES ($1, 'task.completed', 1, 'old', 1, 1, $2::jsonb, 'alice')""",
        uuid.uuid4(),
        json.dumps({"task_id": "old", "worker_id": "w1", "status": "ok", "duration": 1.5}),
    )
    [event] = await EventStore(db.pool).read_after(0)
    assert event.version == 2
    assert event.data["duration_ms"] == 1500 and "duration" not in event.data


async def test_projection_rebuild_gives_the_same_state(db: Database) -> None:
    store = EventStore(db.pool)
    runner = ProjectionRunner(store, batch=7)
    runner.register(EventTypeCounts())
    for i in range(20):
        await store.append([task_event(f"p{i}"), task_event(f"p{i}", "task.dispatched")])
    await store.append([task_event("p0", "task.failed", error="boom")])
    applied = await runner.catch_up(EventTypeCounts.name)
    assert (
        len(applied) == 41 and await runner.checkpoint(EventTypeCounts.name) == applied[-1].position
    )
    counts = await EventTypeCounts.read(db.pool)
    assert counts == {"task.created": 20, "task.dispatched": 20, "task.failed": 1}
    assert await runner.catch_up(EventTypeCounts.name) == []  # nothing counted twice
    assert len(await runner.rebuild(EventTypeCounts.name)) == 41
    assert await EventTypeCounts.read(db.pool) == counts


async def test_feed_live_catch_up_and_slow_subscribers(db: Database, database_url: str) -> None:
    store = EventStore(db.pool)
    [early] = await store.append([task_event("f0")])
    feed = EventFeed(store, database_url, poll_s=5.0, subscriber_limit=3)
    await feed.start()
    try:
        stream = feed.subscribe(after=0)
        assert [e.position for e in await anext(stream)] == [early.position]
        [late] = await store.append([task_event("f1")])
        # Woken by NOTIFY, well before the 5 s poll.
        batch = await asyncio.wait_for(anext(stream), timeout=2)
        assert [e.position for e in batch] == [late.position]
        await stream.aclose()

        slow = feed.subscribe(after=late.position)
        first = asyncio.ensure_future(anext(slow))
        await asyncio.sleep(0.05)
        await store.append([task_event(f"s{i}") for i in range(2)])
        assert len(await asyncio.wait_for(first, timeout=2)) == 2
        await store.append([task_event(f"s{i}") for i in range(2, 7)])  # 5 > limit of 3
        await asyncio.sleep(0.3)
        with pytest.raises(SubscriberTooSlow):
            await asyncio.wait_for(anext(slow), timeout=2)
        assert feed.subscribers == 0
    finally:
        await feed.stop()


async def test_reads_are_scoped_to_the_caller_in_the_store(db: Database) -> None:
    store = EventStore(db.pool)
    agg = f"scoped-{uuid.uuid4().hex[:8]}"
    await store.append([task_event(agg, user="alice"), task_event(agg, "task.dispatched", "bob")])
    q = EventQuery(aggregate=agg)
    mine, total = await store.query(q, Principal("alice"))
    assert [e.user_uuid for e in mine] == ["alice"] and total == 1
    # A non-admin naming another tenant is refused, not silently narrowed.
    with pytest.raises(Forbidden):
        await store.query(EventQuery(aggregate=agg, user_uuid="bob"), Principal("alice"))
    everyone, _ = await store.query(q, ADMIN)
    assert {e.user_uuid for e in everyone} == {"alice", "bob"}
    only_bob, _ = await store.query(EventQuery(aggregate=agg, user_uuid="bob"), ADMIN)
    assert [e.user_uuid for e in only_bob] == ["bob"]
