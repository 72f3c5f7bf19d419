"""GET /events and the SSE stream, on the real app (uvicorn on loopback) and database."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from orchestrator.db import connect
from orchestrator.events import CATALOG, EventStore, NewEvent, stream_name
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
                assert data["type"] == "workflow:step:started" and data["seq"] == 1
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
    """Paging GET /events by position (`from_position` = last position + 1) while events commit
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
            params = {"from_position": cursor + 1, "limit": 4, **params}
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
            deadline = time.monotonic() + 10
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
                    if len(seen) >= n:
                        break
                    # Committed but behind the read horizon still (a transaction in flight
                    # below it): a reader is held back, never skips; ask again.
                    assert time.monotonic() < deadline, (seen, n)
                    await asyncio.sleep(0.02)
                    continue
                seen += [e["position"] for e in body["data"]]
                if n < 20:
                    await append(1)  # appended between page requests
            stored = [r["position"] for r in await db.pool.fetch("SELECT position FROM events")]
            assert seen == sorted(stored) and len(seen) == n
            last = await page(seen[-3])
            assert last.json()["total"] == 2 and "X-Total-Estimated" not in last.headers
        finally:
            await db.close()


STREAMS = (
    ("/api/v1/sync-events", {}),
    ("/api/v1/events", {"Accept": "text/event-stream"}),  # the same stream (DESIGN.md)
)


async def _refused(c: httpx.AsyncClient, path: str, headers: dict[str, str], **params: object):
    """The answer to a stream request that must be refused: its status and error body, sent
    as a plain JSON answer (never a `200 text/event-stream` that then breaks off)."""
    async with c.stream("GET", path, headers=headers, params=params) as r:
        assert not r.headers["content-type"].startswith("text/event-stream"), (path, params)
        await r.aread()
        body = r.json()
        assert body["ok"] is False and body["code"] and body["error"] and body["request_id"]
        return r.status_code, body


async def test_a_refused_stream_is_refused_before_it_starts(make_settings) -> None:
    """403 (another tenant's events), 400 (bad filters or cursor) on both stream endpoints:
    the status and the DESIGN.md error body, before any `200 text/event-stream`."""
    settings = make_settings()
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=10) as c:
        who = await tokens_for(c, "gail")
        for path, accept in STREAMS:
            gail = {**who["gail"], **accept}
            status, body = await _refused(c, path, gail, user_uuid="hank")
            assert (status, body["code"]) == (403, "forbidden"), (path, body)
            status, body = await _refused(c, path, gail, types="task.teleported")
            assert (status, body["code"]) == (400, "bad_request"), (path, body)
            status, _ = await _refused(c, path, {**gail, "Last-Event-ID": "yesterday"})
            assert status == 400
            for bad in ({"from_seq": -1}, {"from_position": "x"}, {"aggregate": ""}):
                status, _ = await _refused(c, path, gail, **bad)
                assert status == 400, (path, bad)
            # Allowed: her own (user_uuid = herself) starts.
            async with c.stream("GET", path, headers=gail, params={"user_uuid": "gail"}) as r:
                assert r.status_code == 200
                assert (await anext(sse_frames(r))) == {"comment": "connected"}


