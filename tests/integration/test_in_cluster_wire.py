"""The in-cluster wire without Ray: `AsyncServeTransport` (orchestrator/sdk/_in_cluster.py)
and the replica's side (`deployments.in_cluster.serve_request`) against the real app (real
Postgres and Redis). Only Serve's handle is stood in for, by `LoopHandle`, which calls the
replica's method in this process as Serve would on the replica. What goes through Ray
itself is covered by tests/e2e/test_in_cluster.py on a `ray start` cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from deployments import in_cluster
from deployments.api import create_app
from deployments.in_cluster import serve_request
from orchestrator.sdk import ApiError
from orchestrator.sdk._in_cluster import (
    HANDLE_BASE_URL,
    AsyncServeTransport,
    HandleRequest,
    in_cluster_async_client,
)
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.openai_server import FakeReply, OpenAIFake

INGRESS_KEY = "ingress-key-0123456789abcdef0123"


class _Answer:
    """What `handle.options(stream=True).remote()` gives: an async iterator with cancel().
    As on a Serve replica, the method's generator runs on its own (its items queue up for
    the caller), and cancel() cancels it: a CancelledError at its await."""

    _END = object()

    def __init__(self, items: AsyncIterator[Any]) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(items))
        self.cancelled = False

    async def _run(self, items: AsyncIterator[Any]) -> None:
        try:
            async for item in items:
                await self._queue.put(item)
        except Exception as exc:  # noqa: BLE001 - handed to the caller, as Serve does
            self._queue.put_nowait(exc)
        finally:
            self._queue.put_nowait(self._END)

    @property
    def closed(self) -> bool:
        """The replica's side ended (its generator finished or was cancelled)."""
        return self._task.done()

    def __aiter__(self) -> _Answer:
        return self

    async def __anext__(self) -> Any:
        item = await self._queue.get()
        if item is self._END:
            self._queue.put_nowait(item)
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True
        self._task.cancel()


class LoopHandle:
    """A stand-in for the Api deployment handle that runs `handle_request` in this loop."""

    def __init__(self, app: FastAPI, ingress_key: str | None) -> None:
        self._app = app
        self._key = ingress_key
        self.options_seen: dict[str, Any] = {}
        self.answers: list[_Answer] = []

    def options(self, **options: Any) -> LoopHandle:
        self.options_seen = options
        return self

    def remote(self, request: HandleRequest) -> _Answer:
        assert isinstance(request, HandleRequest)
        answer = _Answer(serve_request(self._app, request, self._key))
        self.answers.append(answer)
        return answer


def _client(handle: LoopHandle, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=AsyncServeTransport(handle), base_url=HANDLE_BASE_URL, headers=headers
    )


async def _tenant_token(api: httpx.AsyncClient, user: str) -> str:
    response = await api.post("/tokens", json={"user_uuid": user})
    assert response.status_code == 200, response.text
    return str(response.json()["token"])


async def test_a_handle_request_acts_as_its_token_and_nothing_else(make_settings) -> None:
    settings = make_settings(ingress_key=INGRESS_KEY)
    app = create_app(settings)
    async with app.router.lifespan_context(app), ServedApp(settings) as served:
        handle = LoopHandle(app, INGRESS_KEY)
        async with _client(handle, ADMIN_TOKEN) as admin:
            assert handle.options_seen == {"method_name": "handle_request", "stream": True}
            who = await admin.get("/whoami")
            assert who.status_code == 200 and who.json()["admin"] is True
            # The replica made the request id and says it, as Serve's proxy does over HTTP.
            assert len(who.headers["x-request-id"]) == 32
            ann = await _tenant_token(admin, "ann")
            bob = await _tenant_token(admin, "bob")

        # Over HTTP the ingress key is required (issue 19); the handle is not HTTP.
        async with httpx.AsyncClient(base_url=served.url + "/api/v1") as http:
            direct = await http.get("/whoami", headers={"Authorization": f"Bearer {ann}"})
            assert direct.status_code == 421

        async with _client(handle, ann) as as_ann:
            created = await as_ann.post(
                "/workflows", json={"name": "w", "steps": [{"name": "a", "prompt": "hi"}]}
            )
            assert created.status_code == 200, created.text
            workflow_id = created.json()["id"]
            mine = await as_ann.get(f"/workflows/{workflow_id}")
            assert mine.status_code == 200 and mine.json()["id"] == workflow_id

        async with _client(handle, bob) as as_bob:
            theirs = await as_bob.get(f"/workflows/{workflow_id}")
            assert theirs.status_code == 404 and theirs.json()["code"] == "not_found"
            # Headers that only the service decides are not the caller's to set.
            forged = await as_bob.get(
                "/whoami",
                headers={
                    "X-Orch-Ingress": "wrong",
                    "X-Forwarded-For": "10.9.9.9",
                    "X-Request-ID": "chosen-by-caller",
                },
            )
            assert forged.status_code == 200 and forged.json()["user_uuid"] == "bob"
            assert forged.headers["x-request-id"] != "chosen-by-caller"

        async with _client(handle, "orch_not-a-real-token-000000000000") as stranger:
            denied = await stranger.get("/whoami")
            assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"
        async with _client(handle, None) as nobody:
            assert (await nobody.get("/whoami")).status_code == 401


