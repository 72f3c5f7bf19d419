"""The FastAPI app in-process (uvicorn on loopback) with the real Postgres and Redis."""

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis
from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def samples(text: str, name: str) -> list:
    return [
        s for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name
    ]


async def test_auth_tokens_and_errors(make_settings) -> None:
    async with ServedApp(make_settings()) as app, httpx.AsyncClient(base_url=app.url) as c:
        r = await c.get("/api/v1/whoami")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        body = r.json()
        assert body["ok"] is False and body["code"] == "unauthorized" and body["request_id"]
        assert r.headers["x-request-id"] == body["request_id"]

        r = await c.get("/api/v1/whoami", headers={**ADMIN, "X-Request-ID": "trace-123"})
        assert r.json() == {"ok": True, "user_uuid": "admin", "admin": True}
        # A client's own id is never the request's (docs/design-notes.md, "Request ids").
        assert r.headers["x-request-id"] != "trace-123"

        r = await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "alice"})
        assert r.status_code == 200
        alice = r.json()
        assert alice["ok"] and alice["user_uuid"] == "alice" and alice["admin"] is False
        as_alice = {"Authorization": f"Bearer {alice['token']}"}
        assert (await c.get("/api/v1/whoami", headers=as_alice)).json()["user_uuid"] == "alice"

        # Only admins issue tokens.
        r = await c.post("/api/v1/tokens", headers=as_alice, json={"user_uuid": "alice"})
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
        # Validation errors are 400 and name the field.
        r = await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "", "admin": "x"})
        assert r.status_code == 400
        assert {f["field"] for f in r.json()["fields"]} == {"user_uuid", "admin"}
        r = await c.post(
            "/api/v1/tokens",
            headers={**ADMIN, "Content-Type": "application/json"},
            content=b"{not json",
        )
        assert r.status_code == 400 and r.json()["ok"] is False
        # Unknown routes answer with the same error body.
        r = await c.get("/api/v1/nowhere", headers=ADMIN)
        assert r.status_code == 404 and r.json()["code"] == "not_found"

        # Bob cannot revoke Alice's token (it is not found for him); Alice can.
        bob = (await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "bob"})).json()
        as_bob = {"Authorization": f"Bearer {bob['token']}"}
        r = await c.delete(f"/api/v1/tokens/{alice['prefix']}", headers=as_bob)
        assert r.status_code == 404
        r = await c.delete(f"/api/v1/tokens/{alice['prefix']}", headers=as_alice)
        assert r.json() == {"ok": True, "revoked": 1}
        assert (await c.get("/api/v1/whoami", headers=as_alice)).status_code == 401
        assert (await c.get("/api/v1/whoami", headers=as_bob)).status_code == 200


async def test_rate_limit_answers_429_with_retry_after(make_settings) -> None:
    async with (
        ServedApp(make_settings(rate_limit_per_minute=5)) as app,
        httpx.AsyncClient(base_url=app.url) as c,
    ):
        # A fresh credential: the budget is per token (the shared Redis has seen the admin's).
        token = (await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "eve"})).json()
        eve = {"Authorization": f"Bearer {token['token']}"}
        codes = [(await c.get("/api/v1/whoami", headers=eve)).status_code for _ in range(7)]
        assert codes[:5] == [200] * 5 and codes[5:] == [429, 429]
        r = await c.get("/api/v1/whoami", headers=eve)
        assert 1 <= int(r.headers["retry-after"]) <= 61 and r.json()["code"] == "rate_limited"
        # Exempt paths need no credential at all.
        assert (await c.get("/api/v1/ready")).text == "OK"
        # Other credentials are unaffected.
        assert (await c.get("/api/v1/whoami", headers=ADMIN)).status_code == 200


async def test_operations_endpoints(make_settings) -> None:
    async with ServedApp(make_settings()) as app, httpx.AsyncClient(base_url=app.url) as c:
        for _ in range(3):
            await c.get("/api/v1/whoami", headers=ADMIN)
        await c.get("/api/v1/tokens/orch_doesnotexist", headers=ADMIN)
        r = await c.get("/api/v1/health")
        assert r.status_code == 200
        h = r.json()
        assert h["status"] == "ok" and h["version"] and h["uptime_seconds"] >= 0
        assert (
            h["components"]["store"]
            == {"status": "ok", "tables": h["components"]["store"]["tables"]}
            and h["components"]["store"]["tables"] >= 4
        )
        assert h["components"]["messaging"]["status"] == "ok"
        assert set(h["components"]["providers"]) == {"total", "healthy"}
        assert set(h["components"]["workers"]) == {"active", "idle"}

        r = await c.get("/api/v1/ready")
        assert r.status_code == 200 and r.text == "OK"

        text = (await c.get("/api/v1/metrics")).text
        families = {f.name for f in text_string_to_metric_families(text)}
        assert {
            "svc_http_requests",
            "svc_provider_latency_seconds",
            "svc_circuit_breaker_state",
            "svc_active_workers",
            "svc_memory_bytes",
            "svc_event",
        } <= families
        counts = {
            (s.labels["method"], s.labels["path"], s.labels["status"]): s.value
            for s in samples(text, "svc_http_requests_total")
        }
        assert counts[("GET", "/api/v1/whoami", "200")] == 3
        # Route templates, never raw paths.
        assert counts[("GET", "/api/v1/tokens/{prefix}", "405")] == 1
        assert not any("orch_doesnotexist" in k[1] for k in counts)
        assert samples(text, "svc_memory_bytes")[0].value > 10_000_000

        slo = (await c.get("/api/v1/slo")).json()
        assert set(slo) == {"latency_p99", "uptime_7d", "error_rate"}
        for entry in slo.values():
            assert set(entry) == {"target", "current", "compliant"}
        assert slo["latency_p99"]["target"] == 0.5 and slo["error_rate"]["current"] == 0.0
        assert slo["latency_p99"]["current"] > 0


