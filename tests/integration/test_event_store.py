"""The event store against the real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.errors import Forbidden
from orchestrator.events import (
    Event,
    EventFeed,
    EventQuery,
    EventRejected,
    EventServices,
    EventStore,
    EventTypeCounts,
    NewEvent,
    ProjectionRunner,
    SeqConflict,
    SubscriberTooSlow,
)
from orchestrator.events import _notifier as notifier_module
from orchestrator.observability import MetricsRecorder
from orchestrator.runtime.supervisor import Supervisor

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

    def enrich(event: NewEvent) -> NewEvent:
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


async def test_projections_catch_up_once_a_window_and_count_the_last_event(
    db: Database, database_url: str, supervisor: Supervisor
) -> None:
    """The feed hands on a batch per wake; the projections catch up at most once a window
    (each catch-up is a transaction that reads the events again), and the events of the
    last batches, after which nothing more comes, are still counted."""
    store = EventStore(db.pool)
    every = 0.3
    services = EventServices(
        store, database_url, MetricsRecorder("test"), supervisor, project_every_s=every
    )
    catch_ups = 0
    catch_up = services.projections.catch_up

    async def counted(name: str, on_applied: Any = None) -> list[Event]:
        nonlocal catch_ups
        catch_ups += 1
        return await catch_up(name, on_applied)

    services.projections.catch_up = counted  # type: ignore[method-assign]
    await services.start()
    batches: list[int] = []

    async def follow() -> None:
        async for batch in services.feed.subscribe(services.feed.head):
            batches.append(len(batch))

    follower = asyncio.create_task(follow())
    try:
        started = time.monotonic()
        for i in range(40):
            await store.append([task_event(f"c{i}")])
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + 10
        while (await EventTypeCounts.read(db.pool)).get("task.created", 0) < 40:
            assert time.monotonic() < deadline, "the last events were never counted"
            await asyncio.sleep(0.02)
        elapsed, made = time.monotonic() - started, catch_ups
        assert await EventTypeCounts.read(db.pool) == {"task.created": 40}
        assert sum(batches) == 40
        # The start's catch-up, then at most one a window (and the one a window ends with),
        # however many batches the feed handed on.
        assert made <= 2 + math.ceil(elapsed / every) < len(batches), (
            made,
            elapsed,
            len(batches),
        )
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await services.stop()


async def test_stopping_counts_what_the_window_held_back(
    db: Database, database_url: str, supervisor: Supervisor
) -> None:
    """Events the projections have not caught up with when the services stop (the window is
    still open) are counted by the stop, in Postgres and in the process's metrics, and those
    committed before the start, by the start."""
    store = EventStore(db.pool)
    await store.append([task_event("before")])
    recorder = MetricsRecorder("test")
    services = EventServices(store, database_url, recorder, supervisor, project_every_s=60)
    await services.start()
    assert recorder.drain().events == {"task.created": 1}
    seen: list[Event] = []
    all_seen = asyncio.Event()

    async def follow() -> None:
        async for batch in services.feed.subscribe(services.feed.head):
            seen.extend(batch)
            if len(seen) >= 3:
                all_seen.set()

    follower = asyncio.create_task(follow())
    try:
        for i in range(3):
            await store.append([task_event(f"s{i}", "task.dispatched")])
        # The feed handed them on; the next catch-up is a minute away.
        await asyncio.wait_for(all_seen.wait(), 10)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await services.stop()
    assert await EventTypeCounts.read(db.pool) == {"task.created": 1, "task.dispatched": 3}
    assert recorder.drain().events == {"task.dispatched": 3}


async def test_feed_live_catch_up_and_slow_subscribers(
    db: Database, database_url: str, supervisor: Supervisor
) -> None:
    store = EventStore(db.pool)
    [early] = await store.append([task_event("f0")])
    feed = EventFeed(store, database_url, poll_s=5.0, subscriber_limit=3, supervisor=supervisor)
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


# --- no global lock: concurrent appends, and followers that never skip ----------------------


async def test_appends_to_different_aggregates_commit_concurrently(
    db: Database, database_url: str, supervisor: Supervisor
) -> None:
    """One transaction holds its append open; another aggregate's append commits meanwhile.
    Followers (read_after, head, the live feed) hold the later position back until the open
    transaction ends, then deliver both in position order, woken without a new append."""
    store = EventStore(db.pool)
    feed = EventFeed(
        store, database_url, poll_s=30.0, supervisor=supervisor
    )  # no poll timer to save the day
    await feed.start()
    stream = feed.subscribe(after=0)
    first_live = asyncio.ensure_future(anext(stream))
    try:
        async with store.transaction() as slow:
            [held] = await slow.append([task_event("slow-agg")])
            # Committing on another connection must not wait for `slow` (a global lock would).
            [quick] = await asyncio.wait_for(store.append([task_event("quick-agg")]), timeout=5)
            assert quick.position > held.position
            # Visible, but above a position still in flight: no follower may pass it yet.
            assert await db.pool.fetchval("SELECT count(*) FROM events") == 1
            assert await store.read_after(0) == []
            assert await store.head() < held.position
            await asyncio.sleep(0.3)
            assert not first_live.done()
        # `slow` committed: its NOTIFY wakes the feed, which now reads both, in order.
        batch = await asyncio.wait_for(first_live, timeout=5)
        while len(batch) < 2:
            batch += await asyncio.wait_for(anext(stream), timeout=5)
        assert [e.position for e in batch] == [held.position, quick.position]
        assert [e.position for e in await store.read_after(0)] == [held.position, quick.position]

        # An open transaction that is rolled back sends no NOTIFY: the feed still delivers
        # what it held back, well before its 30 s poll.
        with pytest.raises(RuntimeError):
            async with store.transaction() as doomed:
                await doomed.append([task_event("doomed-agg")])
                [after] = await asyncio.wait_for(store.append([task_event("after-agg")]), 5)
                await asyncio.sleep(0.2)
                raise RuntimeError("roll back")
        batch = await asyncio.wait_for(anext(stream), timeout=5)
        assert [e.position for e in batch] == [after.position]
    finally:
        first_live.cancel()
        with contextlib.suppress(BaseException):
            await first_live
        await stream.aclose()
        await feed.stop()


async def test_same_aggregate_appends_wait_for_each_other(db: Database) -> None:
    """Per aggregate, seq and position both follow the order the appends took the aggregate."""
    store = EventStore(db.pool)
    async with store.transaction() as first:
        [a] = await first.append([task_event("shared-agg")])
        second = asyncio.ensure_future(store.append([task_event("shared-agg", "task.dispatched")]))
        await asyncio.sleep(0.3)
        assert not second.done()  # waits for the aggregate, not for the whole store:
        async with store.transaction() as third:  # (not group-committed behind `second`)
            [other] = await asyncio.wait_for(third.append([task_event("other-agg")]), 5)
        assert other.seq == 1 and other.position > a.position
        # Group-committed too: another writer takes it while `second` waits.
        [grouped] = await asyncio.wait_for(store.append([task_event("grouped-agg")]), 5)
        assert grouped.seq == 1
    [b] = await asyncio.wait_for(second, timeout=5)
    assert (a.seq, b.seq) == (1, 2) and a.position < b.position


async def test_random_concurrent_writers_never_make_a_follower_skip(
    db: Database, database_url: str, supervisor: Supervisor
) -> None:
    """The proof by test: 16 concurrent writers, each transaction with random work before its
    append (some take a transaction id early), random delays before commit, some rolled
    back; some appends are single statements beside a state change (`write`, the
    `append_event` function, some failing); a follower reading by position in a
    tight loop, and a live-feed subscriber, each see every committed event exactly once, in
    position order, and per aggregate in seq order with no gap."""
    import random

    store = EventStore(db.pool)
    await db.pool.execute("CREATE TABLE scratch (v int CHECK (v >= 0))")
    rng = random.Random(1616)
    writers, per_writer, rounds = 16, 6, 4
    feed = EventFeed(store, database_url, poll_s=0.2, supervisor=supervisor)
    await feed.start()

    async def follow(read: AsyncIterator[list], seen: list, want: list[int]) -> None:
        """Collect batches until `want` (filled in once the writers are done) is reached."""
        async for batch in read:
            seen.extend(batch)
            if want and len(seen) >= len(want):
                return

    committed: list = []

    async def writer(tag: str, w: int) -> None:
        for i in range(per_writer):
            if rng.random() < 0.3:  # one statement, its own transaction; some fail
                aggregate = f"{tag}-{rng.randrange(4)}" if rng.random() < 0.5 else f"{tag}-w{w}"
                try:
                    # The state's RETURNING sleeps: the event's position is drawn, then the
                    # statement takes a while to commit (as a slow one would).
                    _, events = await store.write(
                        ["state AS (INSERT INTO scratch VALUES ($1) RETURNING v, pg_sleep($2))"],
                        [-1 if rng.random() < 0.1 else i, rng.random() * 0.01],
                        [task_event(aggregate, "task.dispatched", note=f"{w}-{i}")],
                        returning="state",
                    )
                except asyncpg.CheckViolationError:
                    continue
                committed.extend(events)
                continue
            try:
                async with store.transaction() as tx:
                    if rng.random() < 0.5:  # a write first: this transaction's id comes early
                        await tx.conn.execute("INSERT INTO scratch VALUES ($1)", i)
                    await asyncio.sleep(rng.random() * 0.004)
                    aggregate = f"{tag}-{rng.randrange(4)}" if rng.random() < 0.5 else f"{tag}-w{w}"
                    events = await tx.append(
                        [
                            task_event(aggregate, "task.dispatched", note=f"{w}-{i}-{j}")
                            for j in range(rng.randrange(1, 4))
                        ],
                    )
                    await asyncio.sleep(rng.random() * 0.01)
                    if rng.random() < 0.1:
                        raise RuntimeError("rolled back")
            except RuntimeError:
                continue
            committed.extend(events)

    try:
        for r in range(rounds):
            stop = asyncio.Event()
            seen: list = []
            fresh: list = []
            live: list = []
            cursor = await store.head()
            follower = asyncio.ensure_future(follow_from(store, cursor, stop, seen))
            # Another reader that starts each read afresh: its horizon is probed from the
            # one the others published, not from its own.
            refollower = asyncio.ensure_future(
                follow_from(store, cursor, stop, fresh, lambda: EventStore(db.pool))
            )
            subscription = feed.subscribe(after=cursor)
            want: list[int] = []
            watcher = asyncio.ensure_future(follow(subscription, live, want))
            committed.clear()
            await asyncio.gather(*(writer(f"r{r}", w) for w in range(writers)))
            stop.set()
            await asyncio.wait_for(follower, timeout=10)
            await asyncio.wait_for(refollower, timeout=10)
            want[:] = sorted(e.position for e in committed)
            if len(live) < len(want):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(watcher), timeout=10)
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
            await subscription.aclose()
            for name, got in (("read_after", seen), ("fresh readers", fresh), ("live feed", live)):
                positions = [e.position for e in got]
                assert positions == sorted(set(positions)), f"{name}: out of order or twice"
                assert positions == want, f"{name} round {r}: missed {set(want) - set(positions)}"
            by_aggregate: dict[str, list[int]] = {}
            for e in seen:
                by_aggregate.setdefault(e.aggregate_id, []).append(e.seq)
            for aggregate, seqs in by_aggregate.items():
                assert seqs == list(range(1, len(seqs) + 1)), aggregate
    finally:
        await feed.stop()


async def follow_from(
    store: EventStore,
    cursor: int,
    stop: asyncio.Event,
    seen: list,
    reader: Callable[[], EventStore] | None = None,
) -> None:
    """Follow the store by position in a tight loop until `stop` and nothing is left (with
    `reader`, a new reader for each read)."""
    while True:
        stopping = stop.is_set()
        batch = await (reader() if reader is not None else store).read_after(cursor, 50)
        if batch:
            assert batch[0].position > cursor
            seen.extend(batch)
            cursor = batch[-1].position
        elif stopping:
            return
        else:
            await asyncio.sleep(0)


@pytest.mark.parametrize("start", [2**31 - 2, 2**32 - 2, 5 * 2**32 + 7])
async def test_the_horizon_across_the_lock_keys_32_bit_wrap(db: Database, start: int) -> None:
    """An in-flight append's floor lock keeps only 32 bits of its position; the horizon
    restores it exactly, past the sign bit and the 2^32 wrap too."""
    store = EventStore(db.pool)
    await db.pool.execute("SELECT setval('events_position_seq', $1)", start)
    async with store.transaction() as slow:
        [held] = await slow.append([task_event("wrap-slow")])
        [quick] = await store.append([task_event("wrap-quick")])
        assert held.position == start + 1 and quick.position == start + 2
        # Far from any known horizon: the scan of pg_locks restores the key.
        assert await EventStore(db.pool).head() == start  # the floor `slow` registered
        # From there, the probe: keys just below and past the sign bit and the wrap.
        assert await store.head() == start
        assert await store.read_after(start) == []
        async with store.transaction() as slower:
            [later] = await slower.append([task_event("wrap-slower")])
    assert [e.position for e in await store.read_after(start)] == [
        held.position,
        quick.position,
        later.position,
    ]
    assert await store.head() == later.position
    async with store.transaction() as last:
        await last.append([task_event("wrap-last")])
        await store.append([task_event("wrap-after")])
        assert await store.head() == later.position  # the probe stops at `last`'s floor
    assert await store.head() == later.position + 2


async def test_enqueued_batches_of_one_aggregate_commit_in_order(db: Database) -> None:
    """Group commit runs several writers at once, but one aggregate's batches still commit
    in the order they were queued (the agent runner relies on it), whatever else is queued
    between them."""
    store = EventStore(db.pool)
    futures = []
    for i in range(60):
        futures.append(store.append([task_event(f"ord-{i % 3}", "task.dispatched", note=str(i))]))
        if i % 7 == 0:
            await asyncio.sleep(0)  # let writers start and take partial queues
    events = [e for f in futures for e in await asyncio.wait_for(f, 10)]
    for agg in ("ord-0", "ord-1", "ord-2"):
        mine = [e for e in events if e.aggregate_id == agg]
        assert [e.seq for e in mine] == list(range(1, 21))
        assert [e.position for e in mine] == sorted(e.position for e in mine)
        assert [int(e.data["note"]) for e in mine] == sorted(int(e.data["note"]) for e in mine)


async def test_a_cancelled_writer_keeps_its_connection_until_its_commit_ends(
    db: Database,
) -> None:
    """A caller cancelled during its COMMIT must not hand the connection back to the pool
    mid-statement (seen in a full run: a workflow cancelled during its commit's NOTIFY, then
    the cancel request's transaction on the same connection failed with 'another operation
    is in progress', a 500); once the commit is through, the hooks run, then the cancel."""
    store = EventStore(db.pool)
    # A deferred constraint trigger: the COMMIT itself takes half a second.
    await db.pool.execute(
        """CREATE TABLE slow_commit (v int);
           CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
           CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow_commit
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();"""
    )
    hooked: list[int] = []

    async def record(events: list[Event]) -> None:
        hooked.extend(e.position for e in events)

    store.add_post_commit_hook(record)
    committing = asyncio.Event()

    async def write() -> None:
        async with store.transaction() as tx:
            await tx.conn.execute("INSERT INTO slow_commit VALUES (1)")
            await tx.append([task_event("cancelled-writer")])
            committing.set()

    writer = asyncio.create_task(write())
    await committing.wait()
    await asyncio.sleep(0.1)  # inside the COMMIT
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    # Every connection the pool hands out is idle and works.
    assert await asyncio.gather(*(db.pool.fetchval("SELECT 1") for _ in range(30))) == [1] * 30
    events, _ = await store.query(EventQuery(aggregate="cancelled-writer"), ADMIN)
    assert len(events) == 1  # committed before the cancel: kept
    assert hooked == [events[0].position]  # and its hooks ran


# --- the writer: every way of writing ends the same way -------------------------------------


class _Listener:
    """A LISTEN on the feeds' channel, collecting payloads; `marker()` waits until every
    NOTIFY committed before it has arrived (Postgres delivers them in commit order)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.payloads: list[str] = []
        self._got = asyncio.Event()

    def _on(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)
        self._got.set()

    async def start(self) -> None:
        await self.conn.add_listener(notifier_module.NOTIFY_CHANNEL, self._on)

    async def until(self, payload: str, within: float = 10) -> None:
        async with asyncio.timeout(within):
            while payload not in self.payloads:
                self._got.clear()
                await self._got.wait()

    async def marker(self, db: Database) -> list[str]:
        await db.pool.execute(f"NOTIFY {notifier_module.NOTIFY_CHANNEL}, 'marker'")
        await self.until("marker")
        got = self.payloads[: self.payloads.index("marker")]
        self.payloads.clear()
        return got


@pytest.fixture
async def listener(database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_Listener]:
    # The notifier's own NOTIFYs say so: a carried one's payload is empty.
    monkeypatch.setattr(
        notifier_module,
        "NOTIFY_SQL",
        f"SELECT pg_notify('{notifier_module.NOTIFY_CHANNEL}', 'separate')",
    )
    conn = await asyncpg.connect(database_url)
    got = _Listener(conn)
    await got.start()
    yield got
    await conn.close()


async def _four_ways(store: EventStore, tag: str) -> list[Event]:
    """One write of each kind, one after another; what each committed."""
    written = list(await store.append([task_event(f"{tag}-append")]))
    _, events = await store.write(
        ["state AS (INSERT INTO scratch VALUES (1) RETURNING v)"],
        [],
        [task_event(f"{tag}-write")],
        returning="state",
    )
    written += events
    async with store.transaction() as tx:
        await tx.conn.execute("INSERT INTO scratch VALUES (2)")
        await tx.append([task_event(f"{tag}-tx-append")])
    written += tx.appended
    async with store.transaction() as tx:
        await tx.write(
            ["state AS (INSERT INTO scratch VALUES (3) RETURNING v)"],
            [],
            [task_event(f"{tag}-tx-write")],
        )
    written += tx.appended
    return written


async def test_every_way_of_writing_runs_the_hooks_and_wakes_the_feeds(
    db: Database, listener: _Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """append, write, and append / write inside a transaction: after each commit the post-
    commit hooks get exactly its events and the feeds are woken (carried by the commit
    when the window is open, else sent by the notifier), with nothing for the caller to
    call afterwards."""
    await db.pool.execute("CREATE TABLE scratch (v int CHECK (v >= 0))")
    store = EventStore(db.pool)
    hooked: list[list[int]] = []

    async def record(events: list[Event]) -> None:
        hooked.append([e.position for e in events])

    store.add_post_commit_hook(record)
    written = await _four_ways(store, "open")
    assert hooked == [[e.position] for e in written]
    if store.notifier.sender is not None:
        await asyncio.wait_for(store.notifier.sender, 10)
    assert not store.notifier.owed
    assert await listener.marker(db)  # woken (how often depends on the machine's pace)
    # Each in a window of its own: each commit carries its own NOTIFY.
    monkeypatch.setattr(notifier_module, "NOTIFY_COALESCE_S", 0.0)
    hooked.clear()
    written = await _four_ways(store, "carried")
    assert hooked == [[e.position] for e in written]
    assert await listener.marker(db) == ["", "", "", ""]
    # All in one window already used: none carries, the notifier sends one for all.
    monkeypatch.setattr(notifier_module, "NOTIFY_COALESCE_S", 3600.0)
    monkeypatch.setattr(notifier_module, "NOTIFY_LATE_S", 0.05)
    written = await _four_ways(store, "owed")
    assert store.notifier.owed and store.notifier.sender is not None
    store.notifier._sent_at -= 3600.0  # the window ends
    await asyncio.wait_for(store.notifier.sender, 10)
    assert await listener.marker(db) == ["separate"]


async def test_a_write_that_does_not_commit_runs_no_hook_and_wakes_nobody(
    db: Database, listener: _Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    await db.pool.execute("CREATE TABLE scratch (v int CHECK (v >= 0))")
    monkeypatch.setattr(notifier_module, "NOTIFY_COALESCE_S", 0.0)  # every commit carries
    store = EventStore(db.pool)
    hooked: list[Event] = []

    async def record(events: list[Event]) -> None:
        hooked.extend(events)

    store.add_post_commit_hook(record)
    # The block fails after appending: rolled back.
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.append([task_event("doomed-1")])
            raise RuntimeError("the caller fails")
    # A statement fails and the block swallows it: Postgres rolls the transaction back at
    # COMMIT, and the writer says so instead of reporting the events committed.
    with pytest.raises(asyncpg.InFailedSQLTransactionError):
        async with store.transaction() as tx:
            await tx.append([task_event("doomed-2")])
            with contextlib.suppress(asyncpg.CheckViolationError):
                await tx.conn.execute("INSERT INTO scratch VALUES (-1)")
    # One statement whose state change fails: nothing of it commits.
    with pytest.raises(asyncpg.CheckViolationError):
        await store.write(
            ["state AS (INSERT INTO scratch VALUES (-1) RETURNING v)"],
            [],
            [task_event("doomed-3")],
        )
    # An appended batch with an invalid event: rejected before anything is sent.
    with pytest.raises(EventRejected):
        await store.append([task_event("doomed-4"), NewEvent("task.teleported", {})])
    assert hooked == []
    assert await store.read_after(0) == []
    assert not store.notifier.owed
    assert await listener.marker(db) == []
    # The pool's connections are all usable afterwards.
    assert await asyncio.gather(*(db.pool.fetchval("SELECT 1") for _ in range(25))) == [1] * 25


async def test_append_queues_at_once_and_a_caller_need_not_wait(db: Database) -> None:
    """`append` validates and queues before it returns: a caller that never awaits (a
    fire-and-forget record) still gets its events written, and in its order."""
    store = EventStore(db.pool)
    hooked = asyncio.Event()

    async def record(events: list[Event]) -> None:
        if any(e.aggregate_id == "unawaited" and e.seq == 5 for e in events):
            hooked.set()

    store.add_post_commit_hook(record)
    for i in range(5):
        store.append([task_event("unawaited", "task.dispatched", note=str(i))])
    await asyncio.wait_for(hooked.wait(), 10)
    events, _ = await store.query(EventQuery(aggregate="unawaited"), ADMIN)
    assert [e.data["note"] for e in events] == ["0", "1", "2", "3", "4"]


# --- the horizon: probed from a known one ---------------------------------------------------


async def test_the_horizon_stops_at_the_oldest_append_in_flight_whatever_the_chunks(
    db: Database,
) -> None:
    """The probe walks the floor keys from the last horizon in chunks of 64: an append in
    flight whose floor is a few hundred positions on holds it there, and once it commits
    the probe runs on to the last position drawn."""
    store, reader = EventStore(db.pool), EventStore(db.pool)
    for _ in range(3):
        await store.append([task_event(f"h{i}") for i in range(100)])
    assert await reader.horizon() == 300
    await store.append([task_event(f"g{i}") for i in range(150)])
    async with store.transaction() as slow:
        [held] = await slow.append([task_event("held")])  # floor 450
        for _ in range(2):
            await store.append([task_event(f"k{i}") for i in range(100)])
        assert await reader.horizon() == held.position - 1
        assert reader.in_flight
        # A fresh reader starts from the published horizon, not from 0.
        assert await EventStore(db.pool).horizon() == held.position - 1
    assert await reader.horizon() == held.position + 200
    assert not reader.in_flight


async def test_far_behind_any_known_horizon_one_scan_finds_it(db: Database) -> None:
    """Hundreds of positions past every horizon known, none held (the first read after a
    crash empties the published one): after 512 probes one scan of the locks, as before;
    from the horizon it found, probes again."""
    store = EventStore(db.pool)
    await db.pool.execute("SELECT setval('events_position_seq', 100000)")
    async with store.transaction() as slow:
        [held] = await slow.append([task_event("far-slow")])
        await store.append([task_event("far-quick")])
        assert await EventStore(db.pool).horizon() == 100000
    assert await EventStore(db.pool).horizon() == held.position + 1


# --- the feeds' NOTIFY: carried by the commits, coalesced -----------------------------------


async def _store_one(store: EventStore, v: int, tag: str) -> None:
    await store.write(
        ["state AS (INSERT INTO notify_scratch VALUES ($1) RETURNING v)"],
        [v],
        [task_event(tag, "task.dispatched", note=str(v))],
    )


async def test_a_stream_of_single_statement_appends_carries_its_notify(
    db: Database, listener: _Listener
) -> None:
    """Appends beside a state change, one after another: the feeds are woken by NOTIFYs
    the statements carry (one a window), not by NOTIFYs of their own (issue 17: ~40 us a
    store); the last ones, owed when the stream stops, are notified by the notifier."""
    await db.pool.execute("CREATE TABLE notify_scratch (v int CHECK (v >= 0))")
    store = EventStore(db.pool)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for v in range(300):
        await _store_one(store, v, "carried")
    windows = (loop.time() - started) / notifier_module.NOTIFY_COALESCE_S
    if store.notifier.sender is not None:  # what the last statements owed, if anything
        await asyncio.wait_for(store.notifier.sender, 10)
    assert not store.notifier.owed
    got = await listener.marker(db)
    carried, separate = got.count(""), got.count("separate")
    # Own NOTIFYs only where a store took longer than the notifier waits (a loaded
    # machine); without carrying, every window's wake-up was one (and none carried).
    assert carried >= min(3, windows / 2), (got, windows)
    assert separate <= carried // 2 + 1, got


async def test_an_owed_notify_is_sent_when_its_carrier_fails(
    db: Database, listener: _Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    await db.pool.execute("CREATE TABLE notify_scratch (v int CHECK (v >= 0))")
    monkeypatch.setattr(notifier_module, "NOTIFY_COALESCE_S", 3600.0)  # windows opened by hand
    monkeypatch.setattr(notifier_module, "NOTIFY_LATE_S", 0.05)
    store = EventStore(db.pool)
    await _store_one(store, 1, "owed")  # carries the window's NOTIFY
    await _store_one(store, 2, "owed")  # in the window: owed
    store.notifier._sent_at -= 3600.0  # the window ends
    with pytest.raises(asyncpg.CheckViolationError):
        await _store_one(store, -1, "owed")  # would carry it, but fails
    store.notifier._sent_at -= 3600.0  # its window ends too: the notifier sends what is owed
    await listener.until("separate")
    assert await listener.marker(db) == ["", "separate"]


async def test_an_owed_notify_carried_by_the_next_commit_is_not_sent_again(
    db: Database, listener: _Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    await db.pool.execute("CREATE TABLE notify_scratch (v int CHECK (v >= 0))")
    monkeypatch.setattr(notifier_module, "NOTIFY_COALESCE_S", 3600.0)
    monkeypatch.setattr(notifier_module, "NOTIFY_LATE_S", 0.05)
    store = EventStore(db.pool)
    await _store_one(store, 1, "owed")  # carries
    await _store_one(store, 2, "owed")  # owed
    store.notifier._sent_at -= 3600.0
    async with store.transaction() as tx:  # its COMMIT carries what 2 owed
        await tx.append([task_event("owed", "task.dispatched", note="3")])
    assert store.notifier.sender is not None
    await asyncio.wait_for(store.notifier.sender, 10)  # it wakes, finds nothing owed, ends
    assert await listener.marker(db) == ["", ""]
