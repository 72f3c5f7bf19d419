"""The replica's SSE fan-out (`Fanout`) over the real store and its live feed: frames encoded
once and shared, coalesced writes that keep every frame whole and in order, a slow client
that never holds up the others, and tenancy with the shared encoding."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable

import pytest

from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.events import Event, EventFeed, EventStore, NewEvent, SubscriberTooSlow, _fanout
from orchestrator.events._fanout import COALESCE_BYTES, Fanout, FanoutStream, StreamFilter
from orchestrator.runtime.supervisor import Supervisor
from tests.conftest import make_supervisor

ADMIN = Principal("root", is_admin=True)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await connect(database_url, max_size=10)
    yield database
    await database.close()


@pytest.fixture
async def fanout_of(
    db: Database, database_url: str, supervisor: Supervisor
) -> AsyncIterator[Callable[[int], Fanout]]:
    """A Fanout (with the given client buffer) following the store through an EventFeed,
    as a replica served without Ray does."""
    store = EventStore(db.pool)
    feed = EventFeed(store, database_url, poll_s=5.0, supervisor=supervisor)
    await feed.start()
    made: list[Fanout] = []
    replicas: list[Supervisor] = []

    def make(limit: int = 10_000) -> Fanout:
        # Each fan-out is a replica's: a supervisor of its own.
        replicas.append(make_supervisor(f"replica-{len(replicas)}"))
        upstream = functools.partial(feed.subscribe, announce=True)
        made.append(Fanout(upstream, store, client_limit=limit, supervisor=replicas[-1]))
        return made[-1]

    yield make
    for fanout in made:
        await fanout.close()
    for replica in replicas:
        await replica.aclose()
    await feed.stop()


def event(task: str, user: str = "alice", size: int = 0) -> NewEvent:
    return NewEvent("task.created", {"task_id": task, "pad": "x" * size}, user_uuid=user)


def parse(chunk: bytes) -> list[tuple[int, dict[str, object]]]:
    """A chunk's frames as (id, data): every frame whole (nothing cut across chunks)."""
    assert chunk.endswith(b"\n\n"), chunk[-40:]
    frames = []
    for raw in chunk[:-2].split(b"\n\n"):
        fields = dict(line.split(": ", 1) for line in raw.decode().split("\n"))
        assert set(fields) == {"id", "event", "data"} and fields["event"] == "task.created"
        data = json.loads(fields["data"])
        assert data["position"] == int(fields["id"])
        frames.append((int(fields["id"]), data))
    return frames


async def reached(fanout: Fanout, position: int) -> None:
    """Until the fan-out has handed out `position` (bounded)."""
    async with asyncio.timeout(5):
        # The fan-out has no hook to wait on: poll its position, bounded.
        while fanout.position < position:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def open_stream(fanout: Fanout, principal: Principal, **flt: object) -> FanoutStream:
    return await fanout.open(StreamFilter(**flt), None, principal, ping_s=30)  # type: ignore[arg-type]


async def test_a_client_behind_gets_its_frames_in_one_write_whole_and_in_order(
    db: Database, fanout_of: Callable[..., Fanout]
) -> None:
    store = EventStore(db.pool)
    fanout = fanout_of()
    alice = await open_stream(fanout, Principal("alice"))
    chunks = aiter(alice)
    try:
        # Three commits (three batches upstream) while the client is not reading.
        appended: list[Event] = []
        for i in range(3):
            appended += await store.append([event(f"b{i}-{j}") for j in range(2)])
        await reached(fanout, appended[-1].position)
        chunk = await asyncio.wait_for(anext(chunks), 5)
        assert [p for p, _ in parse(chunk)] == [e.position for e in appended]
        assert [d["aggregate_id"] for _, d in parse(chunk)] == [e.aggregate_id for e in appended]

        # Far behind: several writes, each at most about COALESCE_BYTES, frames never split.
        big = await store.append([event(f"big{i}", size=8_000) for i in range(30)])
        await reached(fanout, big[-1].position)
        got: list[int] = []
        writes = 0
        while len(got) < len(big):
            chunk = await asyncio.wait_for(anext(chunks), 5)
            assert len(chunk) < COALESCE_BYTES + 9_000
            got += [p for p, _ in parse(chunk)]
            writes += 1
        assert got == [e.position for e in big] and 1 < writes < len(big)
    finally:
        await alice.aclose()
    assert fanout.clients == 0


