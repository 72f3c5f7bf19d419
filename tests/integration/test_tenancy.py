"""Identities from different authenticators never meet: a JWT whose `sub` equals a token
user's id, or "admin", is another user, and sees nothing of theirs. A JWT is an admin (of
every tenant) only when the operator names the claim (`jwt_admin_claim`) and it is `true`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "jwt-secret-" + "y" * 32
API = "/api/v1"


def _jwt(sub: str, **claims: Any) -> dict[str, str]:
    token = jwt.encode(
        {"sub": sub, "aud": "orch", "exp": time.time() + 300, **claims}, SECRET, "HS256"
    )
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(jwt_secret=SECRET, jwt_audience="orch", rate_limit_per_minute=0)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        yield c


async def _objects_of(c: httpx.AsyncClient, who: dict[str, str], key: str) -> dict[str, str]:
    wf = await c.post(
        f"{API}/workflows", headers=who, json={"name": "w", "steps": [{"name": "a", "prompt": "x"}]}
    )
    r = await c.post(f"{API}/memory/default/store", headers=who, json={"key": key, "value": "v"})
    assert r.status_code == 200, r.text
    ch = await c.post(
        f"{API}/channels", headers=who, json={"type": "webhook", "name": "c", "config": {}}
    )
    return {"workflow": wf.json()["id"], "channel": ch.json()["data"]["id"], "key": key}


async def _sees_nothing_of(
    c: httpx.AsyncClient, who: dict[str, str], owner: str, objs: dict[str, str]
) -> None:
    assert (await c.get(f"{API}/workflows/{objs['workflow']}", headers=who)).status_code == 404
    assert (await c.get(f"{API}/channels/{objs['channel']}", headers=who)).status_code == 404
    assert (await c.get(f"{API}/memory/default/{objs['key']}", headers=who)).status_code == 404
    listed = (await c.get(f"{API}/workflows", headers=who)).json()["data"]
    assert objs["workflow"] not in [w["id"] for w in listed]
    channels = (await c.get(f"{API}/channels", headers=who)).json()["data"]
    assert objs["channel"] not in [ch["id"] for ch in channels]
    events = (await c.get(f"{API}/events", headers=who, params={"limit": 1000})).json()["data"]
    assert not [e for e in events if e.get("user_uuid") == owner], events[:3]
    assert not [e for e in events if e["aggregate_id"] == objs["workflow"]]


async def test_a_jwt_named_like_a_token_user_is_another_user(client: httpx.AsyncClient) -> None:
    c = client
    made = await c.post(f"{API}/tokens", headers=ADMIN, json={"user_uuid": "alice"})
    alice = {"Authorization": f"Bearer {made.json()['token']}"}
    objs = await _objects_of(c, alice, "alices")
    impostor = _jwt("alice")
    assert (await c.get(f"{API}/whoami", headers=impostor)).json()["user_uuid"] == "jwt:alice"
    await _sees_nothing_of(c, impostor, "alice", objs)
    # and the other way round: the token user does not see the JWT user's objects
    theirs = await _objects_of(c, impostor, "jwts")
    await _sees_nothing_of(c, alice, "jwt:alice", theirs)


async def test_a_jwt_named_admin_is_not_the_admin(client: httpx.AsyncClient) -> None:
    c = client
    objs = await _objects_of(c, ADMIN, "admins")
    job = await c.post(f"{API}/schedules", headers=ADMIN, json={"prompt": "p", "every": 60000})
    jid = job.json()["id"]
    impostor = _jwt("admin")
    who = (await c.get(f"{API}/whoami", headers=impostor)).json()
    assert who == {"ok": True, "user_uuid": "jwt:admin", "admin": False}
    await _sees_nothing_of(c, impostor, "admin", objs)
    assert (await c.get(f"{API}/schedules/{jid}", headers=impostor)).status_code == 404
    assert (
        await c.put(f"{API}/channels/{objs['channel']}", headers=impostor, json={"name": "x"})
    ).status_code == 404


async def _is_admin(c: httpx.AsyncClient, who: dict[str, str], theirs: str) -> bool:
    """Whether `who` acts as an admin: runs an admin-only operation and sees another
    tenant's workflow (both or neither)."""
    whoami = (await c.get(f"{API}/whoami", headers=who)).json()
    stats = (await c.get(f"{API}/memory/stats", headers=who)).status_code
    seen = (await c.get(f"{API}/workflows/{theirs}", headers=who)).status_code
    assert (whoami["admin"], stats, seen) in ((True, 200, 200), (False, 403, 404))
    return bool(whoami["admin"])


