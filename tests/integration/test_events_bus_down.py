"""A stream that cannot start because the EventBus is down is refused with 503 before any
`200 text/event-stream` (issue 33), on /sync-events and on /events; a stream already open
rides the outage out and misses nothing once a bus runs again.

Real local Ray and a real EventBus actor under its generation's name, the real app under
uvicorn following it the way a Serve replica does (`ActorEventSource`), the real database.
The outage is the actor killed for good (no restart), then a new one started."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray

from actors import NAMESPACE, Generation
from actors.event_bus import KIND, ActorEventSource, EventBus
from deployments.api import create_app
from orchestrator.db import connect
from orchestrator.events import EventStore, NewEvent
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.sse import sse_frames

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STREAMS = (
    ("/api/v1/sync-events", {}),
    ("/api/v1/events", {"Accept": "text/event-stream"}),
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


async def _start_bus(settings: Any, generation: Generation) -> Any:
    """A bus under the generation's name, booted (its head answers). The name of a bus just
    killed is released a moment after the kill: retried until then."""
    deadline = time.monotonic() + 30
    while True:
        try:
            bus = EventBus.options(name=generation.name(KIND), namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
                settings, generation
            )
            break
        except ValueError:  # the name is still taken
            assert time.monotonic() < deadline, "the killed bus's name was never released"
            await asyncio.sleep(0.2)
    await bus.head.remote()
    return bus


async def _refusal(c: httpx.AsyncClient, path: str, headers: dict[str, str]) -> httpx.Response:
    """The first answer to `path` that is not a started stream (the replica notices the dead
    bus when its subscription fails: streams asked for before that still start)."""
    deadline = time.monotonic() + 30
    while True:
        async with c.stream("GET", path, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return r
        assert time.monotonic() < deadline, "never refused while the bus was down"
        await asyncio.sleep(0.2)


async def test_a_stream_is_refused_with_503_while_the_bus_is_down(
    cluster: None, make_settings: Any
) -> None:
    settings = make_settings(sse_start_timeout_s=1.0, sse_ping_interval_s=0.5)
    generation = Generation.of("evbus-down", settings)
    bus = await _start_bus(settings, generation)
    app = create_app(settings, event_upstream=ActorEventSource(generation).subscribe)
    db = await connect(settings.database_url)
    store = EventStore(db.pool)
    try:
        async with (
            ServedApp(settings, app) as served,
            httpx.AsyncClient(base_url=served.url, timeout=20) as c,
        ):
            async with c.stream("GET", "/api/v1/sync-events", headers=ADMIN) as open_stream:
                assert open_stream.status_code == 200
                frames = sse_frames(open_stream)
                assert (await anext(frames)) == {"comment": "connected"}
                [before] = await store.append([NewEvent("task.created", {"task_id": "up"})])
                frame = await anext(f async for f in frames if "id" in f)
                assert int(frame["id"]) == before.position

                ray.kill(bus, no_restart=True)
                # The replica sees the bus gone (its subscription fails): new streams are
                # refused, with the error body, before a 200.
                for path, accept in STREAMS:
                    r = await _refusal(c, path, {**ADMIN, **accept})
                    assert not r.headers["content-type"].startswith("text/event-stream")
                    body = r.json()
                    assert body["ok"] is False and body["code"] == "service_unavailable"
                    assert body["request_id"] and r.headers["Retry-After"] == "1"

                # Committed while no bus runs: the open stream gets it once one runs again.
                [during] = await store.append([NewEvent("task.created", {"task_id": "down"})])
                bus = await _start_bus(settings, generation)
                frame = await asyncio.wait_for(anext(f async for f in frames if "id" in f), 30)
                assert int(frame["id"]) == during.position
                assert json.loads(frame["data"])["aggregate_id"] == "down"

            # And new streams start again.
            for path, accept in STREAMS:
                async with c.stream("GET", path, headers={**ADMIN, **accept}) as r:
                    assert r.status_code == 200
                    assert (await anext(sse_frames(r))) == {"comment": "connected"}
    finally:
        await db.close()
        ray.kill(bus, no_restart=True)
