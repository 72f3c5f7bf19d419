"""MemoryStore against real Postgres (pgvector) and Redis: the store is one statement with
its events, and embeddings are filled behind: an entry is found by key and text at once, by
vector once the filler has embedded it. The cache's protocol: test_memory_cache.py."""

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

import orchestrator.memory._filler as memory_filler
from orchestrator.auth import Principal
from orchestrator.db import Database, connect
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
        for memory in made.made:  # before Redis closes (as the app)
            await memory.settle()
    finally:
        await cache.aclose()
        await db.close()


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
    monkeypatch.setattr(memory_filler, "FILL_QUIET_S", quiet)
    monkeypatch.setattr(memory_filler, "FILL_MAX_WAIT_S", longest)
    embedder = _TimedEmbedder()
    memory = stores.memory(embedder)
    await memory.store("burst", "k0", "entry 0", ANN)
    stored = [memory._filler._last_store]  # when each store of the burst was counted
    filler = asyncio.create_task(memory.run_filler())
    try:
        # Back to back (each store takes milliseconds) until the filler runs.
        n = 1
        while not embedder.calls:
            assert time.monotonic() - stored[0] < 30, "the filler never ran during the burst"
            await memory.store("burst", f"k{n}", f"entry {n}", ANN)
            stored.append(memory._filler._last_store)
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
            while memory._filler._unfilled_since is not None:  # noqa: ASYNC110 - the filler's state
                await asyncio.sleep(0.01)
        # One more store on its own: filled once the quiet gap after it has passed.
        await memory.store("burst", f"k{n}", "after the burst", ANN)
        last = memory._filler._last_store
        await embedder.wait_for({"after the burst"})
        assert embedder.calls[-1] - last >= quiet - 0.05  # it waited for the quiet gap
    finally:
        filler.cancel()
        await asyncio.gather(filler, return_exceptions=True)