async def test_a_slow_client_does_not_hold_up_the_others(
    db: Database, fanout_of: Callable[..., Fanout]
) -> None:
    store = EventStore(db.pool)
    fanout = fanout_of(limit=5)
    slow = await open_stream(fanout, Principal("alice"))
    fast = await open_stream(fanout, Principal("alice"))
    fast_chunks = aiter(fast)
    try:
        appended: list[Event] = []
        for i in range(12):  # one commit at a time; the fast client reads each at once
            [e] = await store.append([event(f"s{i}")])
            appended.append(e)
            chunk = await asyncio.wait_for(anext(fast_chunks), 5)
            assert [p for p, _ in parse(chunk)] == [e.position]
        # The slow one never read: it gets what its buffer held, in one write, then the
        # error naming the last position it was given (to resume from).
        slow_chunks = aiter(slow)
        chunk = await asyncio.wait_for(anext(slow_chunks), 5)
        assert [p for p, _ in parse(chunk)] == [e.position for e in appended[:5]]
        with pytest.raises(SubscriberTooSlow, match=f"Last-Event-ID {appended[4].position}"):
            await asyncio.wait_for(anext(slow_chunks), 5)
        assert fanout.clients == 1
    finally:
        await slow.aclose()
        await fast.aclose()
    assert fanout.clients == 0


async def test_tenancy_with_frames_encoded_once(
    db: Database, fanout_of: Callable[..., Fanout], monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[int] = []
    real = _fanout.sse_frame

    def counting(e: Event) -> bytes:
        encoded.append(e.position)
        return real(e)

    monkeypatch.setattr(_fanout, "sse_frame", counting)
    store = EventStore(db.pool)
    fanout = fanout_of()
    streams = {
        "alice": await open_stream(fanout, Principal("alice")),
        "alice-2": await open_stream(fanout, Principal("alice")),
        "bob": await open_stream(fanout, Principal("bob")),
        "admin": await open_stream(fanout, ADMIN),
        "admin-bob": await open_stream(fanout, ADMIN, user_uuid="bob"),
        "alice-one": await open_stream(fanout, Principal("alice"), aggregate="a1"),
    }
    try:
        appended = await store.append(
            [event(f"a{i}", "alice") for i in range(3)] + [event(f"b{i}", "bob") for i in range(2)]
        )
        appended += await store.append([event("c0", "carol")])  # nobody but the admin
        await reached(fanout, appended[-1].position)
        owned = {
            "alice": [e for e in appended if e.user_uuid == "alice"],
            "alice-2": [e for e in appended if e.user_uuid == "alice"],
            "bob": [e for e in appended if e.user_uuid == "bob"],
            "admin": appended,
            "admin-bob": [e for e in appended if e.user_uuid == "bob"],
            "alice-one": [e for e in appended if e.aggregate_id == "a1"],
        }
        for name, stream in streams.items():
            chunk = await asyncio.wait_for(anext(aiter(stream)), 5)
            frames = parse(chunk)
            assert [p for p, _ in frames] == [e.position for e in owned[name]], name
        # One encoding per event, however many streams carried it.
        assert sorted(encoded) == [e.position for e in appended]
    finally:
        for stream in streams.values():
            await stream.aclose()
    assert fanout.clients == 0


async def test_resume_after_last_event_id_then_live_without_gaps_or_repeats(
    db: Database, fanout_of: Callable[..., Fanout]
) -> None:
    store = EventStore(db.pool)
    fanout = fanout_of()
    first = await store.append([event(f"r{i}") for i in range(4)])
    await store.append([event("other", "bob")])
    stream = await fanout.open(StreamFilter(), first[0].position, Principal("alice"), ping_s=30)
    chunks = aiter(stream)
    try:
        live = await store.append([event("r-live")])
        got: list[int] = []
        while len(got) < 4:
            got += [p for p, _ in parse(await asyncio.wait_for(anext(chunks), 5))]
        assert got == [e.position for e in first[1:] + live]
    finally:
        await stream.aclose()


async def test_a_quiet_stream_pings(fanout_of: Callable[..., Fanout]) -> None:
    fanout = fanout_of()
    stream = await fanout.open(StreamFilter(), None, Principal("alice"), ping_s=0.05)
    try:
        assert await asyncio.wait_for(anext(aiter(stream)), 5) == b": ping\n\n"
    finally:
        await stream.aclose()
