"""The SDK against a real HTTP server on loopback that answers with the documented shapes."""

from __future__ import annotations

import pickle
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from orchestrator.sdk import (
    ApiError,
    AsyncClient,
    Client,
    Health,
    Slo,
    TokenCreated,
    TokenRevoked,
    WhoAmI,
    normalise_base_url,
)

ADMIN = "orch_admin_secret"
USER = "orch_user_secret"
PROMETHEUS = (
    "# HELP svc_http_requests_total HTTP requests\n"
    "# TYPE svc_http_requests_total counter\n"
    'svc_http_requests_total{method="GET",path="/api/v1/health",status="200"} 3.0\n'
)


def health_body(status: str) -> dict[str, Any]:
    degraded = status != "ok"
    return {
        "status": status,
        "version": "0.1.0",
        "uptime_seconds": 12.5,
        "components": {
            "store": {"status": "degraded" if degraded else "ok", "tables": 0 if degraded else 7},
            "messaging": {"status": "ok", "sockets": 2},
            "providers": {"total": 3, "healthy": 2},
            "workers": {"active": 1, "idle": 4},
        },
    }


SLO_BODY = {
    "latency_p99": {"target": 0.5, "current": 0.012, "compliant": True},
    "uptime_7d": {"target": 99.9, "current": 100.0, "compliant": True},
    "error_rate": {"target": 0.01, "current": 0.2, "compliant": False},
}


@dataclass
class Seen:
    method: str
    path: str
    raw_path: bytes
    headers: dict[str, str]
    body: bytes


@dataclass
class Peer:
    """What the fake service answers, and what it was asked."""

    base: str = ""
    degraded: bool = False
    proxy_503: bool = False
    slo_malformed: bool = False
    seen: list[Seen] = field(default_factory=list)

    def reset(self) -> None:
        self.degraded = self.proxy_503 = self.slo_malformed = False
        self.seen.clear()


def error(status: int, code: str, message: str, request_id: str, **extra: Any) -> JSONResponse:
    body = {"ok": False, "error": message, "code": code, "request_id": request_id, **extra}
    return JSONResponse(body, status_code=status, headers={"X-Request-ID": request_id})


