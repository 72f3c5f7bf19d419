"""Interventions (issue 32) through the store and over HTTP: the real app under uvicorn (its
in-process engine sweeps and expires), real Postgres. A workflow here is created by the
store and driven by the test (it holds the workflow's claim, so no engine takes it): its
step attempt is running, as when the agent runner parks a call, and interventions are
created as the runner will create them, with `create_in` in an event transaction.

Scoping (owner, deciders, admins; 404 for others, 403 for a visible non-decider), one
decision (a second is a 409, two at once give one 200 and one 409), the reject reason's
validation, expiry by the engine's sweep, the events with masked arguments, the channel
posts, and what the resuming side calls (for_attempt, take_resume, for_resume)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.errors import Conflict, Forbidden, NotFound
from orchestrator.events import EventQuery, EventStore
from orchestrator.interventions import (
    AttemptSuperseded,
    Decider,
    Intervention,
    InterventionStore,
)
from orchestrator.runtime.claims import ClaimStore, Fence, StaleClaim
from orchestrator.sdk import ApiError, AsyncClient
from orchestrator.workflows import WorkflowSpec, WorkflowStore
from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "sk-live-0123456789"


@dataclass
class Parts:
    db: Database
    events: EventStore
    workflows: WorkflowStore
    store: InterventionStore
    claims: ClaimStore


@dataclass
class Attempt:
    workflow_id: str
    task_id: str
    fence: Fence


@pytest.fixture
async def parts(make_settings: Any) -> AsyncIterator[Parts]:
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    events = EventStore(db.pool)
    try:
        yield Parts(
            db,
            events,
            WorkflowStore(db.pool, events),
            InterventionStore(db.pool, events),
            ClaimStore(db.pool, ttl_ms=3_600_000),
        )
    finally:
        await db.close()


@pytest.fixture
async def api(make_settings: Any, parts: Parts) -> AsyncIterator[httpx.AsyncClient]:
    # A sweep (and so an expiry round) about every half second.
    settings = make_settings(rate_limit_per_minute=0, workflow_claim_ttl_ms=1500)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def running_attempt(parts: Parts, user_uuid: str, name: str = "pay") -> Attempt:
    """A workflow of `user_uuid` whose first step's attempt runs, driven by this test."""
    spec = WorkflowSpec.parse(
        name, [{"name": "a", "prompt": "pay the invoice"}, {"name": "b", "prompt": "then"}]
    )
    workflow_id = await parts.workflows.create(spec, user_uuid)
    fence = await parts.claims.acquire("workflow", workflow_id, "test-driver")
    assert fence is not None
    await parts.workflows.mark_started(workflow_id, fence)
    _, key = await parts.workflows.start_step(workflow_id, 0, fence=fence)
    return Attempt(workflow_id, key, fence)


async def ask(parts: Parts, at: Attempt, user_uuid: str, **kw: Any) -> Intervention:
    """What the runner does when a call meets an `ask` rule."""
    values: dict[str, Any] = {
        "kind": "tool",
        "tool": "http__pay",
        "arguments": {"amount": 5, "api_key": SECRET, "to": {"password": "hunter2"}},
        "question": "Run http__pay?",
        "checkpoint": b"sealed-conversation",
    }
    values.update(kw)
    async with parts.events.transaction() as tx:
        return await parts.store.create_in(
            tx,
            task_id=at.task_id,
            workflow_id=at.workflow_id,
            step="a",
            user_uuid=user_uuid,
            **values,
        )


async def user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def trail(parts: Parts, aggregate: str) -> list[Any]:
    found, _ = await parts.events.query(
        EventQuery(aggregate=aggregate, limit=500), Principal("test", is_admin=True)
    )
    return [e for e in found if e.type.startswith("audit.intervention")]


async def until(check: Callable[[], Awaitable[Any]], within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while not (found := await check()):
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.1)
    return found


# --- over HTTP ----------------------------------------------------------------------------------