async def _alices_workflow(c: httpx.AsyncClient) -> str:
    made = await c.post(f"{API}/tokens", headers=ADMIN, json={"user_uuid": "alice"})
    alice = {"Authorization": f"Bearer {made.json()['token']}"}
    return (await _objects_of(c, alice, "alices"))["workflow"]


async def test_a_jwt_admin_claim_is_not_trusted_by_default(client: httpx.AsyncClient) -> None:
    theirs = await _alices_workflow(client)
    assert not await _is_admin(client, _jwt("carol", admin=True), theirs)


async def test_a_named_jwt_admin_claim_makes_a_global_admin(make_settings: Any) -> None:
    settings = make_settings(
        jwt_secret=SECRET, jwt_audience="orch", jwt_admin_claim="admin", rate_limit_per_minute=0
    )
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        theirs = await _alices_workflow(c)
        assert await _is_admin(c, _jwt("carol", admin=True), theirs)
        # Only JSON true: a string, a number or another claim is not.
        for claims in ({"admin": "true"}, {"admin": 1}, {"admin": [True]}, {"is_admin": True}):
            assert not await _is_admin(c, _jwt("dave", **claims), theirs), claims


async def test_tokens_cannot_be_issued_in_reserved_identities(client: httpx.AsyncClient) -> None:
    for body in ({"user_uuid": "jwt:alice"}, {"user_uuid": "JWT:alice"}, {"user_uuid": "admin"}):
        r = await client.post(f"{API}/tokens", headers=ADMIN, json=body)
        assert r.status_code == 400 and r.json()["code"] == "validation_error", (body, r.text)
    r = await client.post(
        f"{API}/tokens", headers=ADMIN, json={"user_uuid": "admin", "admin": True}
    )
    assert r.status_code == 200


async def test_every_event_names_its_owner(client: httpx.AsyncClient) -> None:
    """/events and the live stream carry `user_uuid` (None for system events); a scheduled
    job's dispatch carries its creator."""
    import json

    from tests.sse import sse_frames

    c = client
    made = await c.post(f"{API}/tokens", headers=ADMIN, json={"user_uuid": "erin"})
    erin = {"Authorization": f"Bearer {made.json()['token']}"}
    async with c.stream(
        "GET", f"{API}/sync-events", headers=erin, params={"types": "memory.stored"}
    ) as stream:
        frames = sse_frames(stream)
        await c.post(f"{API}/memory/notes/store", headers=erin, json={"key": "a", "value": "b"})
        async for frame in frames:
            if frame.get("event") in ("memory.stored", "memory:stored"):
                assert json.loads(frame["data"])["user_uuid"] == "erin"
                break
    page = (await c.get(f"{API}/events", headers=erin)).json()["data"]
    assert page and {e["user_uuid"] for e in page} == {"erin"}
    job = await c.post(f"{API}/schedules", headers=ADMIN, json={"prompt": "p", "every": 60000})
    jid = job.json()["id"]
    assert (await c.post(f"{API}/schedules/{jid}/run", headers=ADMIN)).status_code == 200
    deadline = time.monotonic() + 20
    while True:
        events = (
            await c.get(
                f"{API}/events",
                headers=ADMIN,
                params={"aggregate": str(jid), "limit": 100},
            )
        ).json()["data"]
        dispatched = [e for e in events if e["type"] == "scheduler.task_dispatched"]
        if dispatched:
            break
        assert time.monotonic() < deadline, events
        await asyncio.sleep(0.1)
    assert dispatched[0]["user_uuid"] == "admin"
    system = (await c.get(f"{API}/events", headers=ADMIN, params={"limit": 1000})).json()["data"]
    assert all("user_uuid" in e for e in system)


async def test_the_job_store_itself_scopes_reads(
    client: httpx.AsyncClient, make_settings: Any
) -> None:
    """Ownership is decided in the store, not only in the router: a caller that forgets a
    check still cannot list or read another user's job."""
    from orchestrator.auth import Principal
    from orchestrator.db import connect
    from orchestrator.errors import NotFound
    from orchestrator.events import EventStore
    from orchestrator.scheduler import JobStore

    job = await client.post(f"{API}/schedules", headers=ADMIN, json={"prompt": "p", "every": 60000})
    jid = job.json()["id"]
    db = await connect(make_settings().database_url, migrate=False)
    try:
        jobs = JobStore(db.pool, EventStore(db.pool))
        admin, eve = Principal("admin", True), Principal("eve")
        assert (await jobs.page(1, 50, eve)) == ([], 0)
        listed, total = await jobs.page(1, 50, admin)
        assert total == 1 and [j.id for j in listed] == [jid]
        with pytest.raises(NotFound):
            await jobs.visible(jid, eve)
        assert (await jobs.visible(jid, admin)).id == jid
    finally:
        await db.close()