async def test_failed_auth_over_the_handle_is_throttled_as_one_address(make_settings) -> None:
    settings = make_settings(auth_failures_per_address=3, auth_failure_window_s=60)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        handle = LoopHandle(app, None)
        statuses = []
        for i in range(5):
            async with _client(handle, f"orch_guess-{i:030d}") as guesser:
                # A different forwarded address each time: it must not be a new bucket.
                answer = await guesser.get("/whoami", headers={"X-Forwarded-For": f"10.0.0.{i}"})
                statuses.append(answer.status_code)
        assert statuses[:3] == [401, 401, 401] and statuses[-1] == 429, statuses


async def test_a_stream_arrives_in_chunks_and_leaving_it_ends_it(make_settings) -> None:
    settings = make_settings()
    app = create_app(settings)
    before = asyncio.all_tasks()
    async with app.router.lifespan_context(app):
        handle = LoopHandle(app, None)
        async with _client(handle, ADMIN_TOKEN) as admin:
            async with admin.stream("GET", "/sync-events") as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                await admin.post("/tokens", json={"user_uuid": "carl"})
                seen = ""
                async with asyncio.timeout(30):  # a stalled stream fails, it does not hang
                    async for text in stream.aiter_text():
                        seen += text
                        if "data:" in seen:
                            break
            assert "data:" in seen
            answer = handle.answers[0]
            assert answer.cancelled
        # The route saw the disconnect and ended: no request of the handle is left running.
        deadline = asyncio.get_running_loop().time() + 10
        while in_cluster._finishing or not answer.closed:
            assert asyncio.get_running_loop().time() < deadline, in_cluster._finishing
            await asyncio.sleep(0.02)
    # Nothing of the request is left waiting (the replica's wait for the app's next message
    # was left pending forever, once per stream its caller left).
    left = [t.get_coro() for t in asyncio.all_tasks() - before if not t.done()]
    assert [c for c in left if getattr(c, "__qualname__", "") == "Queue.get"] == []


@pytest.mark.parametrize("size", [0, 70_000])
async def test_bodies_go_both_ways_whole(make_settings, size: int) -> None:
    settings = make_settings()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        handle = LoopHandle(app, None)
        async with _client(handle, ADMIN_TOKEN) as admin:
            text = "é" * size
            put = await admin.post("/workspace/write", json={"path": "big.txt", "content": text})
            assert put.status_code == 200, put.text
            got = await admin.post("/workspace/read", json={"path": "big.txt"})
            assert got.status_code == 200 and got.json()["content"] == text


async def _grant(admin: httpx.AsyncClient, user: str) -> dict[str, Any]:
    """A token for `user`: its grant is an event on `user`'s stream."""
    response = await admin.post("/tokens", json={"user_uuid": user})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def _events_until(events: Any, wanted: Any, bound: float = 30) -> list[Any]:
    """Events from the SDK iterator up to the first `wanted(event)`, each awaited with a
    bound (a stalled stream fails instead of hanging); the iterator is then closed."""
    seen: list[Any] = []
    try:
        while not seen or not wanted(seen[-1]):
            seen.append(await asyncio.wait_for(events.__anext__(), bound))
    finally:
        await events.aclose()
    return seen


