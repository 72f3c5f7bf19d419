"""Channel relays own inbox items through claims (orchestrator/runtime/claims.py; real
Postgres, a loopback server as the generic webhook's callback): a relay whose claim ran out
and was taken over (a paused process, an old hub generation) can record neither an answer nor
a delivery for the item, and the new holder finishes it once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.auth import Principal
from orchestrator.channels import ChannelRelay, ChannelStore, EgressPolicy, secret_box
from orchestrator.db import Database, connect
from orchestrator.runtime.claims import ClaimStore, StaleClaim
from tests.fakes._loopback import RecordedRequest, Send
from tests.integration.test_channels_api import Callback, _has, _until

KIND = "channel_item"


class _Agent:
    """Answers `reply`; with `gate`, only once the test opens it (a relay paused mid-task)."""

    def __init__(self, reply: str, gate: asyncio.Event | None = None) -> None:
        self.reply = reply
        self.gate = gate
        self.started = asyncio.Event()
        self.runs = 0

    async def run(self, task: AgentTask) -> TaskResult:
        self.runs += 1
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        return TaskResult(task.task_id, "completed", self.reply, None, 1, "test")


@pytest.fixture
async def callback() -> AsyncIterator[Callback]:
    async with Callback() as server:
        yield server


class _HeldCallback(Callback):
    """Holds the first delivery until the test lets it go, then answers it 503 (a relay
    paused in mid-delivery, whose send then fails); answers every later one 200."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()  # the server runs in its own thread
        self.let_go = threading.Event()

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if len(self.requests) == 1:
            self.holding.set()
            await asyncio.to_thread(self.let_go.wait, 20)
            await self.send_body(send, 503, b"busy", [("content-type", "text/plain")])
            return
        await super().handle(request, send)


@pytest.fixture
async def db(make_settings: Any) -> AsyncIterator[Database]:
    database = await connect(make_settings().database_url)
    try:
        yield database
    finally:
        await database.close()


async def _item(db: Database, callback: Callback, tmp_path: Any) -> tuple[ChannelStore, int]:
    store = ChannelStore(db.pool, secret_box(None, tmp_path), egress=EgressPolicy(["127.0.0.0/8"]))
    channel, _ = await store.create(
        Principal("ann"), "webhook", "w", {"callback_url": callback.url}
    )
    inbox_id = await store.enqueue(
        channel.id,
        delivery_id="d1",
        conversation="c",
        text="hi",
        sender=None,
        reply={"conversation": "c"},
    )
    assert inbox_id is not None
    return store, inbox_id


async def _turns(db: Database) -> list[tuple[str, str]]:
    rows = await db.pool.fetch("SELECT role, text FROM channel_turns ORDER BY id")
    return [(r["role"], r["text"]) for r in rows]


async def test_a_relay_whose_claim_was_taken_over_records_no_answer(
    make_settings: Any, db: Database, callback: Callback, tmp_path: Any
) -> None:
    settings = make_settings(outbound_allowed_cidrs=["127.0.0.0/8"])
    store, inbox_id = await _item(db, callback, tmp_path)
    claims = ClaimStore(db.pool, ttl_ms=60_000)
    gate = asyncio.Event()
    paused = _Agent("stale answer", gate)
    async with httpx.AsyncClient() as http:
        stale = ChannelRelay(store, paused, settings, http, name="hub-old")
        stale_run = asyncio.create_task(stale.answer(inbox_id, 30))
        await asyncio.wait_for(paused.started.wait(), 10)  # hub-old is inside the agent task
        held = await claims.holder(KIND, str(inbox_id))
        assert held is not None and held[0] == "hub-old" and held[2]
        # hub-old stops renewing (a paused process): its claim runs out...
        await db.pool.execute(
            "UPDATE claims SET expires_at = 0 WHERE kind = $1 AND key = $2", KIND, str(inbox_id)
        )
        # ...the item is due for another relay, which takes it over and finishes it.
        fresh = _Agent("new answer")
        new = ChannelRelay(store, fresh, settings, http, name="hub-new")
        assert await store.due(0, 1, "hub-new") == [inbox_id]
        assert await new.answer(inbox_id, 10) == "new answer"
        await _until(lambda: _has(callback, 1))
        # hub-old wakes up: its answer is refused, it sends nothing and charges nothing.
        gate.set()
        assert await asyncio.wait_for(stale_run, 10) is None
    item = await store.item(inbox_id)
    assert item is not None and item.state == "done", item
    assert item.answer == "new answer" and item.attempts == 0 and item.error is None
    assert await _turns(db) == [("user", "hi"), ("assistant", "new answer")]
    assert len(callback.requests) == 1 and b"new answer" in callback.requests[0].raw
    assert await claims.holder(KIND, str(inbox_id)) is None  # released when done
    assert await store.due(0, 1, "hub-old") == []