async def test_from_seq_is_a_seq_for_any_aggregate_and_from_position_the_cursor(
    make_settings,
) -> None:
    """`from_seq` keeps events whose per-aggregate seq is at least it (SPEC part 2), with
    `aggregate=all` as with one aggregate; `from_position` is the global cursor, on the page
    and on the stream, and Last-Event-ID still resumes."""
    settings = make_settings()
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=10) as c:
        db = await connect(settings.database_url)
        store = EventStore(db.pool)
        try:
            made = []
            for agg, n in (("fx", 3), ("fy", 1), ("fz", 2)):
                for _ in range(n):
                    made += await store.append([NewEvent("task.created", {"task_id": agg})])

            async def page(**params: object) -> list[tuple[str, int]]:
                r = await c.get("/api/v1/events", headers=ADMIN, params=params)
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["total"] == len(body["data"])
                return [(e["aggregate_id"], e["seq"]) for e in body["data"]]

            assert await page(from_seq=2) == [("fx", 2), ("fx", 3), ("fz", 2)]
            assert await page(from_seq=2, aggregate="fz") == [("fz", 2)]
            third = made[3].position  # fy's only event
            assert await page(from_position=third) == [("fy", 1), ("fz", 1), ("fz", 2)]
            assert await page(from_position=third, from_seq=2) == [("fz", 2)]

            # The stream: from_seq across all aggregates filters what it carries.
            for path, accept in STREAMS:
                headers = {**ADMIN, **accept}
                async with c.stream("GET", path, headers=headers, params={"from_seq": 2}) as r:
                    assert r.status_code == 200
                    frames = sse_frames(r)
                    assert (await anext(frames)) == {"comment": "connected"}
                    fresh = NewEvent("task.created", {"task_id": f"fw{path}"})
                    await store.append([fresh])  # its aggregate's seq 1: filtered out
                    [second] = await store.append([NewEvent("task.created", {"task_id": "fy"})])
                    frame = await anext(f async for f in frames if "id" in f)
                    assert int(frame["id"]) == second.position
                    assert json.loads(frame["data"])["seq"] >= 2
            # from_position on the stream: a replay from that position (inclusive), then live.
            for path, accept in STREAMS:
                headers = {**ADMIN, **accept}
                params = {"from_position": third, "types": "task.created"}
                async with c.stream("GET", path, headers=headers, params=params) as r:
                    got = []
                    async for frame in sse_frames(r):
                        if "id" in frame:
                            got.append(int(frame["id"]))
                        if len(got) == 3:
                            break
                    assert got == [e.position for e in made[3:6]]
                # Last-Event-ID (a position, exclusive) wins over from_position.
                headers["Last-Event-ID"] = str(made[4].position)
                async with c.stream("GET", path, headers=headers, params=params) as r:
                    frame = await anext(f async for f in sse_frames(r) if "id" in f)
                    assert int(frame["id"]) == made[5].position
        finally:
            await db.close()


async def test_on_the_stream_the_event_name_and_data_type_agree(make_settings) -> None:
    """SPEC part 4: frames `event: <type>` with `data: {id, type, data}`; part 6: on the
    stream workflow events carry colon names. So on the stream both the `event:` line and
    `data.type` carry the stream name; GET /events pages carry the store name."""
    settings = make_settings()
    spec_names = {
        "workflow:started",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:step:failed",
        "workflow:completed",
        "workflow:failed",
        "workflow:cancelled",
        "workflow:compensating",
    }
    store_names = sorted(n for n in CATALOG if n.startswith("workflow."))
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url, timeout=10) as c:
        db = await connect(settings.database_url)
        store = EventStore(db.pool)
        try:
            async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN) as r:
                frames = sse_frames(r)
                assert (await anext(frames)) == {"comment": "connected"}
                for name in [*store_names, "task.created"]:
                    data = {"workflow_id": "wf-names", "step": "s"}
                    if name == "task.created":
                        data = {"task_id": "t-names"}
                    await store.append([NewEvent(name, data, "admin")])
                seen: dict[str, str] = {}
                async for frame in frames:
                    if "id" in frame:
                        body = json.loads(frame["data"])
                        assert frame["event"] == body["type"], frame
                        seen[frame["event"]] = body["aggregate_id"]
                    if len(seen) == len(store_names) + 1:
                        break
            assert set(seen) == {stream_name(n) for n in store_names} | {"task.created"}
            assert spec_names <= set(seen)
            page = await c.get("/api/v1/events", headers=ADMIN, params={"aggregate": "wf-names"})
            assert [e["type"] for e in page.json()["data"]] == store_names
        finally:
            await db.close()
