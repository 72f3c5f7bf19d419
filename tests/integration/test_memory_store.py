"""MemoryStore against real Postgres (pgvector) and Redis: the store is one statement with
its events, the cache never serves a value older than what was acknowledged (two stores in
one millisecond, a reader that read before a write and caches after it, a delete), and
embeddings are filled behind: an entry is found by key and text at once, by vector once
the filler has embedded it."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

import orchestrator.memory._store as memory_store
from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.errors import NotFound
from orchestrator.events import EventStore
from orchestrator.memory import LocalEmbedder, MemoryStore
from orchestrator.memory._embed import BEHIND_NICENESS

DIM = 384
ANN = Principal("ann")


@dataclass
class Stores:
    db: Database
    events: EventStore
    cache: aioredis.Redis

    made: list[MemoryStore] = field(default_factory=list)

    def memory(self, embedder: object | None = None) -> MemoryStore:
        store = MemoryStore(
            self.db.pool,
            self.events,
            self.cache,
            DIM,
            pgvector=self.db.pgvector,
            embedder=embedder,  # type: ignore[arg-type]
        )
        self.made.append(store)
        return store


@pytest.fixture
async def stores(database_url: str, clean_redis: str) -> AsyncIterator[Stores]:
    db = await connect(database_url)
    cache = aioredis.from_url(clean_redis)
    try:
        made = Stores(db, EventStore(db.pool), cache)
        await made.memory().prepare()  # the pgvector column, as the service does at start
        yield made
        for memory in made.made:  # their queued write-backs, before Redis closes (as the app)
            await memory.settle()
    finally:
        await cache.aclose()
        await db.close()


async def _version(s: Stores, key: str) -> int:
    value = await s.db.pool.fetchval(
        "SELECT updated_at FROM memory_entries WHERE agent_id = 'ns' AND key = $1", key
    )
    assert isinstance(value, int)
    return value


async def test_store_writes_entry_and_events_together(stores: Stores) -> None:
    memory = stores.memory()
    committed: list[str] = []

    async def seen(events: list[object]) -> None:
        committed.extend(e.type for e in events)  # type: ignore[attr-defined]

    stores.events.add_post_commit_hook(seen)
    await memory.store("ns", "reflection:today", "calm", ANN)
    rows = await stores.db.pool.fetch(
        "SELECT type, seq, user_uuid FROM events WHERE aggregate_id = 'ns' ORDER BY position"
    )
    assert [(r["type"], r["seq"], r["user_uuid"]) for r in rows] == [
        ("memory.stored", 1, "ann"),
        ("memory.reflected", 2, "ann"),
    ]
    assert committed == ["memory.stored", "memory.reflected"]
    assert (await memory.get("ns", "reflection:today", ANN)).value == "calm"


async def test_two_stores_in_one_millisecond_never_leave_the_older_cached(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cached copy's version is the row's updated_at; a second store in the same
    millisecond (or with a clock behind) still makes a newer version."""
    memory = stores.memory()
    monkeypatch.setattr(memory_store, "now_ms", lambda: 1_700_000_000_000)
    await memory.store("ns", "k", "v1", ANN)
    assert (await memory.get("ns", "k", ANN)).value == "v1"  # cached now
    await memory.store("ns", "k", "v2", ANN)
    assert (await memory.get("ns", "k", ANN)).value == "v2"
    assert (await stores.memory().get("ns", "k", ANN)).value == "v2"  # another replica


async def test_a_reader_that_read_before_a_store_cannot_cache_the_older_value(
    stores: Stores,
) -> None:
    """A replica reads v1 from Postgres, another stores v2 (acknowledged), then the first
    puts its v1 into the cache: the put is refused, every later read sees v2."""
    writer, reader = stores.memory(), stores.memory()
    await writer.store("ns", "k", "v1", ANN)
    old = await reader.get("ns", "k", ANN)
    old_version = await _version(stores, "k")
    await stores.cache.flushdb()  # the reader's copy expired meanwhile
    await writer.store("ns", "k", "v2", ANN)
    # The late put of what it read before the store.
    await reader._cache(old, old_version, reader=True)
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    assert (await stores.memory().get("ns", "k", ANN)).value == "v2"