async def _handle_side_ended(handle: LoopHandle) -> None:
    """Every answer of the handle ended or was closed, and no request of it is running."""
    deadline = asyncio.get_running_loop().time() + 10
    while in_cluster._finishing or not all(a.closed for a in handle.answers):
        assert asyncio.get_running_loop().time() < deadline, in_cluster._finishing
        await asyncio.sleep(0.02)


async def test_sync_events_resume_tenancy_and_revocation_over_the_handle(make_settings) -> None:
    settings = make_settings()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        handle = LoopHandle(app, None)
        async with _client(handle, ADMIN_TOKEN) as admin:
            bob = await _grant(admin, "bob")
            await _grant(admin, "ann")  # another tenant's event, between bob's
            again = await _grant(admin, "bob")
        sdk = in_cluster_async_client(bob["token"], handle=handle, max_retries=0)
        async with sdk:
            # From the start: bob's grants only, in order.
            first = await _events_until(
                sdk.sync_events(last_event_id=0), lambda e: e.data.get("user_uuid") == "bob"
            )
            assert {e.user_uuid for e in first} == {"bob"}
            # Resumed after the first: the next grant of bob's, ann's skipped.
            resumed = await _events_until(
                sdk.sync_events(last_event_id=first[-1].position),
                lambda e: e.type == "audit.permission_grant",
            )
            assert resumed[0].position > first[-1].position
            assert {e.user_uuid for e in resumed} == {"bob"}
            # Following from there (the stream may open before or after the next grants:
            # from its Last-Event-ID nothing is missed): ann's never shows, bob's does.
            events = sdk.sync_events(last_event_id=resumed[-1].position)
            pending = asyncio.ensure_future(events.__anext__())
            async with _client(handle, ADMIN_TOKEN) as admin:
                await _grant(admin, "ann")
                late = await _grant(admin, "bob")
                got = await asyncio.wait_for(pending, 30)
                assert got.user_uuid == "bob" and got.type == "audit.permission_grant"
                await events.aclose()
                await _handle_side_ended(handle)
                # Revoked: reconnecting with the last event seen is refused, as over HTTP.
                revoked = await admin.delete(f"/tokens/{bob['prefix']}")
                assert revoked.status_code == 200, revoked.text
            with pytest.raises(ApiError) as refused:
                await sdk.sync_events(last_event_id=got.position).__anext__()
            assert (refused.value.status, refused.value.code) == (401, "unauthorized")
        assert again["user_uuid"] == late["user_uuid"] == "bob"


async def test_a_streamed_completion_comes_chunk_by_chunk_over_the_handle(make_settings) -> None:
    pieces, delay = 5, 0.2
    async with OpenAIFake(api_key="sk-openai") as oai:
        settings = make_settings(
            providers={
                "openai": {"base_url": oai.base_url, "api_key": "sk-openai", "models": ["gpt-4o"]}
            },
            rate_limit_per_minute=0,
        )
        app = create_app(settings)
        text = "one two three four five "
        oai.script([FakeReply(text=text, text_chunk=len(text) // pieces, delay_s=delay)])
        async with app.router.lifespan_context(app):
            handle = LoopHandle(app, None)
            async with in_cluster_async_client(ADMIN_TOKEN, handle=handle) as sdk:
                loop = asyncio.get_running_loop()
                messages = [{"role": "user", "content": "hi"}]
                stream = sdk.chat_completion_stream(messages, model="gpt-4o")
                arrived: list[tuple[float, str]] = []
                async for chunk in stream:
                    content = chunk.choices[0].delta.get("content") if chunk.choices else None
                    arrived.append((loop.time(), content or ""))
        assert "".join(c for _, c in arrived) == text
        # The fake pauses `delay` between chunks: passed on as they come, they are read with
        # those pauses between them; held back, all after the first would come in one burst.
        pauses = [b[0] - a[0] for a, b in pairwise(arrived)]
        assert sum(p >= delay / 2 for p in pauses) >= pieces - 2, arrived
