"""The SDK's transport behaviour against real loopback servers: retries of 429/503 and
connection failures honouring Retry-After, environment defaults, an injected httpx client,
and the /sync-events iterator reconnecting with Last-Event-ID after the server drops it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchestrator.sdk import ApiError, AsyncClient, Client, RetryPolicy
from orchestrator.sdk._base import retry_after

WHOAMI = {"ok": True, "user_uuid": "alice", "admin": False}


def _event(position: int) -> dict[str, Any]:
    return {
        "id": f"ev-{position}",
        "type": "workflow.created",
        "version": 1,
        "aggregate_id": "wf-1",
        "seq": position,
        "timestamp": 1_700_000_000_000 + position,
        "data": {"n": position},
        "position": position,
        "user_uuid": "alice",
    }


def _frame(position: int) -> bytes:
    body = json.dumps(_event(position))
    return f"id: {position}\nevent: workflow:created\ndata: {body}\n\n".encode()


@dataclass
class Peer:
    base: str = ""
    # Statuses answered before the 200, in order, each with its headers.
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    # /sync-events: what each successive connection sends before it ends.
    streams: list[list[bytes]] = field(default_factory=list)

    def reset(self) -> None:
        self.script.clear()
        self.times.clear()
        self.seen.clear()
        self.streams.clear()


def build_peer(peer: Peer) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Response:
        peer.times.append(time.monotonic())
        headers = {k.lower(): v for k, v in request.headers.items()}
        peer.seen.append((request.method, request.url.path, headers))
        response: Response = await call_next(request)
        return response

    def scripted(body: dict[str, Any]) -> Response:
        if peer.script:
            status, headers = peer.script.pop(0)
            error = {"ok": False, "error": "busy", "code": f"c{status}", "request_id": "r"}
            return JSONResponse(error, status_code=status, headers=headers)
        return JSONResponse(body)

    @app.get("/api/v1/whoami")
    async def whoami() -> Response:
        return scripted(WHOAMI)

    @app.post("/api/v1/workflows")
    async def create() -> Response:
        return scripted({"ok": True, "id": "wf-1", "status": "pending"})

    @app.get("/api/v1/health")
    async def health() -> Response:
        body = {
            "status": "degraded",
            "version": "0",
            "uptime_seconds": 1.0,
            "components": {
                "store": {"status": "degraded", "tables": 0},
                "messaging": {"status": "ok", "sockets": 0},
                "providers": {"total": 0, "healthy": 0},
                "workers": {"active": 0, "idle": 0},
            },
        }
        return JSONResponse(body, status_code=503)

    @app.get("/api/v1/sync-events")
    async def sync_events() -> Response:
        frames = peer.streams.pop(0) if peer.streams else []

        async def body() -> AsyncIterator[bytes]:
            yield b"retry: 20\n: connected\n\n"
            for frame in frames:
                yield frame

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, socket.socket, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "loopback server did not start"
        time.sleep(0.02)
    return server, thread, sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def running_peer() -> Iterator[Peer]:
    peer = Peer()
    server, thread, sock, peer.base = _serve(build_peer(peer))
    try:
        yield peer
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def peer(running_peer: Peer) -> Peer:
    running_peer.reset()
    return running_peer


# --- retries -------------------------------------------------------------------------------


def test_429_is_retried_after_its_retry_after(peer: Peer) -> None:
    peer.script = [(429, {"Retry-After": "1"})]
    with Client(peer.base, "k") as api:
        assert api.whoami().user_uuid == "alice"
    assert len(peer.times) == 2
    # Retry-After: 1 s, not the first backoff step (<= 0.5 s).
    assert peer.times[1] - peer.times[0] >= 0.95


def test_503_is_retried_max_retries_times_then_raised(peer: Peer) -> None:
    fast = {"Retry-After": "0"}
    peer.script = [(503, fast), (503, fast)]
    with Client(peer.base, "k") as api:
        assert api.whoami().admin is False  # two retries (the default) were enough
    assert len(peer.times) == 3

    peer.reset()
    peer.script = [(503, fast), (503, fast)]
    with Client(peer.base, "k", max_retries=1) as api, pytest.raises(ApiError) as caught:
        api.whoami()
    assert (caught.value.status, caught.value.code) == (503, "c503")
    assert len(peer.times) == 2

    peer.reset()
    peer.script = [(429, fast)]
    with Client(peer.base, "k", max_retries=0) as api, pytest.raises(ApiError) as caught:
        api.create_workflow("x", [{"name": "a", "prompt": "p"}])
    assert caught.value.status == 429 and len(peer.times) == 1


def test_a_post_answered_429_is_retried_and_other_errors_are_not(peer: Peer) -> None:
    peer.script = [(429, {"Retry-After": "0"})]
    with Client(peer.base, "k") as api:
        assert api.create_workflow("x", [{"name": "a", "prompt": "p"}]).id == "wf-1"
    assert [s[0] for s in peer.seen] == ["POST", "POST"]

    peer.reset()
    peer.script = [(500, {}), (500, {})]
    with Client(peer.base, "k") as api, pytest.raises(ApiError) as caught:
        api.whoami()
    assert caught.value.status == 500 and len(peer.times) == 1


def test_a_degraded_health_503_is_an_answer_not_retried(peer: Peer) -> None:
    with Client(peer.base) as api:
        assert api.health().status == "degraded"
    assert len(peer.times) == 1


async def test_async_client_retries_after_retry_after(peer: Peer) -> None:
    peer.script = [(429, {"Retry-After": "1"}), (503, {"Retry-After": "0"})]
    async with AsyncClient(peer.base, "k") as api:
        assert (await api.whoami()).user_uuid == "alice"
    assert len(peer.times) == 3
    assert peer.times[1] - peer.times[0] >= 0.95


def test_retry_after_forms() -> None:
    def answer(**headers: str) -> httpx.Response:
        return httpx.Response(429, headers=headers)

    assert retry_after(answer(**{"Retry-After": "2.5"})) == 2.5
    assert retry_after(answer(**{"Retry-After-Ms": "250", "Retry-After": "9"})) == 0.25
    soon = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < (retry_after(answer(**{"Retry-After": soon})) or 0) <= 31
    assert retry_after(answer(**{"Retry-After": "soon"})) is None
    assert retry_after(answer()) is None
    policy = RetryPolicy(max_retries=2, initial=0.5, max_delay=8.0, max_retry_after=60)
    # Beyond max_retry_after the backoff is used instead of waiting that long.
    assert policy.delay(0, answer(**{"Retry-After": "3600"})) <= 0.5
    assert 3.0 <= policy.backoff(3) <= 4.0


class CountingTransport(httpx.HTTPTransport):
    """The real transport, counting what it is asked to send."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_retried_for_every_method() -> None:
    transport = CountingTransport()
    with httpx.Client(transport=transport) as http:
        api = Client(f"http://127.0.0.1:{_closed_port()}", "k", http_client=http, max_retries=2)
        with pytest.raises(httpx.ConnectError):
            api.create_workflow("x", [{"name": "a", "prompt": "p"}])
    assert transport.sent == 3


