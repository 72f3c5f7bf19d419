"""The memory cache's protocol (orchestrator/memory/_cache.py) against real Postgres and Redis,
several MemoryStores standing for replicas that share both: from a write's answer on every
replica reads it; a reader that read Postgres before a write cannot fill the cache after it;
a write whose caller goes away still drops the copy; a failed write leaves no copy of what
Postgres does not hold, and one that may commit late keeps readers from filling; Redis
unreachable costs nothing but cache hits, and a drop it missed is delivered when it is back."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.errors import NotFound
from orchestrator.events import EventStore
from orchestrator.memory import MemoryStore
from orchestrator.memory import _cache as memory_cache
from orchestrator.memory import _store as memory_store
from orchestrator.memory._cache import GUARD_SUFFIX, MemoryCache
from orchestrator.runtime.supervisor import Supervisor

DIM = 384
ANN = Principal("ann")
KEY = MemoryCache.key("ns", "ann", "k")


@dataclass
class Replicas:
    db: Database
    events: EventStore
    cache: aioredis.Redis
    made: list[MemoryStore] = field(default_factory=list)

    def memory(
        self, cache: aioredis.Redis | None = None, supervisor: Supervisor | None = None
    ) -> MemoryStore:
        store = MemoryStore(
            self.db.pool,
            self.events,
            cache or self.cache,
            DIM,
            pgvector=self.db.pgvector,
            supervisor=supervisor,
        )
        self.made.append(store)
        return store

    async def guard_passed(self) -> None:
        """As if the last write's guard had expired (GUARD_MS): reads fill the cache again."""
        await self.cache.delete(KEY + GUARD_SUFFIX)

    async def cached(self) -> bytes | None:
        raw = await self.cache.get(KEY)
        assert raw is None or isinstance(raw, bytes)
        return raw


@pytest.fixture
async def replicas(database_url: str, clean_redis: str) -> AsyncIterator[Replicas]:
    db = await connect(database_url)
    cache = aioredis.from_url(clean_redis)
    try:
        made = Replicas(db, EventStore(db.pool), cache)
        await made.memory().prepare()  # the pgvector column, as the service does at start
        yield made
        for memory in made.made:
            await memory.settle()
    finally:
        await cache.aclose()
        await db.close()