async def test_a_stale_fence_writes_nothing_of_an_item(
    db: Database, callback: Callback, tmp_path: Any
) -> None:
    store, inbox_id = await _item(db, callback, tmp_path)
    claims = ClaimStore(db.pool, ttl_ms=60_000)
    key = str(inbox_id)
    old = await claims.acquire(KIND, key, "hub-old")
    assert old is not None
    assert await claims.acquire(KIND, key, "hub-new") is None  # held: no
    assert await store.due(0, 1, "hub-new") == []  # nor is it due for another relay
    assert await store.due(0, 1, "hub-old") == [inbox_id]
    await db.pool.execute(
        "UPDATE claims SET expires_at = 0 WHERE kind = $1 AND key = $2", KIND, key
    )
    new = await claims.acquire(KIND, key, "hub-new")
    assert new is not None and new.epoch > old.epoch
    item = await store.item(inbox_id)
    assert item is not None
    with pytest.raises(StaleClaim):
        await store.answered(item, "stale", "chan-x", deliver=True, fence=old)
    with pytest.raises(StaleClaim):
        await store.sent(inbox_id, fence=old)
    with pytest.raises(StaleClaim):
        await store.retry_later(inbox_id, "stale", 1.0, fence=old)
    with pytest.raises(StaleClaim):
        await store.give_up(inbox_id, "stale", fence=old)
    unchanged = await store.item(inbox_id)
    assert unchanged == item  # pending, no answer, no attempt, no error
    assert await _turns(db) == []
    # The holder answers (the claim kept for the delivery), then records the delivery.
    await store.answered(item, "fine", "chan-y", deliver=True, fence=new)
    assert await claims.holder(KIND, key) == ("hub-new", new.epoch, True)
    await store.sent(inbox_id, fence=new)
    done = await store.item(inbox_id)
    assert done is not None and done.state == "done" and done.answer == "fine"
    assert await claims.holder(KIND, key) is None  # released in the commit that finished it
    with pytest.raises(StaleClaim):
        await store.sent(inbox_id, fence=new)  # no claim left to write under


async def test_a_relay_taken_over_in_mid_delivery_records_nothing(
    make_settings: Any, db: Database, tmp_path: Any
) -> None:
    """hub-old's delivery is under way when its claim runs out and hub-new takes the item
    over and delivers it; hub-old's send then fails, and its retry is refused: no attempt,
    no error, no failure counted against the channel. Each holder sent at most once."""
    settings = make_settings(outbound_allowed_cidrs=["127.0.0.0/8"])
    async with _HeldCallback() as callback:
        store, inbox_id = await _item(db, callback, tmp_path)
        async with httpx.AsyncClient() as http:
            old = ChannelRelay(store, _Agent("the answer"), settings, http, name="hub-old")
            old_run = asyncio.create_task(old.answer(inbox_id, 30))
            assert await asyncio.to_thread(callback.holding.wait, 10)  # hub-old is sending
            await db.pool.execute(
                "UPDATE claims SET expires_at = 0 WHERE kind = $1 AND key = $2",
                KIND,
                str(inbox_id),
            )
            new_agent = _Agent("never asked")
            new = ChannelRelay(store, new_agent, settings, http, name="hub-new")
            assert await new.answer(inbox_id, 10) == "the answer"  # delivered, not re-answered
            assert new_agent.runs == 0
            callback.let_go.set()
            assert await asyncio.wait_for(old_run, 10) is None
        assert len(callback.requests) == 2  # one per holder
    item = await store.item(inbox_id)
    assert item is not None and item.state == "done", item
    assert item.attempts == 0 and item.error is None
    channel = await store.load(item.channel_id)
    assert channel is not None and channel.failures == 0 and channel.status == "active"
    assert await _turns(db) == [("user", "hi"), ("assistant", "the answer")]
