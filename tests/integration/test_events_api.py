"""GET /events and the SSE stream, on the real app (uvicorn on loopback) and database."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from orchestrator.db import connect
from orchestrator.events import EventStore, NewEvent
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.sse import sse_frames

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def tokens_for(c: httpx.AsyncClient, *users: str) -> dict[str, dict[str, str]]:
    out = {}
    for user in users:
        made = (await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": user})).json()
        out[user] = {"Authorization": f"Bearer {made['token']}"}
    return out


async def test_events_page_scoping_and_filters(make_settings) -> None:
    settings = make_settings()
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        who = await tokens_for(c, "anna", "ben")  # each creation is an audit.permission_grant
        db = await connect(settings.database_url)
        store = EventStore(db.pool)
        await store.append(
            [NewEvent("task.created", {"task_id": f"a{i}"}, "anna") for i in range(3)]
        )
        await store.append([NewEvent("task.created", {"task_id": "b0"}, "ben")])
        await db.close()

        page = (await c.get("/api/v1/events", headers=who["anna"])).json()
        assert page["ok"] and page["total"] == 4 and page["offset"] == 0 and page["limit"] == 100
        assert {e["type"] for e in page["data"]} == {"audit.permission_grant", "task.created"}
        assert all(
            set(e) >= {"id", "type", "version", "aggregate_id", "seq", "timestamp", "data"}
            for e in page["data"]
        )
        grant = page["data"][0]
        assert grant["data"]["user_uuid"] == "anna" and grant["data"]["granted_by"] == "admin"

        r = await c.get(
            "/api/v1/events",
            headers=who["anna"],
            params={"types": "task.created", "limit": 2, "offset": 1},
        )
        body = r.json()
        assert body["total"] == 3 and [e["aggregate_id"] for e in body["data"]] == ["a1", "a2"]
        r = await c.get("/api/v1/events", headers=who["anna"], params={"aggregate": "b0"})
        assert r.json()["total"] == 0  # Ben's aggregate is invisible to Anna
        r = await c.get("/api/v1/events", headers=who["anna"], params={"user_uuid": "ben"})
        assert r.status_code == 403
        # The refusal is itself an event of Anna's (audit.permission_deny), written just
        # after the answer.
        denied = {"types": "audit.permission_deny", "user_uuid": "anna"}
        deadline = time.monotonic() + 10
        while (await c.get("/api/v1/events", headers=ADMIN, params=denied)).json()["total"] != 1:
            assert time.monotonic() < deadline, "the 403 was not recorded"
            await asyncio.sleep(0.05)
        r = await c.get("/api/v1/events", headers=ADMIN, params={"user_uuid": "ben"})
        assert r.json()["total"] == 2
        assert (await c.get("/api/v1/events", headers=ADMIN)).json()["total"] == 7
        r = await c.get("/api/v1/events", headers=ADMIN, params={"types": "task.teleported"})
        assert r.status_code == 400 and "task.teleported" in r.json()["error"]
        r = await c.get("/api/v1/events", headers=ADMIN, params={"limit": 5000})
        assert r.status_code == 400
        r = await c.get("/api/v1/events", headers=ADMIN, params={"aggregate": "a0", "from_seq": 2})
        assert r.json()["total"] == 0
        # The projection counted every committed event for svc_event_total (it catches up
        # at most every PROJECT_EVERY_S, and the recorder flushes once a second).
        counted = [
            'svc_event_total{type="task.created"} 4.0',
            'svc_event_total{type="audit.permission_grant"} 2.0',
        ]
        deadline = time.monotonic() + 10
        while True:
            metrics = (await c.get("/api/v1/metrics")).text
            if all(line in metrics for line in counted):
                break
            assert time.monotonic() < deadline, metrics
            await asyncio.sleep(0.1)


async def test_stream_live_resume_and_tenancy(make_settings) -> None:
    settings = make_settings(sse_ping_interval_s=0.3)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=10) as c:
        who = await tokens_for(c, "cara", "dan")
        db = await connect(settings.database_url)
        store = EventStore(db.pool)
        try:
            async with c.stream("GET", "/api/v1/sync-events", headers=who["cara"]) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                frames = sse_frames(r)
                assert (await anext(frames)) == {"comment": "connected"}
                await store.append([NewEvent("task.created", {"task_id": "d1"}, "dan")])
                sent = time.monotonic()
                [mine] = await store.append(
                    [
                        NewEvent(
                            "workflow.step_started", {"workflow_id": "wf-1", "step": "s1"}, "cara"
                        )
                    ]
                )
                frame = await anext(f async for f in frames if "id" in f)
                assert time.monotonic() - sent < 1.0
                assert frame["event"] == "workflow:step:started"  # colon style on the stream
                assert int(frame["id"]) == mine.position
                data = json.loads(frame["data"])
                assert data["type"] == "workflow.step_started" and data["seq"] == 1
                assert data["aggregate_id"] == "wf-1" and data["data"]["step"] == "s1"
                # Dan's event never showed; pings keep the connection alive.
                assert (await anext(frames)) == {"comment": "ping"}
            last_seen = mine.position

            # Missed while away (with Dan's in between), then resumed after Last-Event-ID.
            missed = []
            for i in range(3):
                missed += await store.append(
                    [NewEvent("task.created", {"task_id": f"m{i}"}, "cara")]
                )
                await store.append([NewEvent("task.created", {"task_id": f"dx{i}"}, "dan")])
            headers = {
                **who["cara"],
                "Last-Event-ID": str(last_seen),
                "Accept": "text/event-stream",
            }
            async with c.stream("GET", "/api/v1/events", headers=headers) as r:
                got = []
                async for frame in sse_frames(r):
                    if "id" in frame:
                        got.append(int(frame["id"]))
                    if len(got) == 3:
                        break
                assert got == [e.position for e in missed]
            r = await c.get(
                "/api/v1/sync-events", headers={**who["cara"], "Last-Event-ID": "yesterday"}
            )
            assert r.status_code == 400
        finally:
            await db.close()


async def test_stream_from_seq_and_slow_client(make_settings) -> None:
    settings = make_settings(sse_client_buffer=3)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=10) as c:
        db = await connect(settings.database_url)
        store = EventStore(db.pool)
        try:
            for step in ("a", "b", "c"):
                await store.append(
                    [
                        NewEvent(
                            "workflow.step_started", {"workflow_id": "wf-9", "step": step}, "admin"
                        )
                    ]
                )
            # from_seq on the stream: starts at seq 2 of the aggregate.
            params = {"aggregate": "wf-9", "from_seq": 2}
            async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN, params=params) as r:
                seqs = []
                async for frame in sse_frames(r):
                    if "id" in frame:
                        seqs.append(json.loads(frame["data"])["seq"])
                    if len(seqs) == 2:
                        break
                assert seqs == [2, 3]

            # A client more than sse_client_buffer events behind is cut off with an error frame.
            async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN) as r:
                frames = sse_frames(r)
                assert (await anext(frames)) == {"comment": "connected"}
                await store.append(
                    [NewEvent("task.created", {"task_id": f"burst{i}"}, "admin") for i in range(20)]
                )
                errors = [f async for f in frames if f.get("event") == "error"]
                assert len(errors) == 1
                assert json.loads(errors[0]["data"])["code"] == "subscriber_too_slow"
        finally:
            await db.close()


async def test_events_keyset_paging_skips_nothing_and_total_is_bounded(make_settings) -> None:
    """Paging GET /events by position (`from_seq` = last position + 1) while events commit
    between pages, one of them late behind a higher position: every event exactly once, in
    order. `total` is exact up to events_total_exact_max, an estimate (flagged) above."""
    settings = make_settings(events_total_exact_max=5)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        db = await connect(settings.database_url)
        store = EventStore(db.pool)
        n = 0

        async def append(k: int) -> None:
            nonlocal n
            await store.append(
                [NewEvent("task.created", {"task_id": f"k{n + i}"}) for i in range(k)]
            )
            n += k

        async def page(cursor: int, **params: object) -> httpx.Response:
            params = {"from_seq": cursor + 1, "limit": 4, **params}
            r = await c.get("/api/v1/events", headers=ADMIN, params=params)
            assert r.status_code == 200, r.text
            return r

        try:
            await append(12)
            first = await page(0)
            assert first.headers.get("X-Total-Estimated") == "true"
            assert first.json()["total"] > 5 and len(first.json()["data"]) == 4
            # offset still pages as the SPEC says
            everything = (await c.get("/api/v1/events", headers=ADMIN)).json()["data"]
            by_offset = (await page(0, offset=2, limit=3)).json()["data"]
            assert by_offset == everything[2:5]

            seen = [e["position"] for e in first.json()["data"]]
            held_back_checked = False
            while True:
                if len(seen) == 8 and not held_back_checked:
                    # One transaction holds an append open; a later one commits meanwhile.
                    async with store.transaction() as slow:
                        [late] = await slow.append([NewEvent("task.created", {"task_id": "late"})])
                        [quick] = await asyncio.wait_for(
                            store.append([NewEvent("task.created", {"task_id": "quick"})]), 5
                        )
                        body = (await page(seen[-1], limit=100)).json()
                        got = [e["position"] for e in body["data"]]
                        assert late.position not in got and quick.position not in got
                    held_back_checked = True
                    n += 2
                body = (await page(seen[-1])).json()
                if not body["data"]:
                    break
                seen += [e["position"] for e in body["data"]]
                if n < 20:
                    await append(1)  # appended between page requests
            stored = [r["position"] for r in await db.pool.fetch("SELECT position FROM events")]
            assert seen == sorted(stored) and len(seen) == n
            last = await page(seen[-3])
            assert last.json()["total"] == 2 and "X-Total-Estimated" not in last.headers
        finally:
            await db.close()
