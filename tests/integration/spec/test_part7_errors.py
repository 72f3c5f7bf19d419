"""SPEC part 7, "Errors": every row of the table, each with the status the spec names, in
DESIGN.md's one error body (`{ok: false, error, code, request_id}`; the spec leaves the
general shape "not shown"). Each case's id is its table row."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.runtime import EmbeddedRedis
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.integration.spec._kit import ADMIN, TG_TOKEN, Spec, error_body, until


@pytest.fixture(scope="module")
async def sleeper(spec: Spec) -> AsyncIterator[int]:
    """A job whose run is going (its task answers after a while) for the 409 rows."""
    r = await spec.c.post(
        "/schedules", headers=ADMIN, json={"prompt": "[sleep 10]", "every": 3_600_000}
    )
    assert r.status_code == 200, r.text
    jid = int(r.json()["id"])
    r = await spec.c.post(f"/schedules/{jid}/run", headers=ADMIN)
    assert r.status_code == 200, r.text

    async def running() -> bool:
        return bool((await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()["running"])

    await until(running)
    yield jid


async def _job(spec: Spec, **extra: Any) -> int:
    r = await spec.c.post(
        "/schedules", headers=ADMIN, json={"prompt": "x", "every": 3_600_000, **extra}
    )
    assert r.status_code == 200, r.text
    return int(r.json()["id"])


def expect(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return error_body(r)


# --- Scheduler ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"every": 1000}, id="SPEC part 7: POST /schedules 400 missing prompt"),
        pytest.param(
            {"prompt": "x"}, id="SPEC part 7: POST /schedules 400 invalid schedule (none given)"
        ),
        pytest.param(
            {"prompt": "x", "every": 1000, "cron": "* * * * *"},
            id="SPEC part 7: POST /schedules 400 invalid schedule (two given)",
        ),
        pytest.param(
            {"prompt": "x", "every": 0},
            id="SPEC part 7: POST /schedules 400 invalid schedule (every not positive)",
        ),
        pytest.param(
            {"prompt": "x", "schedule": "whenever the moon is full"},
            id="SPEC part 7: POST /schedules 400 invalid schedule (natural language)",
        ),
        pytest.param(
            {"prompt": "x", "cron": "61 * * * *"},
            id="SPEC part 7: POST /schedules 400 invalid cron expression (range)",
        ),
        pytest.param(
            {"prompt": "x", "cron": "* * * *"},
            id="SPEC part 7: POST /schedules 400 invalid cron expression (4 fields)",
        ),
    ],
)
async def test_schedule_create_400(spec: Spec, body: dict[str, Any]) -> None:
    expect(await spec.c.post("/schedules", headers=ADMIN, json=body), 400)


async def test_schedule_create_403(spec: Spec) -> None:
    """SPEC part 7: POST /schedules 403 non-admin."""
    bob = await spec.user("p7-bob")
    r = await spec.c.post("/schedules", headers=bob, json={"prompt": "x", "every": 1000})
    expect(r, 403)


@pytest.mark.parametrize(
    ("path", "status"),
    [
        pytest.param(
            "/schedules/abc", 400, id="SPEC part 7: GET /schedules/<id> 400 invalid job id"
        ),
        pytest.param(
            "/schedules/99999999", 404, id="SPEC part 7: GET /schedules/<id> 404 not found"
        ),
    ],
)
async def test_schedule_get_errors(spec: Spec, path: str, status: int) -> None:
    expect(await spec.c.get(path, headers=ADMIN), status)


async def test_schedule_delete_403(spec: Spec) -> None:
    """SPEC part 7: DELETE /schedules/<id> 403 non-admin."""
    jid = await _job(spec)
    bob = await spec.user("p7-bob")
    expect(await spec.c.delete(f"/schedules/{jid}", headers=bob), 403)
    assert (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).status_code == 200


async def test_schedule_delete_404(spec: Spec) -> None:
    """SPEC part 7: DELETE /schedules/<id> 404 not found."""
    expect(await spec.c.delete("/schedules/99999999", headers=ADMIN), 404)


async def test_schedule_delete_409_running(spec: Spec, sleeper: int) -> None:
    """SPEC part 7: DELETE /schedules/<id> 409 job currently running."""
    expect(await spec.c.delete(f"/schedules/{sleeper}", headers=ADMIN), 409)


async def test_schedule_run_400_paused(spec: Spec) -> None:
    """SPEC part 7: POST /schedules/<id>/run 400 job disabled (paused); unpause first."""
    jid = await _job(spec)
    assert (await spec.c.post(f"/schedules/{jid}/pause", headers=ADMIN)).status_code == 200
    expect(await spec.c.post(f"/schedules/{jid}/run", headers=ADMIN), 400)


async def test_schedule_run_404(spec: Spec) -> None:
    """SPEC part 7: POST /schedules/<id>/run 404 not found."""
    expect(await spec.c.post("/schedules/99999999/run", headers=ADMIN), 404)


async def test_schedule_run_409_running(spec: Spec, sleeper: int) -> None:
    """SPEC part 7: POST /schedules/<id>/run 409 job already running."""
    expect(await spec.c.post(f"/schedules/{sleeper}/run", headers=ADMIN), 409)


# --- Memory ---------------------------------------------------------------------------------


async def test_memory_get_404(spec: Spec) -> None:
    """SPEC part 7: GET /memory/<agent_id>/<key> 404 key not found."""
    h = await spec.user("p7-mem")
    expect(await spec.c.get("/memory/p7/nothing-here", headers=h), 404)


async def test_memory_get_410_expired(spec: Spec) -> None:
    """SPEC part 7: GET /memory/<agent_id>/<key> 410 entry expired."""
    h = await spec.user("p7-mem")
    r = await spec.c.post(
        "/memory/p7/store", headers=h, json={"key": "gone", "value": "v", "ttl": 200}
    )
    assert r.status_code == 200, r.text

    async def gone() -> httpx.Response | None:
        got = await spec.c.get("/memory/p7/gone", headers=h)
        return got if got.status_code != 200 else None

    expect(await until(gone, 10), 410)


# --- Channels -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            {"type": "telegram", "name": "t", "config": {"bot_token": TG_TOKEN, "chat_ids": "42"}},
            id="SPEC part 7: Channels 400 invalid channel configuration (chat_ids not an array)",
        ),
        pytest.param(
            {"type": "slack", "name": "s", "config": {"webhook_url": "https://example.com/h"}},
            id="SPEC part 7: Channels 400 invalid channel configuration (no signing_secret)",
        ),
        pytest.param(
            {"type": "teams", "name": "t", "config": {"webhook_url": 5}},
            id="SPEC part 7: Channels 400 invalid channel configuration (webhook_url not a string)",
        ),
    ],
)
async def test_channel_400(spec: Spec, body: dict[str, Any]) -> None:
    h = await spec.user("p7-chan")
    expect(await spec.c.post("/channels", headers=h, json=body), 400)


async def test_channel_401_signature(spec: Spec) -> None:
    """SPEC part 7: Channels 401 authentication or signature verification failed (a Slack-
    style delivery signed with the wrong secret; SPEC part 5 item 5)."""
    h = await spec.user("p7-chan")
    r = await spec.c.post(
        "/channels",
        headers=h,
        json={
            "type": "slack",
            "name": "s401",
            "config": {
                "signing_secret": "right-secret",
                "webhook_url": "https://hooks.example.com/h",
            },
        },
    )
    assert r.status_code == 200, r.text
    path = r.json()["data"]["webhook_path"]
    raw = json.dumps({"type": "url_verification", "challenge": "c"}).encode()
    ts = str(int(time.time()))
    wrong = hmac.new(b"wrong-secret", f"v0:{ts}:".encode() + raw, hashlib.sha256).hexdigest()
    headers = {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={wrong}",
        "Content-Type": "application/json",
    }
    expect(await spec.c.post(path.removeprefix("/api/v1"), content=raw, headers=headers), 401)
    right = hmac.new(b"right-secret", f"v0:{ts}:".encode() + raw, hashlib.sha256).hexdigest()
    headers["X-Slack-Signature"] = f"v0={right}"
    ok = await spec.c.post(path.removeprefix("/api/v1"), content=raw, headers=headers)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param(
            "GET", "/channels/nope", id="SPEC part 7: Channels 404 channel not found (GET)"
        ),
        pytest.param(
            "PUT", "/channels/nope", id="SPEC part 7: Channels 404 channel not found (PUT)"
        ),
        pytest.param(
            "DELETE", "/channels/nope", id="SPEC part 7: Channels 404 channel not found (DELETE)"
        ),
        pytest.param(
            "POST",
            "/channels/webhook/no-such-token",
            id="SPEC part 7: Channels 404 channel not found (webhook token)",
        ),
    ],
)
async def test_channel_404(spec: Spec, method: str, path: str) -> None:
    h = await spec.user("p7-chan")
    body = {"name": "x"} if method in ("PUT", "POST") else None
    expect(await spec.c.request(method, path, headers=h, json=body), 404)


async def test_channel_404_other_tenant(spec: Spec) -> None:
    """SPEC part 7: Channels 404 channel not found (another tenant's channel; DESIGN)."""
    own = await spec.user("p7-chan")
    other = await spec.user("p7-other")
    r = await spec.c.post(
        "/channels",
        headers=own,
        json={"type": "telegram", "name": "mine", "config": {"bot_token": TG_TOKEN}},
    )
    assert r.status_code == 200, r.text
    cid = r.json()["data"]["id"]
    expect(await spec.c.get(f"/channels/{cid}", headers=other), 404)
    expect(await spec.c.delete(f"/channels/{cid}", headers=other), 404)


async def test_channel_422(spec: Spec) -> None:
    """SPEC part 7: Channels 422 unsupported channel type."""
    h = await spec.user("p7-chan")
    body = {"type": "irc", "name": "x", "config": {}}
    expect(await spec.c.post("/channels", headers=h, json=body), 422)


# --- Workspace ------------------------------------------------------------------------------


async def test_workspace_edit_multiple_matches(spec: Spec) -> None:
    """SPEC part 7: POST /workspace/edit error body `{error:'multiple matches', matches}` when
    old_text occurs more than once; the file is unchanged."""
    h = await spec.user("p7-ws")
    await spec.c.post("/workspace/write", headers=h, json={"path": "e.txt", "content": "aXaXa"})
    r = await spec.c.post(
        "/workspace/edit", headers=h, json={"path": "e.txt", "old_text": "a", "new_text": "b"}
    )
    body = expect(r, 400)
    assert body["error"] == "multiple matches" and body["matches"] == 3
    read = await spec.c.post("/workspace/read", headers=h, json={"path": "e.txt"})
    assert read.json()["content"] == "aXaXa"


@pytest.mark.parametrize(
    ("op", "path"),
    [
        pytest.param(op, p, id=f"SPEC part 7: POST /workspace/{op} rejected ({why})")
        for op in ("read", "write", "edit", "search")
        for p, why in (("../x.txt", "contains .."), ("/etc/passwd", "absolute"))
    ],
)
async def test_workspace_unsafe_paths(spec: Spec, op: str, path: str) -> None:
    h = await spec.user("p7-ws")
    body: dict[str, Any] = {
        "read": {"path": path},
        "write": {"path": path, "content": "x"},
        "edit": {"path": path, "old_text": "a", "new_text": "b"},
        "search": {"query": path, "max_results": 5},
    }[op]
    assert expect(await spec.c.post(f"/workspace/{op}", headers=h, json=body), 400)


async def test_workspace_list_unsafe_path(spec: Spec) -> None:
    """SPEC part 4 Workspace: "`..` and absolute paths are rejected" (GET /workspace/list)."""
    h = await spec.user("p7-ws")
    for path in ("..", "/etc"):
        expect(await spec.c.get("/workspace/list", headers=h, params={"path": path}), 400)


# --- Marketplace ----------------------------------------------------------------------------

RESERVED = ["search", "reports", "dismiss", "feature", "rate", "ratings"]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, id=f"SPEC part 7: POST /marketplace/publish rejected reserved name {n}")
        for n in RESERVED
    ],
)
async def test_publish_reserved_names(spec: Spec, name: str) -> None:
    h = await spec.user("p7-pub")
    r = await spec.c.post("/marketplace/publish", headers=h, json={"name": name, "body": "b"})
    expect(r, 400)
    r = await spec.c.post(
        "/marketplace/publish", headers=h, json={"name": name.upper(), "body": "b"}
    )
    expect(r, 400)


# --- A service with a degraded component and memory off -------------------------------------


async def test_health_503_and_memory_503(database_url: str, tmp_path: Path) -> None:
    """SPEC part 7: GET /health 503 a critical component is degraded (the messaging layer
    gone); GET /memory/<agent_id>/<key> 503 memory service disabled. A service of its own:
    a Redis of its own to stop, memory off."""
    redis = EmbeddedRedis(tmp_path / "own-redis")
    url = redis.start()
    try:
        settings = Settings.load(
            environ={},
            database_url=database_url,
            redis_url=url,
            data_dir=tmp_path / "data",
            admin_token=ADMIN_TOKEN,
            memory_enabled=False,
            rate_limit_per_minute=0,
        )
        async with ServedApp(settings) as app, httpx.AsyncClient(base_url=f"{app.url}/api/v1") as c:
            expect(await c.get("/memory/default/k", headers=ADMIN), 503)
            assert (await c.get("/health")).status_code == 200
            redis.stop()
            r = await c.get("/health")
            assert r.status_code == 503, r.text
            assert r.json()["status"] == "degraded"
    finally:
        redis.stop()
