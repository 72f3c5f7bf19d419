"""Supervised background loops of a replica (no Ray): the SSE fan-out and the live feed
survive failures, and the lifespan unwinds a failed start and awaits its loops on shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployments.api import create_app
from orchestrator.db import connect
from orchestrator.events import EventStore, NewEvent
from orchestrator.events._feed import EventFeed
from orchestrator.runtime import EmbeddedPostgres
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.sse import sse_frames

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _append(url: str, task_id: str) -> int:
    db = await connect(url)
    try:
        [event] = await EventStore(db.pool).append(
            [NewEvent("task.created", {"task_id": task_id}, "admin")]
        )
        return event.position
    finally:
        await db.close()


async def _next_event(frames: AsyncIterator[dict[str, str]]) -> dict[str, Any]:
    async for frame in frames:
        if "id" in frame:
            return json.loads(frame["data"])  # type: ignore[no-any-return]
    raise AssertionError("the stream ended")


class _Seen(logging.Handler):
    """Sets `seen` when a record containing `text` is logged (from any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_store_error_at_the_first_sse_request_recovers(make_settings, tmp_path) -> None:
    pump_failed = _Seen("event-fanout failed")
    logging.getLogger("orchestrator.runtime.supervisor").addHandler(pump_failed)
    pg = EmbeddedPostgres(tmp_path / "own-pg")
    url = pg.start()
    try:
        async with (
            ServedApp(make_settings(database_url=url)) as app,
            httpx.AsyncClient(base_url=app.url, timeout=30) as c,
        ):
            assert (await c.get("/api/v1/whoami", headers=ADMIN)).status_code == 200  # cached
            pg.stop()

            async def first_stream() -> None:
                # The replica's first stream starts the fan-out, whose first read fails.
                async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN) as r:
                    async for _ in r.aiter_bytes():
                        pass

            first = asyncio.create_task(first_stream())
            # Wait for the failure that used to wedge the fan-out (bounded: the old code
            # logged nothing, and then failed below).
            await asyncio.to_thread(pump_failed.seen.wait, 10)
            pg.restart()
            # The next stream connects and carries live events within seconds.
            async with asyncio.timeout(20):
                async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN) as r:
                    frames = sse_frames(r)
                    while (await anext(frames)) != {"comment": "connected"}:
                        pass
                    position = await _append(url, "after-outage")
                    event = await _next_event(frames)
            assert event["data"]["task_id"] == "after-outage" and event["position"] == position
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
    finally:
        logging.getLogger("orchestrator.runtime.supervisor").removeHandler(pump_failed)
        pg.stop()


def _restarts(text: str, task: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "svc_background_restarts_total" and s.labels == {"task": task}:
                return s.value
    return 0.0


async def test_an_exception_in_the_live_feed_restarts_it(
    make_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    raised = threading.Event()
    real_advance = EventFeed._advance

    async def advance_failing_once(self: EventFeed) -> None:
        if not raised.is_set():
            raised.set()
            raise RuntimeError("injected: a bug in the live feed")  # none of the four it caught
        await real_advance(self)

    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=30) as c:
        async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN) as r:
            frames = sse_frames(r)
            assert (await anext(frames)) == {"comment": "connected"}
            monkeypatch.setattr(EventFeed, "_advance", advance_failing_once)
            await asyncio.to_thread(raised.wait, 10)
            assert raised.is_set()
            position = await _append(settings.database_url, "after-the-bug")
            async with asyncio.timeout(15):
                event = await _next_event(frames)
            assert event["position"] == position
        # Counted where operators look: /metrics (the replica flushes every second).
        for _ in range(75):
            if _restarts((await c.get("/api/v1/metrics")).text, "event-feed") >= 1:
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail("svc_background_restarts_total{task=event-feed} never reached /metrics")


async def _lingering(before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    await asyncio.sleep(0)  # let callbacks of what was just cancelled run
    return [t for t in asyncio.all_tasks() if t not in before and not t.done()]


async def _connections(admin_url: str, database: str) -> int:
    conn = await asyncpg.connect(admin_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                database,
            )
        )
    finally:
        await conn.close()


async def test_a_start_failing_halfway_unwinds_what_started(make_settings) -> None:
    settings = make_settings()
    db = await connect(settings.database_url)  # migrated
    try:
        # A real failure late in the start: the configured admin token cannot be stored.
        await db.pool.execute(
            """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'api_tokens is read-only today'; END $$;
               CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON api_tokens
               FOR EACH ROW EXECUTE FUNCTION refuse();"""
        )
        database = await db.pool.fetchval("SELECT current_database()")
    finally:
        await db.close()
    app = create_app(settings)
    before = asyncio.all_tasks()
    with pytest.raises(asyncpg.RaiseError, match="read-only today"):
        async with app.router.lifespan_context(app):
            pytest.fail("the start should have failed")
    assert await _lingering(before) == []  # the live feed, the engine: cancelled and awaited
    assert app.state.services.gateway.http.is_closed
    deadline = time.monotonic() + 10
    while (n := await _connections(settings.database_url, database)) > 0:
        assert time.monotonic() < deadline, f"{n} connections of the failed start left open"
        await asyncio.sleep(0.1)


async def test_shutdown_cancels_and_awaits_every_loop(make_settings) -> None:
    app = create_app(make_settings())
    before = asyncio.all_tasks()
    async with app.router.lifespan_context(app):
        started = [t for t in asyncio.all_tasks() if t not in before]
        assert len(started) >= 3  # metrics flush, scheduler, heartbeat, the live feed
    assert [t for t in started if not t.done()] == []
