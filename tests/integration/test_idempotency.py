"""Idempotency-Key on the creating POSTs (issue 32) over HTTP: the app under uvicorn, real
Postgres and Redis, a loopback OpenAI-format model for the workflows it starts. A replay
answers the first response (200, `Idempotent-Replayed: true`) and creates nothing; another
body is a 409; keys are per user; a bad key is a 400; concurrent requests with one key create
one object; an expired key (TTL setting, or a row made old) creates again; a failed request
frees its key; a dead claimant's row is taken over; a claimant that lost its claim rolls its
creation back; the purge deletes only expired rows; the SDK sends the key."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator import wire
from orchestrator.errors import Conflict
from orchestrator.idempotency import LEASE_S, IdempotencyStore, fingerprint
from orchestrator.sdk import AsyncClient, Client
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REPLAYED = "Idempotent-Replayed"
FLOW = {"name": "nightly", "steps": [{"name": "sum", "prompt": "[answer 42]"}]}


@dataclass
class Api:
    http: httpx.AsyncClient
    url: str
    database_url: str


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as server:
        yield server


async def _serve(settings: Any) -> AsyncIterator[Api]:
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield Api(client, served.url, settings.database_url)


@pytest.fixture
async def api(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[Api]:
    async for served in _serve(agent_settings(make_settings, llm)):
        yield served


async def user(api: Api, name: str) -> dict[str, str]:
    made = await api.http.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def keyed(who: dict[str, str], key: str) -> dict[str, str]:
    return {**who, "Idempotency-Key": key}


async def post_flow(
    api: Api, who: dict[str, str], key: str, body: Any = FLOW, raw: str | None = None
) -> httpx.Response:
    if raw is not None:
        headers = {**keyed(who, key), "Content-Type": "application/json"}
        return await api.http.post("/workflows", headers=headers, content=raw)
    return await api.http.post("/workflows", headers=keyed(who, key), json=body)


async def workflow_count(api: Api, who: dict[str, str]) -> int:
    page = await api.http.get("/workflows", headers=who)
    assert page.status_code == 200, page.text
    return int(page.json()["total"])


async def sql(api: Api, statement: str, *args: Any) -> Any:
    conn = await asyncpg.connect(api.database_url)
    try:
        return await conn.fetch(statement, *args)
    finally:
        await conn.close()


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["ok"] is False and body["code"] == code and body["request_id"]
    assert "Idempotency-Key" in body["error"]
    assert REPLAYED not in r.headers
    return body


# --- workflows --------------------------------------------------------------------------------


async def test_replay_answers_the_first_workflow(api: Api) -> None:
    ann = await user(api, "ann")
    first = await post_flow(api, ann, "nightly-1")
    assert first.status_code == 200, first.text
    assert REPLAYED not in first.headers
    wid = first.json()["id"]
    # The same body with other spacing and key order is the same request.
    same = json.dumps({"steps": FLOW["steps"], "name": "nightly"}, indent=3)
    again = await post_flow(api, ann, "nightly-1", raw=same)
    assert again.status_code == 200, again.text
    assert again.headers[REPLAYED] == "true"
    assert again.json() == first.json() == {"ok": True, "id": wid, "status": "pending"}
    assert await workflow_count(api, ann) == 1
    # Another body with the key: 409 naming the header; nothing created.
    other = await post_flow(api, ann, "nightly-1", {**FLOW, "name": "other"})
    assert_error(other, 409, "idempotency_key_reused")
    assert await workflow_count(api, ann) == 1
    # A new key is a new workflow.
    fresh = await post_flow(api, ann, "nightly-2")
    assert fresh.status_code == 200 and fresh.json()["id"] != wid
    assert await workflow_count(api, ann) == 2
    rows = await sql(
        api, "SELECT user_uuid, key, expires_at - created_at AS ttl FROM idempotency_keys"
    )
    assert {(r["user_uuid"], r["key"]) for r in rows} == {
        ("ann", "nightly-1"),
        ("ann", "nightly-2"),
    }
    assert {r["ttl"] for r in rows} == {86_400_000}  # idempotency_ttl_s's default


async def test_keys_are_per_user(api: Api) -> None:
    ann, bob = await user(api, "ann"), await user(api, "bob")
    a = await post_flow(api, ann, "shared-key")
    b = await post_flow(api, bob, "shared-key", {**FLOW, "name": "bobs"})
    assert a.status_code == b.status_code == 200
    assert a.json()["id"] != b.json()["id"] and REPLAYED not in b.headers
    # Each replays their own; neither sees the other's workflow.
    assert (await post_flow(api, bob, "shared-key", {**FLOW, "name": "bobs"})).json() == b.json()
    assert (await post_flow(api, ann, "shared-key")).json() == a.json()
    assert await workflow_count(api, ann) == await workflow_count(api, bob) == 1


async def test_bad_keys_are_400_naming_the_header(api: Api) -> None:
    ann = await user(api, "ann")
    for bad in ("x" * 256, b"caf\xc3\xa9", b"tab\there"):
        headers = {**ann, "Idempotency-Key": bad}  # type: ignore[dict-item]
        r = await api.http.post("/workflows", headers=headers, json=FLOW)
        body = assert_error(r, 400, "validation_error")
        assert body["fields"][0]["field"] == "Idempotency-Key"
    assert (await post_flow(api, ann, "k" * 255)).status_code == 200  # the longest allowed
    assert await workflow_count(api, ann) == 1


async def test_concurrent_requests_with_one_key_create_one_workflow(api: Api) -> None:
    ann = await user(api, "ann")
    answers = await asyncio.gather(*(post_flow(api, ann, "race") for _ in range(8)))
    created = {r.json()["id"] for r in answers if r.status_code == 200}
    assert len(created) == 1, [r.text for r in answers]
    for r in answers:
        if r.status_code != 200:
            assert_error(r, 409, "idempotency_key_in_use")
            assert r.headers["Retry-After"] == "1"
    assert await workflow_count(api, ann) == 1
    # Once the first has answered, every retry replays it.
    again = await post_flow(api, ann, "race")
    assert again.headers[REPLAYED] == "true" and again.json()["id"] in created


async def test_an_expired_key_creates_again(api: Api) -> None:
    ann = await user(api, "ann")
    first = (await post_flow(api, ann, "old")).json()["id"]
    # 24 hours later (the row made old): checked on read, before any purge.
    await sql(api, "UPDATE idempotency_keys SET expires_at = created_at - 1")
    second = await post_flow(api, ann, "old")
    assert second.status_code == 200 and REPLAYED not in second.headers
    assert second.json()["id"] != first
    # The key is the new request's now.
    assert (await post_flow(api, ann, "old")).json()["id"] == second.json()["id"]
    assert await workflow_count(api, ann) == 2


async def test_the_ttl_is_the_setting(make_settings: Any, llm: OpenAIFake) -> None:
    settings = agent_settings(make_settings, llm, idempotency_ttl_s=1)
    async for api in _serve(settings):
        ann = await user(api, "ann")
        first = (await post_flow(api, ann, "short")).json()["id"]
        rows = await sql(api, "SELECT expires_at - created_at AS ttl FROM idempotency_keys")
        assert [r["ttl"] for r in rows] == [1000]
        deadline = time.monotonic() + 15
        while True:  # replayed until the second has passed, then a new workflow
            r = await post_flow(api, ann, "short")
            assert r.status_code == 200, r.text
            if REPLAYED not in r.headers:
                break
            assert r.json()["id"] == first
            assert time.monotonic() < deadline, "the key never expired"
            await asyncio.sleep(0.1)
        assert r.json()["id"] != first
        assert await workflow_count(api, ann) == 2


async def test_a_failed_request_frees_its_key(api: Api) -> None:
    ann = await user(api, "ann")
    # Refused by the route (no such template) and by FastAPI's validation (steps not a list):
    # neither leaves a claim, so the key then creates with a good body.
    r = await post_flow(api, ann, "retry-me", {"template": "nope"})
    assert r.status_code == 404 or r.status_code == 400, r.text
    r = await post_flow(api, ann, "retry-me", {"name": "x", "steps": "not a list"})
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert await sql(api, "SELECT * FROM idempotency_keys") == []
    ok = await post_flow(api, ann, "retry-me")
    assert ok.status_code == 200 and REPLAYED not in ok.headers


async def test_a_dead_claimants_key_is_taken_over_after_its_lease(api: Api) -> None:
    """A replica that died between its claim and its commit left a pending row: a retry
    with the same body is told to wait while the lease runs, then creates (once)."""
    ann = await user(api, "ann")
    body = json.dumps(FLOW).encode()
    digest = fingerprint("POST", "/api/v1/workflows", body)
    await sql(
        api,
        "INSERT INTO idempotency_keys (user_uuid, key, fingerprint, token, created_at,"
        " locked_until, expires_at)"
        " VALUES ('ann', 'crashed', $1, 'dead', $2, $3, $2::bigint + 100000000)",
        digest,
        int(time.time() * 1000),
        int(time.time() * 1000) + LEASE_S * 1000,
    )
    waiting = await post_flow(api, ann, "crashed", raw=body.decode())
    assert_error(waiting, 409, "idempotency_key_in_use")
    # Another body is still another request, lease or not.
    assert_error(
        await post_flow(api, ann, "crashed", {**FLOW, "name": "x"}), 409, "idempotency_key_reused"
    )
    await sql(api, "UPDATE idempotency_keys SET locked_until = 0")
    taken = await post_flow(api, ann, "crashed", raw=body.decode())
    assert taken.status_code == 200 and REPLAYED not in taken.headers
    replay = await post_flow(api, ann, "crashed")
    assert replay.headers[REPLAYED] == "true" and replay.json() == taken.json()
    assert await workflow_count(api, ann) == 1


async def test_a_claimant_that_lost_its_claim_creates_nothing(database_url: str) -> None:
    """Fencing: the answer is recorded in the creation's transaction under the claim's
    token; once another request has taken the key over, recording fails and the creation
    rolls back with it."""
    from orchestrator.db import connect

    db = await connect(database_url)
    try:
        store = IdempotencyStore(db.pool, ttl_s=60)

        async def create(answer: Any) -> wire.MemoryOk:
            # Meanwhile the lease ran out and a retry took the key over (a new token).
            await db.pool.execute("UPDATE idempotency_keys SET token = 'the retry'")
            hook = answer.in_transaction(lambda minute: wire.MemoryOk())
            async with db.pool.acquire() as conn, conn.transaction():
                await conn.execute("INSERT INTO service_heartbeats (minute) VALUES (7)")
                await hook(conn, 7)
            return wire.MemoryOk()

        with pytest.raises(Conflict) as lost:
            await store.run("ann", "k", "digest", create)
        assert lost.value.code == "idempotency_key_in_use"
        assert (
            await db.pool.fetchval("SELECT count(*) FROM service_heartbeats WHERE minute = 7") == 0
        )
        # The retry's row is untouched by the loser's release.
        assert await db.pool.fetchval("SELECT token FROM idempotency_keys") == "the retry"
    finally:
        await db.close()


async def test_the_purge_deletes_expired_rows_only(database_url: str) -> None:
    from orchestrator.db import connect

    db = await connect(database_url)
    try:
        store = IdempotencyStore(db.pool, ttl_s=60)
        for key in ("a", "b", "c"):
            claimed = await store.run("ann", key, key, _ok)
            assert claimed == wire.MemoryOk()
        await db.pool.execute("UPDATE idempotency_keys SET expires_at = 0 WHERE key <> 'c'")
        assert await store.purge_expired(batch=1) == 1
        assert await store.purge_expired() == 1
        assert await store.purge_expired() == 0
        assert [r["key"] for r in await db.pool.fetch("SELECT key FROM idempotency_keys")] == ["c"]
    finally:
        await db.close()


async def _ok(_: Any) -> wire.MemoryOk:
    return wire.MemoryOk()


# --- memory and marketplace -------------------------------------------------------------------


async def test_memory_store_replays_without_writing(api: Api) -> None:
    ann, bob = await user(api, "ann"), await user(api, "bob")
    note = {"key": "plan", "value": "ship friday"}
    first = await api.http.post("/memory/default/store", headers=keyed(ann, "note-7"), json=note)
    assert first.status_code == 200 and first.json() == {"status": "ok"}
    assert REPLAYED not in first.headers
    # Changed since (no key); the replay answers the first write and does not write again.
    changed = {"key": "plan", "value": "ship monday"}
    assert (
        await api.http.post("/memory/default/store", headers=ann, json=changed)
    ).status_code == 200
    again = await api.http.post("/memory/default/store", headers=keyed(ann, "note-7"), json=note)
    assert again.status_code == 200 and again.headers[REPLAYED] == "true"
    assert again.json() == {"status": "ok"}
    got = await api.http.get("/memory/default/plan", headers=ann)
    assert got.json()["value"] == "ship monday"
    # Another value, or the same body in another namespace: another request.
    other = await api.http.post(
        "/memory/default/store", headers=keyed(ann, "note-7"), json={**note, "value": "x"}
    )
    assert_error(other, 409, "idempotency_key_reused")
    elsewhere = await api.http.post("/memory/team/store", headers=keyed(ann, "note-7"), json=note)
    assert_error(elsewhere, 409, "idempotency_key_reused")
    # Bob's note-7 is his own (in a namespace of his: Ann holds `plan` in `default`).
    bobs = await api.http.post("/memory/bobs/store", headers=keyed(bob, "note-7"), json=note)
    assert bobs.status_code == 200 and REPLAYED not in bobs.headers
    bad = await api.http.post("/memory/default/store", headers=keyed(ann, ""), json=note)
    assert_error(bad, 400, "validation_error")


async def test_marketplace_publish_replays_the_first_version(make_settings: Any) -> None:
    settings = make_settings(rate_limit_per_minute=0, marketplace_publish_per_hour=2)
    async for api in _serve(settings):
        ann, bob = await user(api, "ann"), await user(api, "bob")
        skill = {"name": "summarise", "description": "d", "tags": ["t"], "body": "sum it up"}
        answers = await asyncio.gather(
            *(
                api.http.post("/marketplace/publish", headers=keyed(ann, "sum-v1"), json=skill)
                for _ in range(6)
            )
        )
        done = [r for r in answers if r.status_code == 200]
        assert done and all(r.json() == done[0].json() for r in done), [r.text for r in answers]
        assert done[0].json()["version"] == "1" and done[0].json()["created"] is True
        for r in answers:
            if r.status_code != 200:
                assert_error(r, 409, "idempotency_key_in_use")
        # Replays neither bump the version nor count toward marketplace_publish_per_hour (2).
        for _ in range(3):
            r = await api.http.post(
                "/marketplace/publish", headers=keyed(ann, "sum-v1"), json=skill
            )
            assert r.status_code == 200 and r.headers[REPLAYED] == "true"
            assert r.json()["version"] == "1"
        detail = await api.http.get("/marketplace/detail/summarise", headers=ann)
        assert detail.json()["version"] == "1"
        v2 = await api.http.post(
            "/marketplace/publish", headers=keyed(ann, "sum-v2"), json={**skill, "body": "v2"}
        )
        assert v2.status_code == 200 and v2.json()["version"] == "2"
        other = await api.http.post(
            "/marketplace/publish", headers=keyed(ann, "sum-v1"), json={**skill, "body": "v3"}
        )
        assert_error(other, 409, "idempotency_key_reused")
        # Bob's sum-v1 publishes his own skill.
        bobs = await api.http.post("/marketplace/publish", headers=keyed(bob, "sum-v1"), json=skill)
        assert bobs.status_code == 200 and bobs.json()["author"] == "bob"


# --- the SDK ----------------------------------------------------------------------------------


async def test_sdk_sends_the_key(api: Api) -> None:
    made = await api.http.post("/tokens", headers=ADMIN, json={"user_uuid": "ann"})
    token = made.json()["token"]
    async with AsyncClient(api.url, token=token) as client:
        first = await client.create_workflow("nightly", FLOW["steps"], idempotency_key="n-1")
        again = await client.create_workflow("nightly", FLOW["steps"], idempotency_key="n-1")
        assert again.id == first.id
        other = await client.create_workflow("nightly", FLOW["steps"], idempotency_key="n-2")
        assert other.id != first.id

    def sync_part() -> tuple[str, str, str]:
        with Client(api.url, token=token) as client:
            client.memory_store("default", "k", "v", idempotency_key="m-1")
            client.memory_store("default", "k", "v", idempotency_key="m-1")
            a = client.publish_skill("s", "body", idempotency_key="p-1")
            b = client.publish_skill("s", "body", idempotency_key="p-1")
            return (
                a.version,
                b.version,
                client.create_workflow("nightly", FLOW["steps"], idempotency_key="n-1").id,
            )

    v1, v2, wid = await asyncio.to_thread(sync_part)
    assert v1 == v2 == "1" and wid == first.id
    rows = await sql(api, "SELECT key FROM idempotency_keys ORDER BY key")
    assert [r["key"] for r in rows] == ["m-1", "n-1", "n-2", "p-1"]
