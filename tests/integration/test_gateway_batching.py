"""Gateway calls' `inference.*` records are written in batches after the responses (the real
app under uvicorn, real Postgres, a loopback OpenAI-format upstream): a response never waits
for its record, the records of a window share one transaction, shutdown writes what is still
queued, and records queued while the database is down are written once it is back."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.providers import InferenceLog
from orchestrator.runtime import EmbeddedPostgres
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.integration.test_gateway import gateway_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
WAIT_S = 20.0


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[OpenAIFake, FakeAnthropic]]:
    async with OpenAIFake(api_key="sk-openai") as oai, FakeAnthropic(api_key="sk-ant") as ant:
        yield oai, ant


async def _records(
    conn: asyncpg.Connection, request_ids: list[str], type_: str = "inference.complete"
) -> list[asyncpg.Record]:
    """The calls' records of one type (each call also has its `inference.request`)."""
    return list(
        await conn.fetch(
            "SELECT aggregate_id, type, xmin::text AS tx FROM events"
            " WHERE aggregate_id = ANY($1::text[]) AND type = $2",
            request_ids,
            type_,
        )
    )


async def _wait_for_records(
    conn: asyncpg.Connection, request_ids: list[str]
) -> list[asyncpg.Record]:
    """The calls' `inference.complete` records, once all are committed (polled: they are
    written by the app's background flusher, which nothing here can await)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        rows = await _records(conn, request_ids)
        if len(rows) >= len(request_ids) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)


async def _calls(app: ServedApp, n: int, *, stream_last: bool = False) -> list[str]:
    """`n` chat completions one after another (the last streamed if asked); their request
    ids. Each must answer while nothing can be written to the events table."""
    ids = []
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=10) as http:
        for i in range(n):
            if stream_last and i == n - 1:
                body: dict[str, Any] = {**CHAT, "stream": True}
                async with http.stream("POST", "/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    text = (await r.aread()).decode()
                assert text.endswith("data: [DONE]\n\n")
            else:
                r = await http.post("/chat/completions", json=CHAT)
                assert r.status_code == 200, r.text
            ids.append(r.headers["x-request-id"])
    return ids


async def test_responses_return_before_their_records_commit_and_records_are_batched(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    oai.script([FakeReply(text="ok", prompt_tokens=5, completion_tokens=2)] * 5)
    settings = gateway_settings(make_settings, oai, ant)
    async with ServedApp(settings) as app:
        blocker = await asyncpg.connect(settings.database_url)
        reader = await asyncpg.connect(settings.database_url)
        try:
            # Nothing can be appended to the events table until the blocker lets go: every
            # response below comes back all the same.
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("LOCK TABLE events IN SHARE MODE")
            try:
                ids = await asyncio.wait_for(_calls(app, 5, stream_last=True), WAIT_S)
                assert await _records(reader, ids) == []
                assert await _records(reader, ids, "inference.request") == []
            finally:
                await tx.rollback()
            rows = await _wait_for_records(reader, ids)
            starts = await _records(reader, ids, "inference.request")
        finally:
            await blocker.close()
            await reader.close()
    assert sorted(r["aggregate_id"] for r in rows) == sorted(ids)
    # Each call's start, queued as it began, is written with the outcomes (issue 33).
    assert sorted(r["aggregate_id"] for r in starts) == sorted(ids)
    # Batched: the one flush that was blocked, then one for everything queued behind it
    # (one transaction per call would be 5; the store's writers alone gave 4).
    assert len({r["tx"] for r in rows + starts}) <= 2


async def test_shutdown_writes_the_queued_records(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    oai.script([FakeReply(text="ok", prompt_tokens=5, completion_tokens=2)] * 3)
    # A flush window far longer than the test: only the shutdown can write these.
    settings = gateway_settings(make_settings, oai, ant, inference_log_flush_s=60.0)
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with ServedApp(settings) as app:
            ids = await _calls(app, 3, stream_last=True)
            assert await _records(conn, ids) == []  # queued, not written yet
        rows = await _records(conn, ids)  # no waiting: the app has stopped
    finally:
        await conn.close()
    assert sorted(r["aggregate_id"] for r in rows) == sorted(ids)


class _Logged(logging.Handler):
    """Sets `seen` when a record containing `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_records_queued_through_a_database_outage_are_written_after_it(
    tmp_path: Path,
) -> None:
    failed = _Logged("could not record")
    logging.getLogger("orchestrator.gateway").addHandler(failed)
    pg = EmbeddedPostgres(tmp_path / "own-pg")
    url = pg.start()
    db = await connect(url)
    inference = InferenceLog(EventStore(db.pool), flush_s=0.01)
    flusher = asyncio.create_task(inference.run())
    try:
        pg.stop()
        ids = [f"outage-{i}" for i in range(3)]
        for request_id in ids:
            inference.complete(
                request_id=request_id,
                user_uuid="admin",
                model="m",
                provider="openai",
                tokens_in=1,
                tokens_out=1,
                duration_ms=1,
                finish_reason="end_turn",
                stream=False,
            )
        await asyncio.wait_for(failed.seen.wait(), WAIT_S)  # a write failed: kept, retried
        pg.restart()
        conn = await asyncpg.connect(url)
        try:
            rows = await _wait_for_records(conn, ids)
        finally:
            await conn.close()
        assert sorted(r["aggregate_id"] for r in rows) == ids
    finally:
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
        logging.getLogger("orchestrator.gateway").removeHandler(failed)
        await db.close()
        pg.stop()