async def test_a_reader_that_read_before_a_delete_cannot_bring_it_back(stores: Stores) -> None:
    writer, reader = stores.memory(), stores.memory()
    await writer.store("ns", "k", "v1", ANN)
    old = await reader.get("ns", "k", ANN)
    old_version = await _version(stores, "k")
    await writer.delete("ns", "k", ANN)
    await reader._cache(old, old_version, reader=True)
    with pytest.raises(NotFound):
        await reader.get("ns", "k", ANN)
    # A new store after the delete is read back, whatever the tombstone's version.
    await writer.store("ns", "k", "v3", ANN)
    assert (await reader.get("ns", "k", ANN)).value == "v3"


async def test_late_write_backs_in_reverse_order_leave_the_newest(stores: Stores) -> None:
    """Two stores in flight on two replicas; the newer one's write-back lands first, the
    older one's last: every read after both acknowledgements sees the newer value."""
    a, b, reader = stores.memory(), stores.memory(), stores.memory()
    await a.store("ns", "k", "v0", ANN)
    await reader.get("ns", "k", ANN)  # cached
    key = a._cache_key("ns", "ann", "k")
    assert await a._mark_writing(key) and await b._mark_writing(key)  # both in flight
    # The statements commit v1 then v2 (versions are the row's updated_at).
    v0 = await _version(stores, "k")
    await stores.db.pool.execute(
        "UPDATE memory_entries SET value = 'v2', updated_at = $1 WHERE key = 'k'", v0 + 2
    )
    # A read while both are in flight: Postgres, and nothing cached from it.
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    entry = await reader.get("ns", "k", ANN)
    b._after_store(key, entry, v0 + 2)
    await b.settle()
    stale = memory_store.Entry("ns", "k", "v1", "ann", entry.created_at, None, False)
    a._after_store(key, stale, v0 + 1)
    await a.settle()
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    assert (await stores.memory().get("ns", "k", ANN)).value == "v2"


async def test_a_store_answers_before_its_copy_is_cached_and_reads_see_it(
    stores: Stores,
) -> None:
    """The write-back is after the answer: a read between the two finds the tombstone the
    mark left (not the old copy) and reads Postgres; once written back, the copy is used."""
    writer, reader = stores.memory(), stores.memory()
    await writer.store("ns", "k", "v1", ANN)
    await writer.settle()
    assert (await reader.get("ns", "k", ANN)).value == "v1"
    real = writer._after_store
    held: list[tuple[str, memory_store.Entry | None, int | None]] = []
    writer._after_store = lambda *call: held.append(call)  # type: ignore[method-assign]
    await writer.store("ns", "k", "v2", ANN)
    raw = await stores.cache.get(writer._cache_key("ns", "ann", "k"))
    assert raw is not None and raw.decode().endswith("|")  # a tombstone, not v1
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    assert await stores.cache.get(writer._cache_key("ns", "ann", "k")) == raw  # not cached
    real(*held[0])  # the write-back, late
    await writer.settle()
    raw = await stores.cache.get(writer._cache_key("ns", "ann", "k"))
    assert raw is not None and b'"v2"' in raw
    assert (await reader.get("ns", "k", ANN)).value == "v2"


async def test_a_store_cancelled_after_its_commit_still_replaces_the_cached_copy(
    stores: Stores,
) -> None:
    """The caller goes away once the entry is committed but before the store's mark has
    reached Redis: the mark still runs (and the write-back after it), so no process is
    served the older cached copy."""
    writer, reader = stores.memory(), stores.memory()
    await writer.store("ns", "k", "v1", ANN)
    await writer.settle()
    assert (await reader.get("ns", "k", ANN)).value == "v1"  # cached
    assert writer._writer is not None
    gate = asyncio.Event()
    real_now = writer._writer.now

    async def held_now(*call: object) -> object:  # the mark, held until the gate opens
        await gate.wait()
        return await real_now(*call)  # type: ignore[arg-type]

    writer._writer.now = held_now  # type: ignore[method-assign]
    committed = asyncio.Event()
    real_append = stores.events.append_with

    async def append_with(*call: object) -> object:
        done = await real_append(*call)  # type: ignore[arg-type]
        # From here the store runs without awaiting until it waits for its mark.
        committed.set()
        return done

    stores.events.append_with = append_with  # type: ignore[method-assign]
    store = asyncio.ensure_future(writer.store("ns", "k", "v2", ANN))
    await asyncio.wait_for(committed.wait(), 10)
    store.cancel()  # while it waits for its mark
    with pytest.raises(asyncio.CancelledError):
        await store
    gate.set()
    key = writer._cache_key("ns", "ann", "k")
    async with asyncio.timeout(10):  # the mark ran: the v1 copy is gone
        while b'"v1"' in (await stores.cache.get(key) or b""):  # noqa: ASYNC110 - polling Redis
            await asyncio.sleep(0.01)
    await writer.settle()
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    assert (await stores.memory().get("ns", "k", ANN)).value == "v2"