async def test_health_is_503_when_redis_is_down(make_settings, tmp_path) -> None:
    redis = EmbeddedRedis(tmp_path / "own-redis")
    url = redis.start()
    try:
        async with (
            ServedApp(make_settings(redis_url=url)) as app,
            httpx.AsyncClient(base_url=app.url) as c,
        ):
            assert (await c.get("/api/v1/health")).status_code == 200
            redis.stop()
            r = await c.get("/api/v1/health")
            assert r.status_code == 503
            body = r.json()
            assert body["status"] == "degraded"
            assert body["components"]["messaging"]["status"] == "degraded"
            assert body["components"]["store"]["status"] == "ok"
            # /ready does not look downstream, and the API keeps serving (the rate limit fails
            # open while its counter store is away).
            assert (await c.get("/api/v1/ready")).status_code == 200
            assert (await c.get("/api/v1/whoami", headers=ADMIN)).status_code == 200
            redis.start()
            for _ in range(50):
                if (await c.get("/api/v1/health")).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("health did not recover after Redis came back")
    finally:
        redis.stop()


async def test_jwt_bearer_through_the_middleware(make_settings) -> None:
    import time

    import jwt

    secret = "jwt-secret-" + "x" * 32
    async with (
        ServedApp(make_settings(jwt_secret=secret, jwt_audience="orch")) as app,
        httpx.AsyncClient(base_url=app.url) as c,
    ):
        claims = {"sub": "frank", "aud": "orch", "exp": time.time() + 60}
        good = jwt.encode(claims, secret, algorithm="HS256")
        r = await c.get("/api/v1/whoami", headers={"Authorization": f"Bearer {good}"})
        assert r.json() == {"ok": True, "user_uuid": "jwt:frank", "admin": False}
        bad = jwt.encode({**claims, "aud": "elsewhere"}, secret, algorithm="HS256")
        r = await c.get("/api/v1/whoami", headers={"Authorization": f"Bearer {bad}"})
        assert r.status_code == 401 and "JWT" in r.json()["error"]
        # Opaque tokens keep working beside JWTs.
        assert (await c.get("/api/v1/whoami", headers=ADMIN)).status_code == 200


async def test_store_down_is_503_not_500(make_settings, tmp_path) -> None:
    pg = EmbeddedPostgres(tmp_path / "own-pg")
    url = pg.start()
    try:
        async with (
            ServedApp(make_settings(database_url=url)) as app,
            httpx.AsyncClient(base_url=app.url) as c,
        ):
            made = await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "gail"})
            gail = {"Authorization": f"Bearer {made.json()['token']}"}  # not yet cached
            pg.stop()
            r = await c.get("/api/v1/whoami", headers=gail)
            assert r.status_code == 503 and r.json()["code"] == "service_unavailable"
            assert "retry-after" in r.headers
            r = await c.get("/api/v1/health")
            assert r.status_code == 503
            assert r.json()["components"]["store"]["status"] == "degraded"
            # A token verified before the outage keeps working from the replica's cache.
            assert (await c.get("/api/v1/whoami", headers=ADMIN)).status_code == 200
            pg.restart()
            for _ in range(100):
                if (await c.get("/api/v1/whoami", headers=gail)).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("auth did not recover after Postgres came back")
    finally:
        pg.stop()


async def test_request_bodies_over_the_limit_are_413(make_settings) -> None:
    settings = make_settings(max_request_bytes=4096, rate_limit_per_minute=0)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        big = {"path": "a.txt", "content": "x" * 5000}
        r = await c.post("/api/v1/workspace/write", headers=ADMIN, json=big)  # Content-Length
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        assert r.json()["limit"] == 4096

        async def chunks():
            yield b'{"path": "a.txt", "content": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}'

        r = await c.post(  # chunked: no length to judge by, counted as it arrives
            "/api/v1/workspace/write",
            headers={**ADMIN, "Content-Type": "application/json"},
            content=chunks(),
        )
        assert r.status_code == 413, r.text
        small = {"path": "a.txt", "content": "x" * 100}
        assert (await c.post("/api/v1/workspace/write", headers=ADMIN, json=small)).is_success