def held(
    target: Callable[..., Awaitable[Any]],
) -> tuple[Callable[..., Awaitable[Any]], asyncio.Event, asyncio.Event]:
    """`target` made to wait at its start until `gate` is set; `reached` is set on arrival."""
    reached, gate = asyncio.Event(), asyncio.Event()

    async def wait_then(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        await gate.wait()
        return await target(*args, **kwargs)

    return wait_then, reached, gate


async def test_from_a_stores_answer_every_replica_reads_it(replicas: Replicas) -> None:
    writer, r1, r2 = replicas.memory(), replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    assert (await r1.get("ns", "k", ANN)).value == "v1"
    assert b'"v1"' in (await replicas.cached() or b"")  # a copy, read from Postgres
    assert (await r2.get("ns", "k", ANN)).value == "v1"  # ... served from it
    for value in ("v2", "v3"):  # the second write within the same millisecond, likely
        await writer.store("ns", "k", value, ANN)
        assert (await r1.get("ns", "k", ANN)).value == value
        assert (await r2.get("ns", "k", ANN)).value == value


@pytest.mark.parametrize("write", ["store", "delete", "pin"])
async def test_a_reader_that_read_before_a_write_cannot_fill_after_it(
    replicas: Replicas, write: str
) -> None:
    """The stale-fill race: a replica reads v1 from Postgres (under its lease), another one
    writes and answers, then the first tries to fill: refused, every later read is new."""
    writer, reader = replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    assert reader._cache is not None
    reader._cache.fill, at_fill, gate = held(reader._cache.fill)  # type: ignore[method-assign]
    read = asyncio.ensure_future(reader.get("ns", "k", ANN))
    await asyncio.wait_for(at_fill.wait(), 10)  # v1 read from Postgres, not filled yet
    if write == "store":
        await writer.store("ns", "k", "v2", ANN)
    elif write == "delete":
        await writer.delete("ns", "k", ANN)
    else:
        await writer.pin("ns", "k", True, ANN)
    gate.set()
    old = await read  # concurrent with the write: the older value is a right answer
    assert old.value == "v1" and not old.pinned
    assert await replicas.cached() is None  # its fill was refused
    for replica in (reader, replicas.memory()):
        if write == "delete":
            with pytest.raises(NotFound):
                await replica.get("ns", "k", ANN)
        else:
            entry = await replica.get("ns", "k", ANN)
            assert (entry.value, entry.pinned) == (
                ("v2", False) if write == "store" else ("v1", True)
            )


@pytest.mark.parametrize("cut", ["in its statement", "after its commit"])
async def test_a_write_whose_caller_goes_away_still_drops_the_copy(
    replicas: Replicas, cut: str
) -> None:
    """The caller is cancelled while the statement runs, or once it has committed and its
    guard has not reached Redis: the write runs to its end, no replica is served v1."""
    writer, reader = replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    assert (await reader.get("ns", "k", ANN)).value == "v1"
    assert b'"v1"' in (await replicas.cached() or b"")
    assert writer._cache is not None
    if cut == "in its statement":
        hold, reached, gate = held(replicas.events.write)
        replicas.events.write = hold  # type: ignore[method-assign]
    else:
        hold, reached, gate = held(writer._cache.guard)  # the guard not in Redis yet
        writer._cache.guard = hold  # type: ignore[method-assign]
    store = asyncio.ensure_future(writer.store("ns", "k", "v2", ANN))
    await asyncio.wait_for(reached.wait(), 10)
    store.cancel()
    with pytest.raises(asyncio.CancelledError):
        await store
    gate.set()
    await writer.settle()  # the write, run to its end
    assert await replicas.cached() is None
    assert (await reader.get("ns", "k", ANN)).value == "v2"
    assert (await replicas.memory().get("ns", "k", ANN)).value == "v2"


async def test_a_write_slower_than_its_guard_drops_the_copy_after_it(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement that outlives its guard (GUARD_MS): a reader fills the old value
    meanwhile, and the write drops it after its commit, before it answers."""
    monkeypatch.setattr(memory_cache, "GUARD_MS", 50)
    monkeypatch.setattr(memory_store, "GUARD_MS", 50)
    writer, reader = replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    hold, reached, gate = held(replicas.events.write)
    replicas.events.write = hold  # type: ignore[method-assign]
    store = asyncio.ensure_future(writer.store("ns", "k", "v2", ANN))
    await asyncio.wait_for(reached.wait(), 10)
    async with asyncio.timeout(10):
        while await replicas.cache.exists(KEY + GUARD_SUFFIX):  # noqa: ASYNC110 - polling Redis
            await asyncio.sleep(0.01)
    assert (await reader.get("ns", "k", ANN)).value == "v1"  # not committed yet
    assert b'"v1"' in (await replicas.cached() or b"")  # ... and filled
    gate.set()
    await store
    assert await replicas.cached() is None
    for replica in (reader, replicas.memory()):
        assert (await replica.get("ns", "k", ANN)).value == "v2"


async def test_a_write_postgres_refuses_leaves_no_copy_of_it(replicas: Replicas) -> None:
    writer, reader = replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    assert (await reader.get("ns", "k", ANN)).value == "v1"  # cached
    with pytest.raises(asyncpg.PostgresError):
        await writer.store("ns", "k", "nul \x00 byte", ANN)  # text Postgres cannot hold
    assert b"nul" not in (await replicas.cached() or b"")
    for replica in (reader, writer, replicas.memory()):
        assert (await replica.get("ns", "k", ANN)).value == "v1"


async def test_a_write_that_may_commit_late_keeps_readers_from_filling(
    replicas: Replicas,
) -> None:
    """The connection is lost with the statement sent: the caller gets an error, and the
    server commits later. The key is poisoned, so a reader between the two fills nothing
    and cannot leave v1 cached once v2 has committed."""
    writer, reader = replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    assert (await reader.get("ns", "k", ANN)).value == "v1"  # cached
    sent: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    commit = replicas.events.write

    async def lost(*args: Any, **kwargs: Any) -> Any:
        sent.append((args, kwargs))
        raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")

    replicas.events.write = lost  # type: ignore[method-assign]
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        await writer.store("ns", "k", "v2", ANN)
    assert await replicas.cached() == b"X"
    assert (await reader.get("ns", "k", ANN)).value == "v1"  # from Postgres, not filled
    assert await replicas.cached() == b"X"
    await commit(*sent[0][0], **sent[0][1])  # the server commits it now
    for replica in (reader, writer, replicas.memory()):
        assert (await replica.get("ns", "k", ANN)).value == "v2"


@pytest.mark.parametrize("write", ["clear", "decay"])
async def test_a_write_of_several_rows_that_may_have_committed_leaves_no_copy(
    replicas: Replicas, write: str
) -> None:
    """The COMMIT of a clear (or decay) reaches the server, the answer is lost: the caller
    gets an error, the rows are gone, and no replica reads the old copy (its keys were
    poisoned before the COMMIT, since they are not known after it failed)."""
    writer, reader = replicas.memory(), replicas.memory()
    await writer.store("ns", "k", "v1", ANN)
    await replicas.guard_passed()
    assert (await reader.get("ns", "k", ANN)).value == "v1"  # cached
    transaction = replicas.events.transaction

    @contextlib.asynccontextmanager
    async def answer_lost() -> AsyncIterator[Any]:
        async with transaction() as tx:
            yield tx
        raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")

    replicas.events.transaction = answer_lost  # type: ignore[method-assign]
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        if write == "clear":
            await writer.clear("ns", ANN)
        else:
            await writer.decay(half_life_days=1.0, threshold=2.0)  # forgets every entry
    replicas.events.transaction = transaction  # type: ignore[method-assign]
    assert await replicas.cached() == b"X"
    for replica in (reader, writer, replicas.memory()):
        with pytest.raises(NotFound):
            await replica.get("ns", "k", ANN)


async def test_a_read_whose_access_event_fails_takes_the_failure(
    replicas: Replicas, caplog: pytest.LogCaptureFixture
) -> None:
    """`get` does not wait for its `memory.accessed` event; a failed append is logged as a
    warning, never left for the loop's "Future exception was never retrieved"."""
    memory = replicas.memory()
    await memory.store("ns", "k", "v1", ANN)
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    append = replicas.events.append

    def failing(*_: Any, **__: Any) -> asyncio.Future[Any]:
        failed: asyncio.Future[Any] = loop.create_future()
        failed.set_exception(asyncpg.ConnectionDoesNotExistError("connection lost"))
        return failed

    replicas.events.append = failing  # type: ignore[method-assign]
    try:
        assert (await memory.get("ns", "k", ANN)).value == "v1"
        await asyncio.sleep(0)  # the done-callback runs
        gc.collect()
    finally:
        replicas.events.append = append  # type: ignore[method-assign]
        loop.set_exception_handler(None)
    assert unretrieved == []
    assert "memory.accessed event not recorded" in caplog.text


class RedisProxy:
    """TCP in front of the test Redis (a unix socket). `cut()` breaks every connection and
    refuses new ones, as a Redis this replica cannot reach; `restore()` ends that."""

    def __init__(self, redis_url: str) -> None:
        assert redis_url.startswith("unix://")
        self._path = redis_url.removeprefix("unix://")
        self._up = True
        self._transports: set[asyncio.BaseTransport] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}"

    def cut(self) -> None:
        self._up = False
        for transport in self._transports:
            transport.abort()
        self._transports.clear()

    def restore(self) -> None:
        self._up = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_unix_connection(self._path)
        self._transports |= {writer.transport, up_writer.transport}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._transports -= {writer.transport, up_writer.transport}


@pytest.fixture
async def proxy(clean_redis: str) -> AsyncIterator[RedisProxy]:
    made = RedisProxy(clean_redis)
    try:
        yield made
    finally:
        await made.close()


async def test_redis_unreachable_costs_cache_hits_only(
    replicas: Replicas, proxy: RedisProxy
) -> None:
    """Every operation works against Postgres while Redis cannot be reached."""
    cut_off = aioredis.from_url(await proxy.start(), socket_timeout=1, socket_connect_timeout=1)
    try:
        proxy.cut()
        memory = replicas.memory(cut_off)
        await memory.store("ns", "k", "v1", ANN)
        await memory.store("ns", "k2", "other", ANN)
        assert (await memory.get("ns", "k", ANN)).value == "v1"
        await memory.pin("ns", "k", True, ANN)
        assert (await memory.get("ns", "k", ANN)).pinned
        await memory.store("ns", "k", "v2", ANN)
        assert (await memory.get("ns", "k", ANN)).value == "v2"
        await memory.delete("ns", "k", ANN)
        with pytest.raises(NotFound):
            await memory.get("ns", "k", ANN)
        assert await memory.share("ns", "ns2", "k*") == 1
        assert await memory.clear("ns", ANN) == 1
        assert [e.key for e in await memory.entries("ns2", ANN, 10, 0)] == ["k2"]
        await memory.settle()
    finally:
        await cut_off.aclose()


@pytest.mark.parametrize("supervised", [False, True])
async def test_a_drop_redis_missed_is_delivered_when_it_answers_again(
    replicas: Replicas, proxy: RedisProxy, supervised: bool
) -> None:
    """The writer's replica cannot reach Redis when it stores v2: the store answers (Redis
    is a cache), that replica reads Postgres while it owes the drop, and the drop reaches
    Redis once it is reachable again, so the other replicas stop serving v1. With the
    process's supervisor, the retries run as its task `memory-cache-dels`."""
    cut_off = aioredis.from_url(await proxy.start(), socket_timeout=1, socket_connect_timeout=1)
    supervisor = Supervisor("test") if supervised else None
    try:
        writer, reader = replicas.memory(cut_off, supervisor), replicas.memory()
        await writer.store("ns", "k", "v1", ANN)
        await replicas.guard_passed()
        assert (await reader.get("ns", "k", ANN)).value == "v1"
        assert b'"v1"' in (await replicas.cached() or b"")
        proxy.cut()
        await writer.store("ns", "k", "v2", ANN)
        if supervisor is not None:
            assert "memory-cache-dels" in supervisor.tasks()
        assert (await writer.get("ns", "k", ANN)).value == "v2"
        proxy.restore()
        async with asyncio.timeout(20):
            while await replicas.cached() is not None:  # noqa: ASYNC110 - polling Redis
                await asyncio.sleep(0.05)
        assert (await reader.get("ns", "k", ANN)).value == "v2"
        async with asyncio.timeout(20):  # nothing owed: the writer uses the cache again
            while writer._cache is not None and writer._cache._owed:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert (await writer.get("ns", "k", ANN)).value == "v2"
        assert b'"v2"' in (await replicas.cached() or b"")
        await writer.settle()
    finally:
        if supervisor is not None:
            await supervisor.aclose()
        await cut_off.aclose()