async def test_a_write_back_that_never_comes_only_costs_cache_hits(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process died between its answer and its write-back: readers read Postgres
    (the acknowledged value) and cache again once the mark has expired."""
    monkeypatch.setattr(memory_store, "PENDING_TTL_MS", 300)
    writer, reader = stores.memory(), stores.memory()
    await writer.store("ns", "k", "v1", ANN)
    await writer.settle()
    await reader.get("ns", "k", ANN)
    writer._after_store = lambda *a: None  # type: ignore[method-assign]
    await writer.store("ns", "k", "v2", ANN)
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    key = writer._cache_key("ns", "ann", "k")
    deadline = asyncio.get_running_loop().time() + 10
    while await stores.cache.exists(writer._pending_key(key)):
        assert asyncio.get_running_loop().time() < deadline, "the mark never expired"
        await asyncio.sleep(0.05)
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    raw = await stores.cache.get(key)
    assert raw is not None and b'"v2"' in raw  # cached again


class GatedEmbedder:
    """Embeds only once `gate` opens (a slow provider); `entered` is set when asked."""

    name = "test:gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def embed(self, texts: list[str], *, behind: bool = False) -> list[list[float]]:
        self.entered.set()
        await self.gate.wait()
        return [[1.0 if i == len(t) % DIM else 0.0 for i in range(DIM)] for t in texts]


async def test_store_returns_before_the_embedding_and_vector_search_finds_it_after(
    stores: Stores,
) -> None:
    assert stores.db.pgvector, "the test database has pgvector (embedded Postgres ships it)"
    embedder = GatedEmbedder()
    memory = stores.memory(embedder)
    filler = asyncio.create_task(memory.run_filler())
    try:
        value = "the deploy key rotates on fridays"
        await memory.store("ns", "deploy", value, ANN)  # returns with the embedder stuck
        await asyncio.wait_for(embedder.entered.wait(), 10)  # the filler has it, not the store
        assert (await memory.get("ns", "deploy", ANN)).value == value
        assert [e.key for e in await memory.search("ns", "deploy key", ANN, 10)] == ["deploy"]
        vector = [1.0 if i == len(value) % DIM else 0.0 for i in range(DIM)]
        assert await memory.vector_search("ns", vector, ANN, 10, 0.9) == []
        embedder.gate.set()
        deadline = time.monotonic() + 20
        while not await memory.vector_search("ns", vector, ANN, 10, 0.9):
            assert time.monotonic() < deadline, "the filler did not embed the entry"
            await asyncio.sleep(0.02)
        pending = await stores.db.pool.fetchval(
            "SELECT embed_pending FROM memory_entries WHERE key = 'deploy'"
        )
        assert pending is False
    finally:
        filler.cancel()
        await asyncio.gather(filler, return_exceptions=True)


class _NicenessEmbedder(LocalEmbedder):
    """The real LocalEmbedder's threads and priorities; its model swapped for a recorder of
    the niceness of the thread each embedding runs in."""

    def __init__(self) -> None:
        super().__init__(1)
        self.niceness: list[int] = []

    def embed_sync(self, texts: list[str]) -> list[list[float]]:
        self.niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        self._session = self._session or "loaded"  # the first call loads the model
        return [[1.0 if i == len(t) % DIM else 0.0 for i in range(DIM)] for t in texts]


@pytest.mark.skipif(sys.platform != "linux", reason="thread niceness is set on Linux only")
async def test_the_filler_embeds_at_the_lowest_priority_and_a_search_query_does_not(
    stores: Stores,
) -> None:
    """Filling embeddings in behind the stores yields the CPU to them (issue 17: the local
    embedder took the CPU the stores needed); a caller waiting for an embedding is not."""
    embedder = _NicenessEmbedder()
    memory = stores.memory(embedder)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    await memory.store("ns", "nice", "filled in behind", ANN)
    assert await memory.fill_embeddings() == 1
    # Loaded at the process's priority (the threads it starts inherit it), then filled at
    # the lowest.
    assert embedder.niceness == [own, BEHIND_NICENESS]
    assert own < BEHIND_NICENESS, "the test process already runs at the lowest priority"
    await memory.embed_query("what was filled in")
    assert embedder.niceness == [own, BEHIND_NICENESS, own]


class _TimedEmbedder:
    """Records when each embedding call was made (monotonic time) and which texts it was
    given; `wait_for(texts)` returns once all of them have been embedded."""

    name = "test:timed"

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.embedded: set[str] = set()
        self._more = asyncio.Condition()

    async def wait_for(self, texts: set[str], within: float = 30) -> None:
        async with self._more:
            await asyncio.wait_for(self._more.wait_for(lambda: texts <= self.embedded), within)

    async def embed(self, texts: list[str], *, behind: bool = False) -> list[list[float]]:
        self.calls.append(time.monotonic())
        async with self._more:
            self.embedded.update(texts)
            self._more.notify_all()
        return [[1.0 if i == len(t) % DIM else 0.0 for i in range(DIM)] for t in texts]


async def test_the_filler_yields_to_a_burst_of_stores_but_not_past_its_longest_wait(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17: embeddings are filled behind without slowing the stores. While this
    process keeps storing (gaps shorter than FILL_QUIET_S) the filler waits, but never
    longer than FILL_MAX_WAIT_S after the oldest unfilled store; then it catches up."""
    quiet, longest = 1.0, 3.0
    monkeypatch.setattr(memory_store, "FILL_QUIET_S", quiet)
    monkeypatch.setattr(memory_store, "FILL_MAX_WAIT_S", longest)
    embedder = _TimedEmbedder()
    memory = stores.memory(embedder)
    await memory.store("burst", "k0", "entry 0", ANN)
    stored = [memory._last_store]  # when each store of the burst was counted
    filler = asyncio.create_task(memory.run_filler())
    try:
        # Back to back (each store takes milliseconds) until the filler runs.
        n = 1
        while not embedder.calls:
            assert time.monotonic() - stored[0] < 30, "the filler never ran during the burst"
            await memory.store("burst", f"k{n}", f"entry {n}", ANN)
            stored.append(memory._last_store)
            n += 1
        first_call = embedder.calls[0]
        before = [t for t in stored if t < first_call]
        gaps = [b - a for a, b in zip(before, [*before[1:], first_call], strict=True)]
        # It ran only once the longest wait was over, or after a quiet gap (a store that
        # took a whole second on a loaded machine): never while the stores kept coming.
        assert first_call - stored[0] >= longest - 0.05 or max(gaps) >= quiet - 0.05, (
            first_call - stored[0],
            max(gaps),
        )
        # It catches up with the whole burst.
        await embedder.wait_for({f"entry {i}" for i in range(n)})
        # ... and has read a batch short of full since (while batches come full it keeps
        # filling, past the quiet gap: a store in that window is filled at once).
        async with asyncio.timeout(10):
            while memory._unfilled_since is not None:  # noqa: ASYNC110 - the filler's state
                await asyncio.sleep(0.01)
        # One more store on its own: filled once the quiet gap after it has passed.
        await memory.store("burst", f"k{n}", "after the burst", ANN)
        last = memory._last_store
        await embedder.wait_for({"after the burst"})
        assert embedder.calls[-1] - last >= quiet - 0.05  # it waited for the quiet gap
    finally:
        filler.cancel()
        await asyncio.gather(filler, return_exceptions=True)