async def test_owner_and_admin_see_it_anyone_else_gets_404(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    alice, bob = await user(api, "alice"), await user(api, "bob")
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice")
    assert iv.id.startswith("iv-") and iv.status == "pending" and iv.seq == 1
    assert iv.deciders == ("alice",)

    for who in (alice, ADMIN):
        got = await api.get(f"/interventions/{iv.id}", headers=who)
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["id"] == iv.id and body["status"] == "pending" and body["kind"] == "tool"
        assert body["workflow_id"] == at.workflow_id and body["step"] == "a"
        assert body["task_id"] == at.task_id and body["tool"] == "http__pay"
        assert body["arguments"] == {"amount": 5, "api_key": "***", "to": {"password": "***"}}
        assert body["deciders"] == ["alice"] and body["user_uuid"] == "alice"
        assert body["expires_at"] - body["created_at"] == 86_400_000
        assert "checkpoint" not in body and "decided_by" not in body
        page = (await api.get("/interventions", headers=who, params={"status": "pending"})).json()
        assert page["ok"] is True and page["total"] == 1 and page["data"][0]["id"] == iv.id
    assert SECRET not in (await api.get(f"/interventions/{iv.id}", headers=alice)).text

    # bob: it does not exist for him, whatever he tries.
    assert (await api.get("/interventions", headers=bob)).json()["total"] == 0
    for method, path, body in (
        ("GET", f"/interventions/{iv.id}", None),
        ("POST", f"/interventions/{iv.id}/approve", {}),
        ("POST", f"/interventions/{iv.id}/reject", {"reason": "no"}),
    ):
        r = await api.request(method, path, headers=bob, json=body)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["ok"] is False and r.json()["code"] == "not_found"
    # Ids that name nothing, of any shape, are 404s too; a bad status filter a 400.
    for bad in ("iv-999999", "iv-x", "wf-1", "iv-" + "9" * 19):
        assert (await api.get(f"/interventions/{bad}", headers=alice)).status_code == 404
    r = await api.get("/interventions", headers=alice, params={"status": "waiting"})
    assert r.status_code == 400 and "status" in r.text
    done = await api.get("/interventions", headers=alice, params={"status": "approved"})
    assert done.json()["total"] == 0
    other = await running_attempt(parts, "alice")
    await ask(parts, other, "alice")
    one = await api.get("/interventions", headers=alice, params={"workflow_id": at.workflow_id})
    assert [d["id"] for d in one.json()["data"]] == [iv.id]
    assert (await api.get("/interventions", headers=alice)).json()["total"] == 2
    bad = await api.get("/interventions", headers=alice, params={"workflow_id": "x"})
    assert bad.status_code == 400
    assert (await parts.store.load(iv.id)) == iv  # nothing changed
    assert (await api.get("/interventions", headers=bob)).json()["data"] == []


async def test_the_first_decision_wins_and_a_second_is_a_409(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    alice = await user(api, "alice")
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice")
    r = await api.post(f"/interventions/{iv.id}/approve", headers=alice, json={"note": "pay it"})
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True, "id": iv.id, "status": "approved"}
    for path, body in (("approve", None), ("reject", {"reason": "too late"})):
        again = await api.post(f"/interventions/{iv.id}/{path}", headers=ADMIN, json=body)
        assert again.status_code == 409, again.text
        err = again.json()
        assert err["code"] == "conflict" and err["status"] == "approved"
        assert err["decided_by"] == "user:alice" and "request_id" in err
    got = (await api.get(f"/interventions/{iv.id}", headers=alice)).json()
    assert got["status"] == "approved" and got["decided_by"] == {"user_uuid": "alice"}
    assert got["via"] == "api" and got["note"] == "pay it" and got["decided_at"] >= iv.created_at
    assert "reason" not in got

    pending, approved = await trail(parts, at.task_id)
    assert pending.type == "audit.intervention_pending" and pending.user_uuid == "alice"
    assert pending.data["intervention_id"] == iv.id and pending.data["kind"] == "tool"
    assert pending.data["workflow_id"] == at.workflow_id and pending.data["step"] == "a"
    assert pending.data["arguments"] == {"amount": 5, "api_key": "***", "to": {"password": "***"}}
    assert pending.data["deciders"] == ["alice"] and pending.data["question"] == "Run http__pay?"
    assert pending.data["expires_at"] == iv.expires_at
    assert approved.type == "audit.intervention_approved" and approved.user_uuid == "alice"
    assert approved.data["decided_by"] == "user:alice" and approved.data["via"] == "api"
    assert approved.data["note"] == "pay it" and approved.data["tool"] == "http__pay"
    everything, _ = await parts.events.query(
        EventQuery(limit=1000), Principal("test", is_admin=True)
    )
    assert not [e for e in everything if SECRET in str(e.data)]


async def test_two_decisions_at_once_give_one_200_and_one_409(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    alice = await user(api, "alice")
    for _ in range(3):
        at = await running_attempt(parts, "alice")
        iv = await ask(parts, at, "alice")
        answers = await asyncio.gather(
            api.post(f"/interventions/{iv.id}/approve", headers=alice),
            api.post(f"/interventions/{iv.id}/reject", headers=ADMIN, json={"reason": "no"}),
        )
        assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
        won = next(r for r in answers if r.status_code == 200).json()["status"]
        assert (await parts.store.load(iv.id)).status == won  # type: ignore[union-attr]
        assert len(await trail(parts, at.task_id)) == 2  # pending + exactly one outcome


async def test_a_reject_needs_a_reason_and_tells_it(api: httpx.AsyncClient, parts: Parts) -> None:
    alice = await user(api, "alice")
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice")
    path = f"/interventions/{iv.id}/reject"
    for body in (None, {}, {"reason": ""}, {"reason": "   "}, {"reason": "x" * 2001}):
        r = await api.post(path, headers=alice, json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["code"] == "validation_error"
        if body is not None:
            assert [f["field"] for f in r.json()["fields"]] == ["reason"], r.text
    too_long = await api.post(
        f"/interventions/{iv.id}/approve", headers=alice, json={"note": "x" * 2001}
    )
    assert too_long.status_code == 400 and "note" in too_long.text
    unknown = await api.post(f"/interventions/{iv.id}/approve", headers=alice, json={"reason": "x"})
    assert unknown.status_code == 400  # approve takes a note, not a reason
    assert (await parts.store.load(iv.id)).status == "pending"  # type: ignore[union-attr]

    r = await api.post(path, headers=alice, json={"reason": "  wrong account  "})
    assert r.status_code == 200 and r.json()["status"] == "rejected"
    got = (await api.get(f"/interventions/{iv.id}", headers=alice)).json()
    assert got["reason"] == "wrong account" and got["via"] == "api" and "note" not in got
    (_, rejected) = await trail(parts, at.task_id)
    assert rejected.type == "audit.intervention_rejected"
    assert rejected.data["reason"] == "wrong account"
    assert rejected.data["decided_by"] == "user:alice"


async def test_deciders_decide_a_visible_non_decider_gets_403(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    """An approval step whose approvers are bob and dan: alice (the owner) sees it but may
    not decide; bob sees it in his list and decides; carol sees nothing; an admin decides
    anything."""
    alice, bob, carol = [await user(api, n) for n in ("alice", "bob", "carol")]
    at = await running_attempt(parts, "alice")
    iv = await ask(
        parts,
        at,
        "alice",
        kind="approval",
        tool=None,
        arguments=None,
        checkpoint=None,
        question="Ship the release?",
        deciders=["bob", "dan"],
    )
    assert (await api.get(f"/interventions/{iv.id}", headers=alice)).status_code == 200
    refused = await api.post(f"/interventions/{iv.id}/approve", headers=alice)
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert (await api.get(f"/interventions/{iv.id}", headers=carol)).status_code == 404
    mine = (await api.get("/interventions", headers=bob)).json()
    assert [d["id"] for d in mine["data"]] == [iv.id]
    assert mine["data"][0]["kind"] == "approval" and "tool" not in mine["data"][0]
    ok = await api.post(f"/interventions/{iv.id}/approve", headers=bob, json={"note": "go"})
    assert ok.status_code == 200, ok.text
    # An admin decides another pending one of the same attempt (its second: seq 2).
    second = await ask(parts, at, "alice")
    assert second.seq == 2
    r = await api.post(f"/interventions/{second.id}/reject", headers=ADMIN, json={"reason": "n"})
    assert r.status_code == 200
    admin_uuid = (await api.get("/whoami", headers=ADMIN)).json()["user_uuid"]
    decided = (await api.get(f"/interventions/{second.id}", headers=alice)).json()
    assert decided["decided_by"] == {"user_uuid": admin_uuid}
    listed = (await api.get("/interventions", headers=alice, params={"limit": 1})).json()
    assert listed["total"] == 2 and listed["limit"] == 1 and listed["data"][0]["id"] == second.id


async def test_an_undecided_intervention_expires_in_the_engines_sweep(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    alice = await user(api, "alice")
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice", timeout_s=1)
    assert iv.expires_at - iv.created_at == 1000

    async def expired() -> dict[str, Any] | None:
        got = (await api.get(f"/interventions/{iv.id}", headers=alice)).json()
        return got if got["status"] == "expired" else None

    got = await until(expired)
    assert got["reason"] == "expired" and got["via"] == "timeout" and "decided_by" not in got
    late = await api.post(f"/interventions/{iv.id}/approve", headers=alice)
    assert late.status_code == 409 and late.json()["status"] == "expired"
    (_, rejected) = await trail(parts, at.task_id)
    assert rejected.type == "audit.intervention_rejected"
    assert rejected.data["reason"] == "expired" and rejected.data["via"] == "timeout"
    assert rejected.data.get("decided_by") is None
    listed = await api.get("/interventions", headers=alice, params={"status": "expired"})
    assert [d["id"] for d in listed.json()["data"]] == [iv.id]


async def test_the_question_and_the_outcome_are_posted_to_the_channel(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    alice = await user(api, "alice")
    made = await api.post("/channels", headers=alice, json={"type": "webhook", "name": "ops"})
    assert made.status_code == 200, made.text
    channel = made.json()["data"]["id"]

    async def posts(iv: Intervention) -> dict[str, str]:
        rows = await parts.db.pool.fetch(
            "SELECT kind, state, channel_id FROM intervention_posts WHERE intervention_id = $1",
            iv.id,
        )
        assert all(r["channel_id"] == channel for r in rows)
        return {r["kind"]: r["state"] for r in rows}

    at = await running_attempt(parts, "alice")
    unsent = await ask(parts, at, "alice", notify_channel=channel)
    assert unsent.notify_channel == channel and await posts(unsent) == {"ask": "pending"}
    r = await api.post(f"/interventions/{unsent.id}/approve", headers=alice)
    assert r.status_code == 200
    assert await posts(unsent) == {"ask": "dropped"}  # never sent: nothing to update

    sent = await ask(parts, at, "alice", notify_channel=channel)
    await parts.db.pool.execute(
        "UPDATE intervention_posts SET state = 'sent' WHERE intervention_id = $1", sent.id
    )
    r = await api.post(f"/interventions/{sent.id}/reject", headers=alice, json={"reason": "no"})
    assert r.status_code == 200
    assert await posts(sent) == {"ask": "sent", "outcome": "pending"}


async def test_the_sdk_lists_reads_and_decides(api: httpx.AsyncClient, parts: Parts) -> None:
    await user(api, "alice")
    at = await running_attempt(parts, "alice")
    first, second = await ask(parts, at, "alice"), await ask(parts, at, "alice")
    base = str(api.base_url).removesuffix("/api/v1")
    async with AsyncClient(base, token=ADMIN_TOKEN) as sdk:
        page = await sdk.interventions(status="pending", limit=1)
        assert page.total == 2 and [d.id for d in page.data] == [second.id]
        walked = [iv.id async for iv in sdk.iter_interventions("pending", page_size=1)]
        assert walked == [second.id, first.id]
        mine = await sdk.interventions(workflow_id=at.workflow_id)
        assert mine.total == 2
        assert (await sdk.interventions(workflow_id="wf-999999")).total == 0
        got = await sdk.intervention(first.id)
        assert got.tool == "http__pay" and got.arguments and got.arguments["api_key"] == "***"
        assert (await sdk.approve_intervention(first.id, note="fine")).status == "approved"
        assert (await sdk.reject_intervention(second.id, "no")).status == "rejected"
        with pytest.raises(ApiError) as caught:
            await sdk.approve_intervention(first.id)
        assert caught.value.status == 409
        with pytest.raises(ApiError) as caught:
            await sdk.intervention("iv-424242")
        assert caught.value.status == 404
        assert (await sdk.intervention(first.id)).note == "fine"


# --- the store: what the engine and the runner call ---------------------------------------------


async def test_create_needs_the_attempt_running(parts: Parts) -> None:
    at = await running_attempt(parts, "alice")
    with pytest.raises(AttemptSuperseded):
        async with parts.events.transaction() as tx:
            await parts.store.create_in(
                tx,
                task_id=f"{at.workflow_id}:a:7",  # not the running attempt's key
                workflow_id=at.workflow_id,
                step="a",
                user_uuid="alice",
                kind="tool",
                question="Run it?",
            )
    # A newer attempt supersedes the one that asked.
    await parts.workflows.start_step(at.workflow_id, 0, fence=at.fence)
    with pytest.raises(AttemptSuperseded):
        await ask(parts, at, "alice")
    assert await parts.db.pool.fetchval("SELECT count(*) FROM interventions") == 0
    assert await trail(parts, at.task_id) == []
    # An attempt an override abandoned (an outcome taken for its key), or one waiting for its
    # next attempt, asks nothing either: its question would never be acted on.
    abandoned = await running_attempt(parts, "alice", "abandoned")
    await parts.db.pool.execute(
        "INSERT INTO workflow_step_results (idempotency_key, workflow_id, step, status,"
        " recorded_at) VALUES ($1, $2, 'a', 'abandoned', 0)",
        abandoned.task_id,
        abandoned.workflow_id,
    )
    with pytest.raises(AttemptSuperseded):
        await ask(parts, abandoned, "alice")
    waiting = await running_attempt(parts, "alice", "waiting")
    await parts.db.pool.execute(
        "UPDATE workflow_steps SET retry_at = 1 WHERE workflow_id = $1", waiting.workflow_id
    )
    with pytest.raises(AttemptSuperseded):
        await ask(parts, waiting, "alice")
    assert await parts.db.pool.fetchval("SELECT count(*) FROM interventions") == 0


async def test_the_pending_event_names_the_channels_approvers_and_a_gone_channel_is_dropped(
    api: httpx.AsyncClient, parts: Parts
) -> None:
    alice = await user(api, "alice")
    config = {"callback_url": "https://hooks.example.com/x", "approvers": ["ops-1", "ops-2"]}
    made = await api.post(
        "/channels", headers=alice, json={"type": "webhook", "name": "ops", "config": config}
    )
    assert made.status_code == 200, made.text
    channel = made.json()["data"]["id"]
    at = await running_attempt(parts, "alice")
    posted = await ask(parts, at, "alice", notify_channel=channel)
    [pending] = [e for e in await trail(parts, at.task_id) if e.type.endswith("_pending")]
    assert pending.data["approvers"] == {
        "channel_id": channel,
        "platform": "webhook",
        "ids": ["ops-1", "ops-2"],
    }
    r = await api.post(f"/interventions/{posted.id}/approve", headers=alice)
    assert r.status_code == 200, r.text
    # The channel deleted while the workflow runs: the next question is asked, not posted.
    assert (await api.delete(f"/channels/{channel}", headers=alice)).status_code == 200
    unposted = await ask(parts, at, "alice", notify_channel=channel)
    assert unposted.notify_channel is None and unposted.status == "pending"
    assert not await parts.db.pool.fetchval(
        "SELECT count(*) FROM intervention_posts WHERE intervention_id = $1", unposted.id
    )


async def test_resuming_takes_a_decided_intervention_once(parts: Parts) -> None:
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice")
    assert await parts.store.for_attempt(at.task_id) == iv
    assert await parts.store.for_attempt("wf-0:a:1") is None
    assert not await parts.store.take_resume(iv.id, at.fence)  # still pending
    with pytest.raises(Conflict):
        await parts.store.for_resume(iv.id, at.task_id)
    decided = await parts.store.decide(iv.id, Decider("alice"), approve=True)
    assert decided.intervention.status == "approved" and not decided.woke
    assert (await parts.store.for_attempt(at.task_id)).status == "approved"  # type: ignore[union-attr]

    # A driver whose claim was taken over takes nothing.
    stale = Fence(at.fence.kind, at.fence.key, at.fence.owner, at.fence.epoch - 1)
    with pytest.raises(StaleClaim):
        await parts.store.take_resume(iv.id, stale)
    assert await parts.store.take_resume(iv.id, at.fence)
    assert not await parts.store.take_resume(iv.id, at.fence)  # at most once
    assert await parts.store.for_attempt(at.task_id) is None  # continuation sent
    resume = await parts.store.for_resume(iv.id, at.task_id)
    assert resume.checkpoint == b"sealed-conversation"
    assert resume.intervention.status == "approved" and resume.intervention.resumed_at
    with pytest.raises(NotFound):
        await parts.store.for_resume(iv.id, "wf-0:a:1")
    # The next ask of the same attempt is the newest one.
    nxt = await ask(parts, at, "alice")
    assert nxt.seq == 2 and await parts.store.for_attempt(at.task_id) == nxt


async def test_a_decision_releases_a_parked_workflow_and_tells_drivers(
    parts: Parts, make_settings: Any
) -> None:
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice")
    # As WorkflowStore.park will (issue 32, the engine's part).
    await parts.db.pool.execute(
        "UPDATE workflows SET waiting_for = $2 WHERE id = $1", at.workflow_id, iv.id
    )
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(make_settings().database_url)
    try:
        await listener.add_listener("orch_workflows", lambda *a: heard.put_nowait(a[-1]))
        with pytest.raises(NotFound):  # another tenant's
            await parts.store.decide(iv.id, Decider("mallory"), approve=True)
        with pytest.raises(Forbidden):  # a press in a channel it is not posted to
            await parts.store.decide(
                iv.id, Decider.on_platform("slack", "U1", "ch-1"), approve=True
            )
        decided = await parts.store.decide(iv.id, Decider("admin", is_admin=True), approve=False)
        assert decided.woke and decided.intervention.status == "rejected"
        assert await asyncio.wait_for(heard.get(), 10) == f"decided:{at.workflow_id}"
    finally:
        await listener.close()
    waiting = await parts.db.pool.fetchval(
        "SELECT waiting_for FROM workflows WHERE id = $1", at.workflow_id
    )
    assert waiting is None


async def test_a_platform_replay_decides_nothing_twice(parts: Parts) -> None:
    at = await running_attempt(parts, "alice")
    channel = await parts.db.pool.fetchval(
        "INSERT INTO channels (id, user_uuid, type, name, config, token_hash, created_at,"
        " updated_at) VALUES ('ch-1', 'alice', 'slack', 'ops', '{}', 'h', 0, 0) RETURNING id"
    )
    iv = await ask(parts, at, "alice", notify_channel=channel)
    press = Decider.on_platform("slack", "U42", channel)
    first = await parts.store.decide(iv.id, press, approve=True, interaction_id="a-1")
    assert not first.replayed and first.intervention.decided_by == press.record()
    again = await parts.store.decide(iv.id, press, approve=True, interaction_id="a-1")
    assert again.replayed and again.intervention.status == "approved"
    with pytest.raises(Conflict) as caught:
        await parts.store.decide(iv.id, press, approve=False, interaction_id="a-2")
    assert caught.value.extra == {"status": "approved", "decided_by": "slack:U42"}
    outcomes = [e.type for e in await trail(parts, at.task_id)]
    assert outcomes == ["audit.intervention_pending", "audit.intervention_approved"]
    (approved,) = [e for e in await trail(parts, at.task_id) if e.type.endswith("approved")]
    assert approved.data["decided_by"] == "slack:U42" and approved.data["via"] == "slack"


async def test_ending_a_workflow_closes_its_pending_interventions(parts: Parts) -> None:
    at = await running_attempt(parts, "alice")
    iv = await ask(parts, at, "alice")
    async with parts.events.transaction() as tx:
        await tx.conn.execute("SELECT 1 FROM workflows WHERE id = $1 FOR UPDATE", at.workflow_id)
        closed = await parts.store.close_pending_in(tx, at.workflow_id, "cancelled by request")
    assert [c.id for c in closed] == [iv.id]
    got = await parts.store.load(iv.id)
    assert got is not None and got.status == "rejected" and got.via == "cancel"
    assert got.reason == "cancelled by request"
    (_, rejected) = await trail(parts, at.task_id)
    assert rejected.data["via"] == "cancel" and rejected.data["reason"] == "cancelled by request"


async def test_expiry_skips_what_is_not_due_and_runs_once_per_intervention(parts: Parts) -> None:
    at = await running_attempt(parts, "alice")
    due = await ask(parts, at, "alice", timeout_s=0)
    later = await ask(parts, at, "alice", timeout_s=3600)
    await parts.db.pool.execute(
        "UPDATE workflows SET waiting_for = $2 WHERE id = $1", at.workflow_id, due.id
    )
    # Several engines at once: one expires it, the others find nothing to do.
    rounds = await asyncio.gather(*(parts.store.expire_due(10) for _ in range(4)))
    assert sorted(rounds, key=len) == [[], [], [], [at.workflow_id]]
    assert (await parts.store.load(due.id)).status == "expired"  # type: ignore[union-attr]
    assert (await parts.store.load(later.id)).status == "pending"  # type: ignore[union-attr]
    assert await parts.store.expire_due(10) == []
    types = [e.type for e in await trail(parts, at.task_id)]
    assert types.count("audit.intervention_rejected") == 1