def build_peer_app(peer: Peer) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Response:
        peer.seen.append(
            Seen(
                request.method,
                request.url.path,
                request.scope["raw_path"],
                {k.lower(): v for k, v in request.headers.items()},
                await request.body(),
            )
        )
        response: Response = await call_next(request)
        return response

    def caller(request: Request) -> tuple[str, bool] | None:
        return {f"Bearer {ADMIN}": ("admin", True), f"Bearer {USER}": ("alice", False)}.get(
            request.headers.get("authorization", "")
        )

    @app.get("/api/v1/health")
    async def health() -> Response:
        if peer.proxy_503:
            return PlainTextResponse("<html>503 Service Unavailable</html>", status_code=503)
        status = "degraded" if peer.degraded else "ok"
        return JSONResponse(health_body(status), status_code=503 if peer.degraded else 200)

    @app.get("/api/v1/ready")
    async def ready() -> Response:
        return PlainTextResponse("OK")

    @app.get("/api/v1/metrics")
    async def metrics() -> Response:
        return Response(PROMETHEUS, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/api/v1/slo")
    async def slo() -> Response:
        return JSONResponse(
            {"latency_p99": 1} if peer.slo_malformed else SLO_BODY,
            headers={"X-Request-ID": "req-slo"},
        )

    @app.get("/api/v1/whoami")
    async def whoami(request: Request) -> Response:
        who = caller(request)
        if who is None:
            return error(401, "unauthorized", "missing or invalid bearer token", "req-401")
        return JSONResponse({"ok": True, "user_uuid": who[0], "admin": who[1]})

    @app.post("/api/v1/tokens")
    async def create_token(request: Request) -> Response:
        who = caller(request)
        if who is None or not who[1]:
            return error(403, "forbidden", "admin only", "req-403")
        body = await request.json()
        return JSONResponse(
            {
                "ok": True,
                "token": "orch_new_token",
                "prefix": "orch_new",
                "user_uuid": body["user_uuid"],
                "admin": body["admin"],
            }
        )

    @app.delete("/api/v1/tokens/{prefix}")
    async def revoke_token(prefix: str) -> Response:
        if prefix == "orch_gone":
            return error(
                404,
                "not_found",
                f"no live token with prefix {prefix!r}",
                "req-404",
                detail_hint="x",
            )
        return JSONResponse({"ok": True, "revoked": 1})

    return app


@pytest.fixture(scope="module")
def running_peer() -> Iterator[Peer]:
    peer = Peer()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    peer.base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(build_peer_app(peer), log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "loopback server did not start"
        time.sleep(0.02)
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


# --- base URL --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", "/", "/api/v1", "/api/v1/", "//"])
def test_base_url_with_or_without_prefix(peer: Peer, suffix: str) -> None:
    with Client(peer.base + suffix) as api:
        assert api.base_url == peer.base + "/api/v1"
        assert api.ready() == "OK"
    assert [s.path for s in peer.seen] == ["/api/v1/ready"]


def test_normalise_base_url_refuses_non_http() -> None:
    assert normalise_base_url(" https://svc.example/api/v1/ ") == "https://svc.example/api/v1"
    with pytest.raises(ValueError, match="http"):
        normalise_base_url("svc.example:8000")


# --- operations ----------------------------------------------------------------------------


def test_health_parses_components(peer: Peer) -> None:
    with Client(peer.base) as api:
        health = api.health()
    assert isinstance(health, Health)
    assert health.status == "ok" and health.healthy
    assert health.version == "0.1.0" and health.uptime_seconds == 12.5
    assert health.components.store.tables == 7
    assert health.components.messaging.sockets == 2
    assert (health.components.providers.total, health.components.providers.healthy) == (3, 2)
    assert (health.components.workers.active, health.components.workers.idle) == (1, 4)


def test_degraded_health_is_an_answer_not_an_error(peer: Peer) -> None:
    peer.degraded = True
    with Client(peer.base) as api:
        health = api.health()
    assert health.status == "degraded" and not health.healthy
    assert health.components.store.status == "degraded"


def test_a_proxy_503_page_is_an_error(peer: Peer) -> None:
    peer.proxy_503 = True
    with Client(peer.base) as api, pytest.raises(ApiError) as caught:
        api.health()
    assert caught.value.status == 503
    assert caught.value.code == "http_503"
    assert "503 Service Unavailable" in caught.value.message
    assert caught.value.body is None


def test_metrics_is_prometheus_text_and_needs_no_token(peer: Peer) -> None:
    with Client(peer.base) as api:
        assert api.metrics() == PROMETHEUS
    assert "authorization" not in peer.seen[0].headers


def test_slo(peer: Peer) -> None:
    with Client(peer.base, token=USER) as api:
        slo = api.slo()
    assert isinstance(slo, Slo)
    assert slo.latency_p99.target == 0.5 and slo.latency_p99.compliant
    assert slo.uptime_7d.current == 100.0
    assert not slo.error_rate.compliant and not slo.compliant


def test_a_malformed_success_body_is_an_invalid_response(peer: Peer) -> None:
    peer.slo_malformed = True
    with Client(peer.base) as api, pytest.raises(ApiError) as caught:
        api.slo()
    assert (caught.value.status, caught.value.code) == (200, "invalid_response")
    assert caught.value.request_id == "req-slo"
    assert caught.value.body == {"latency_p99": 1}


# --- auth and tokens -----------------------------------------------------------------------


def test_whoami_sends_the_bearer_token(peer: Peer) -> None:
    with Client(peer.base, token=USER) as api:
        me = api.whoami()
    assert me == WhoAmI(ok=True, user_uuid="alice", admin=False)
    assert peer.seen[0].headers["authorization"] == f"Bearer {USER}"
    assert peer.seen[0].headers["user-agent"].startswith("orchestrator-sdk/")


def test_error_body_becomes_api_error(peer: Peer) -> None:
    with Client(peer.base) as api, pytest.raises(ApiError) as caught:
        api.whoami()
    err = caught.value
    assert (err.status, err.code, err.request_id) == (401, "unauthorized", "req-401")
    assert err.message == "missing or invalid bearer token"
    assert err.body == {
        "ok": False,
        "error": "missing or invalid bearer token",
        "code": "unauthorized",
        "request_id": "req-401",
    }
    assert str(err) == "401 unauthorized: missing or invalid bearer token, request_id=req-401"
    assert "authorization" not in peer.seen[0].headers


def test_api_error_pickles() -> None:
    err = ApiError(404, "not_found", "gone", "req-1", {"ok": False, "error": "gone"})
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.status, copy.code, copy.message, copy.request_id, copy.body) == (
        404,
        "not_found",
        "gone",
        "req-1",
        {"ok": False, "error": "gone"},
    )


def test_create_token_sends_the_documented_body(peer: Peer) -> None:
    with Client(peer.base, token=ADMIN) as api:
        created = api.create_token("bob", admin=True, description="ci")
    assert isinstance(created, TokenCreated)
    assert (created.token, created.prefix, created.user_uuid, created.admin) == (
        "orch_new_token",
        "orch_new",
        "bob",
        True,
    )
    seen = peer.seen[0]
    assert (seen.method, seen.path) == ("POST", "/api/v1/tokens")
    assert seen.headers["content-type"] == "application/json"
    assert seen.body == b'{"user_uuid":"bob","admin":true,"description":"ci"}'


def test_create_token_as_non_admin_is_forbidden(peer: Peer) -> None:
    with Client(peer.base, token=USER) as api, pytest.raises(ApiError) as caught:
        api.create_token("bob")
    assert (caught.value.status, caught.value.code) == (403, "forbidden")


def test_revoke_token(peer: Peer) -> None:
    with Client(peer.base, token=ADMIN) as api:
        assert api.revoke_token("orch_abc1") == TokenRevoked(ok=True, revoked=1)
        with pytest.raises(ApiError) as caught:
            api.revoke_token("orch_gone")
    assert [(s.method, s.path) for s in peer.seen] == [
        ("DELETE", "/api/v1/tokens/orch_abc1"),
        ("DELETE", "/api/v1/tokens/orch_gone"),
    ]
    err = caught.value
    assert (err.status, err.code, err.request_id) == (404, "not_found", "req-404")
    # Fields beyond the standard four stay available on the body.
    assert err.body is not None and err.body["detail_hint"] == "x"


def test_revoke_token_escapes_the_prefix(peer: Peer) -> None:
    with Client(peer.base, token=ADMIN) as api, pytest.raises(ApiError) as caught:
        api.revoke_token("a/b?c")
    # One escaped path segment, no query string: the server has no such route, so a plain
    # framework 404 (not the service's error body) comes back, still as an ApiError.
    assert peer.seen[0].raw_path == b"/api/v1/tokens/a%2Fb%3Fc"
    assert (caught.value.status, caught.value.code) == (404, "http_404")


# --- async ---------------------------------------------------------------------------------


async def test_async_client_same_answers(peer: Peer) -> None:
    async with AsyncClient(peer.base + "/api/v1/", token=ADMIN) as api:
        assert api.base_url == peer.base + "/api/v1"
        health = await api.health()
        assert health.healthy and health.components.store.tables == 7
        assert await api.ready() == "OK"
        assert await api.metrics() == PROMETHEUS
        assert (await api.slo()).uptime_7d.compliant
        assert await api.whoami() == WhoAmI(user_uuid="admin", admin=True)
        created = await api.create_token("carol", description="async")
        assert (created.user_uuid, created.admin) == ("carol", False)
        assert (await api.revoke_token("orch_abc1")).revoked == 1
    assert all(s.headers["authorization"] == f"Bearer {ADMIN}" for s in peer.seen)
    assert peer.seen[5].body == b'{"user_uuid":"carol","admin":false,"description":"async"}'


async def test_async_client_errors_and_degraded_health(peer: Peer) -> None:
    peer.degraded = True
    async with AsyncClient(peer.base, token="wrong") as api:
        assert (await api.health()).status == "degraded"
        with pytest.raises(ApiError) as caught:
            await api.whoami()
    assert (caught.value.status, caught.value.code, caught.value.request_id) == (
        401,
        "unauthorized",
        "req-401",
    )