@pytest.fixture
def hang_up_server() -> Iterator[tuple[str, list[str]]]:
    """Reads each request line, then closes without answering (a crash mid-request)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    requests: list[str] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                requests.append(conn.recv(65536).split(b"\r\n", 1)[0].decode())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", requests
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_dropped_answer_is_retried_only_when_idempotent(
    hang_up_server: tuple[str, list[str]],
) -> None:
    url, requests = hang_up_server
    with Client(url, "k", max_retries=2) as api:
        with pytest.raises(httpx.RemoteProtocolError):
            api.whoami()
        assert len(requests) == 3  # a GET cannot have changed anything: sent again
        # The peer hangs up with the POST's body unread: the kernel may answer with a reset
        # (ReadError) instead of a clean close; either way the answer was dropped.
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            api.create_workflow("x", [{"name": "a", "prompt": "p"}])
    # The POST may have created the workflow before the connection dropped: sent once.
    assert [r.split()[0] for r in requests] == ["GET", "GET", "GET", "POST"]


# --- configuration -------------------------------------------------------------------------


def test_environment_defaults_and_explicit_arguments(
    peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_BASE_URL", peer.base)
    monkeypatch.setenv("ORCH_API_KEY", "orch_from_env")
    with Client() as api:
        assert api.base_url == peer.base + "/api/v1"
        api.whoami()
    with Client(api_key="orch_explicit") as api:
        api.whoami()
    with Client("http://127.0.0.1:1", token="orch_token_kw") as api:
        assert api.base_url == "http://127.0.0.1:1/api/v1"
    assert [s[2]["authorization"] for s in peer.seen] == [
        "Bearer orch_from_env",
        "Bearer orch_explicit",
    ]
    monkeypatch.delenv("ORCH_BASE_URL")
    monkeypatch.delenv("ORCH_API_KEY")
    with Client() as api:
        assert api.base_url == "http://127.0.0.1:8000/api/v1" and api.api_key is None


def test_an_injected_http_client_is_used_and_left_open(peer: Peer) -> None:
    sent: list[httpx.Request] = []
    with httpx.Client(headers={"X-Team": "blue"}, event_hooks={"request": [sent.append]}) as http:
        api = Client(peer.base, "k", http_client=http)
        assert api.whoami().user_uuid == "alice"
        api.close()
        assert not http.is_closed
        assert api.whoami().user_uuid == "alice"
    assert len(sent) == 2
    assert peer.seen[0][2]["x-team"] == "blue"
    assert peer.seen[0][2]["authorization"] == "Bearer k"


async def test_an_injected_async_client_is_used(peer: Peer) -> None:
    async with httpx.AsyncClient() as http:
        async with AsyncClient(peer.base, "k", http_client=http) as api:
            assert (await api.whoami()).user_uuid == "alice"
        assert not http.is_closed


# --- /sync-events --------------------------------------------------------------------------


def test_sync_events_reconnects_with_last_event_id(peer: Peer) -> None:
    too_slow = b'event: error\ndata: {"error": "too slow", "code": "subscriber_too_slow"}\n\n'
    peer.streams = [
        [_frame(1), _frame(2)],  # then the server ends the stream
        [_frame(3), too_slow],  # then drops this subscriber for lagging
        [_frame(4), _frame(5)],
    ]
    with Client(peer.base, "k") as api:
        got = []
        for event in api.sync_events("wf-1", types=["workflow.created"]):
            got.append(event.position)
            if len(got) == 5:
                break
    assert got == [1, 2, 3, 4, 5]
    asks = [s for s in peer.seen if s[1] == "/api/v1/sync-events"]
    assert [a[2].get("last-event-id") for a in asks] == [None, "2", "3"]
    assert all(a[2]["accept"] == "text/event-stream" for a in asks)


async def test_async_sync_events_reconnects_and_raises_other_stream_errors(peer: Peer) -> None:
    gone = b'event: error\ndata: {"error": "no", "code": "forbidden"}\n\n'
    peer.streams = [[_frame(7)], [_frame(8), gone]]
    got = []
    async with AsyncClient(peer.base, "k") as api:
        with pytest.raises(ApiError) as caught:
            async for event in api.sync_events(last_event_id=6):
                got.append(event.position)
    assert got == [7, 8] and caught.value.code == "forbidden"
    asks = [s for s in peer.seen if s[1] == "/api/v1/sync-events"]
    assert [a[2].get("last-event-id") for a in asks] == ["6", "7"]
