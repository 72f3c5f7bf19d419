"""SPEC part 4, "Endpoints": every row of every endpoint table, its request (with the
defaults the spec gives) and its response shape, plus the configuration defaults and
formats stated beside the tables. Error rows are in test_part7_errors.py, authentication
in test_part5_auth.py. Each case's id names the row it checks."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from orchestrator.config import Settings
from tests.integration.spec._kit import (
    ADMIN,
    LOCAL_MODEL,
    MODEL,
    TG_TOKEN,
    Spec,
    create_workflow,
    finished,
    is_type,
    until,
)
from tests.sse import sse_frames


@pytest.fixture(scope="module")
def spec_overrides() -> dict[str, Any]:
    # Short keep-alives so the `: ping` and chat heartbeat comments are seen within a test.
    return {"sse_ping_interval_s": 0.3, "stream_heartbeat_s": 0.1}


def shape(body: dict[str, Any], fields: dict[str, str]) -> None:
    for name, kind in fields.items():
        assert name in body, (name, body)
        assert is_type(body[name], kind), (name, body)


# --- Workflows ------------------------------------------------------------------------------


async def test_post_workflows_inline(spec: Spec) -> None:
    """SPEC part 4: POST /workflows inline `name`, `steps` -> `{ok: boolean, id: string,
    status: string}` (status pending)."""
    h = await spec.user("p4-wf")
    r = await spec.c.post(
        "/workflows", headers=h, json={"name": "p4", "steps": [{"name": "a", "prompt": "x"}]}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    shape(body, {"ok": "boolean", "id": "string", "status": "string"})
    assert body["ok"] is True and body["status"] == "pending"


async def test_templates_and_post_workflows_from_template(spec: Spec) -> None:
    """SPEC part 4: POST /workflows/templates `name`, `steps` stores a reusable template;
    POST /workflows with `template` (its name) and `variables` creates from it."""
    h = await spec.user("p4-wf")
    r = await spec.c.post(
        "/workflows/templates",
        headers=h,
        json={"name": "p4-tpl", "steps": [{"name": "s", "prompt": "[answer {{word}}]"}]},
    )
    assert r.status_code == 200, r.text
    r = await spec.c.post(
        "/workflows", headers=h, json={"template": "p4-tpl", "variables": {"word": "PLUM"}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "pending"
    body = await finished(spec.c, h, r.json()["id"])
    assert body["steps"][0]["result"] == "PLUM"


async def test_get_workflows_and_detail(spec: Spec) -> None:
    """SPEC part 4: GET /workflows "Each workflow has a status"; GET /workflows/<id> ->
    `{id, name, status, steps:[{name, status, result?}]}`."""
    h = await spec.user("p4-list")
    wid = await create_workflow(
        spec.c, h, name="p4-l", steps=[{"name": "a", "prompt": "[answer A]"}]
    )
    body = await finished(spec.c, h, wid)
    shape(body, {"id": "string", "name": "string", "status": "string", "steps": "array"})
    assert body["steps"] == [
        {**body["steps"][0], "name": "a", "status": "completed", "result": "A"}
    ]
    listed = (await spec.c.get("/workflows", headers=h)).json()
    assert [w["id"] for w in listed["data"]] == [wid]
    assert all(is_type(w["status"], "string") for w in listed["data"])


async def test_cancel_and_delete(spec: Spec) -> None:
    """SPEC part 4: POST /workflows/<id>/cancel "Cancels a running workflow and triggers
    compensation"; DELETE /workflows/<id> "Removes a completed or cancelled workflow"."""
    h = await spec.user("p4-cancel")
    wid = await create_workflow(
        spec.c,
        h,
        name="p4-c",
        steps=[{"name": "a", "prompt": "[answer A]"}, {"name": "b", "prompt": "[sleep 20]"}],
    )

    async def second_running() -> bool:
        steps = (await spec.c.get(f"/workflows/{wid}", headers=h)).json()["steps"]
        return steps[1]["status"] == "running"

    await until(second_running)
    r = await spec.c.post(f"/workflows/{wid}/cancel", headers=h)
    assert r.status_code == 200, r.text
    body = await finished(spec.c, h, wid)
    assert body["status"] == "cancelled"
    types = [
        e["type"]
        for e in (await spec.c.get("/events", headers=h, params={"aggregate": wid})).json()["data"]
    ]
    assert "workflow.compensating" in types and types[-1] == "workflow.cancelled"
    assert (await spec.c.delete(f"/workflows/{wid}", headers=h)).status_code == 200
    assert (await spec.c.get(f"/workflows/{wid}", headers=h)).status_code == 404


async def test_tree_operations(spec: Spec) -> None:
    """SPEC part 4 Workflows, tree operations: "a parent step can spawn child workflows;
    results of children can be aggregated; cancelling at tree level propagates to all
    children"."""
    h = await spec.user("p4-tree")
    wid = await create_workflow(
        spec.c,
        h,
        name="p4-parent",
        steps=[
            {
                "name": "fan",
                "type": "spawn",
                "workflows": [
                    {"name": "kid1", "steps": [{"name": "k", "prompt": "[answer ONE]"}]},
                    {"name": "kid2", "steps": [{"name": "k", "prompt": "[answer TWO]"}]},
                ],
            }
        ],
    )
    body = await finished(spec.c, h, wid)
    assert body["status"] == "completed"
    kids = json.loads(body["steps"][0]["result"])["children"]
    assert sorted(k["result"] for k in kids) == ["ONE", "TWO"]
    assert {
        c["parent_id"]
        for c in (await spec.c.get("/workflows", headers=h, params={"parent": wid})).json()["data"]
    } == {wid}
    wid2 = await create_workflow(
        spec.c,
        h,
        name="p4-parent2",
        steps=[
            {
                "name": "fan",
                "type": "spawn",
                "workflows": [{"name": "slow", "steps": [{"name": "k", "prompt": "[sleep 20]"}]}],
            }
        ],
    )

    async def child() -> Any:
        data = (await spec.c.get("/workflows", headers=h, params={"parent": wid2})).json()["data"]
        return data[0]["id"] if data and data[0]["status"] == "running" else None

    kid = await until(child)
    assert (await spec.c.post(f"/workflows/{wid2}/cancel", headers=h)).status_code == 200
    assert (await finished(spec.c, h, kid))["status"] == "cancelled"


# --- Inference and models -------------------------------------------------------------------


async def test_inference_defaults_stop_and_stop_all(spec: Spec) -> None:
    """SPEC part 4: POST /inference `model`, `gpu_layers`, `ctx_size`, `threads` (each falls
    back to the configuration defaults) -> `{ok, id}`; POST /stop `{id}` stops one; POST
    /stop-all stops all. Defaults: `inference_gpu_layers` 99, `inference_ctx_size` 4096,
    `inference_threads` 4."""
    await spec.c.post("/discover", headers=ADMIN)
    r = await spec.c.post("/inference", headers=ADMIN, json={"model": LOCAL_MODEL})
    assert r.status_code == 200, r.text
    shape(r.json(), {"ok": "boolean", "id": "string"})
    one = r.json()["id"]
    got = (await spec.c.get(f"/inference/{one}", headers=ADMIN)).json()
    assert (got["gpu_layers"], got["ctx_size"], got["threads"]) == (99, 4096, 4)
    r = await spec.c.post(
        "/inference",
        headers=ADMIN,
        json={"model": LOCAL_MODEL, "gpu_layers": 0, "ctx_size": 512, "threads": 1},
    )
    two = r.json()["id"]
    got = (await spec.c.get(f"/inference/{two}", headers=ADMIN)).json()
    assert (got["gpu_layers"], got["ctx_size"], got["threads"]) == (0, 512, 1)
    r = await spec.c.post("/stop", headers=ADMIN, json={"id": one})
    assert r.status_code == 200, r.text
    assert (await spec.c.get(f"/inference/{one}", headers=ADMIN)).json()["state"] == "stopped"
    r = await spec.c.post("/stop-all", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert (await spec.c.get(f"/inference/{two}", headers=ADMIN)).json()["state"] == "stopped"


def test_inference_configuration_defaults() -> None:
    """SPEC part 4: inference configuration settings (defaults): `inference_bin`
    ./llama-server; `inference_gpu_layers` 99; `inference_ctx_size` 4096;
    `inference_threads` 4."""
    s = Settings.load(environ={})
    assert (s.inference_bin, s.inference_gpu_layers, s.inference_ctx_size, s.inference_threads) == (
        "./llama-server",
        99,
        4096,
        4,
    )


PROVIDER_KINDS = [
    ("anthropic", "hosted messages-style provider"),
    ("openai", "hosted chat-completions provider"),
    ("zhipu", "hosted GLM-style provider"),
    ("ollama", "local REST model runner"),
    ("gemini", "Google-style generative provider"),
    ("deepseek", "chat-completions-compatible coding/reasoning provider"),
    ("qwen", "DashScope-style compatible provider"),
    ("bedrock", "cloud-runtime provider"),
]


@pytest.mark.parametrize(
    "kind", [pytest.param(k, id=f"SPEC part 4: provider kind {why}") for k, why in PROVIDER_KINDS]
)
def test_provider_kinds_and_keys(kind: str) -> None:
    """SPEC part 4: provider kinds (one adapter each); configuration keys `api_key`,
    `base_url` (most); `region`, `access_key_id`, `secret_access_key`, `model_id` (cloud
    runtime); keys from `<PROVIDER>_API_KEY` in the environment."""
    if kind == "bedrock":
        keys = {"region": "eu-west-1", "access_key_id": "AK", "secret_access_key": "SK"}
        got = Settings.load(environ={}, providers={kind: {**keys, "model_id": "m"}})
        p = got.providers[kind]
        assert (p.region, p.model_id) == ("eu-west-1", "m")
        assert p.access_key_id is not None and p.access_key_id.get_secret_value() == "AK"
        aws = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "us-east-2"}
        env = Settings.load(environ=aws).providers[kind]
        assert env.region == "us-east-2"
        return
    got = Settings.load(
        environ={}, providers={kind: {"api_key": "k-1", "base_url": "https://llm.example.com"}}
    )
    p = got.providers[kind]
    assert p.api_key is not None and p.api_key.get_secret_value() == "k-1"
    assert p.base_url == "https://llm.example.com"
    env_name = {"qwen": "DASHSCOPE_API_KEY"}.get(kind, f"{kind.upper()}_API_KEY")
    from_env = Settings.load(environ={env_name: "k-env"}).providers[kind]
    assert from_env.api_key is not None and from_env.api_key.get_secret_value() == "k-env"


def test_declarative_adapter_entry() -> None:
    """SPEC part 4: declarative adapter entry `id`, `format` (`openai` or `anthropic`),
    `base_url`, `api_key` (optional), `models` (array of strings), `alias`."""
    for fmt in ("openai", "anthropic"):
        entry = {"id": "mine", "format": fmt, "base_url": "https://x.example.com/v1"}
        full = {**entry, "api_key": "k", "models": ["m1", "m2"], "alias": "al"}
        (got,) = Settings.load(environ={}, custom_providers=[full]).custom_providers
        assert (got.id, got.format, got.models, got.alias) == ("mine", fmt, ["m1", "m2"], "al")
        (bare,) = Settings.load(environ={}, custom_providers=[entry]).custom_providers
        assert bare.api_key is None


async def test_models_and_discover(spec: Spec) -> None:
    """SPEC part 4: GET /models -> `{models:[model entry]}`; POST /discover (admin) ->
    `{discovered: integer}`."""
    r = await spec.c.post("/discover", headers=ADMIN)
    assert r.status_code == 200, r.text
    shape(r.json(), {"discovered": "integer"})
    models = (await spec.c.get("/models", headers=ADMIN)).json()
    shape(models, {"models": "array"})
    assert {MODEL, LOCAL_MODEL} <= {m["name"] for m in models["models"]}


async def test_chat_completions(spec: Spec) -> None:
    """SPEC part 4: POST /chat/completions `model`, `messages`, `stream` -> chat-completions
    format; with `stream` true: SSE frames `data: <json chunk>` holding
    `choices[].delta.content`, ending with `data: [DONE]`."""
    h = await spec.user("p4-chat")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "[answer PONG]"}]}
    r = await spec.c.post("/chat/completions", headers=h, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "PONG"
    text, done = "", False
    async with spec.c.stream(
        "POST", "/chat/completions", headers=h, json={**body, "stream": True}
    ) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        async for frame in sse_frames(s):
            if "data" not in frame:
                continue
            assert not done, "a frame after [DONE]"
            if frame["data"] == "[DONE]":
                done = True
                continue
            for choice in json.loads(frame["data"])["choices"]:
                text += choice["delta"].get("content") or ""
    assert done and text == "PONG"


async def test_chat_stream_heartbeat(spec: Spec) -> None:
    """SPEC part 4: POST /chat/completions with `stream` true: "heartbeat messages keep the
    connection alive" (while the model is silent: SSE comments, ignored by clients)."""
    h = await spec.user("p4-chat")
    body = {
        "model": MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": "[sleep 0.2]"}],
    }
    comments, text = 0, ""
    async with spec.c.stream("POST", "/chat/completions", headers=h, json=body) as s:
        assert s.status_code == 200
        async for frame in sse_frames(s):
            if "comment" in frame:
                comments += 1
            elif frame.get("data") and frame["data"] != "[DONE]":
                for choice in json.loads(frame["data"])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert comments >= 1 and text.startswith("slept:")


async def test_messages(spec: Spec) -> None:
    """SPEC part 4: POST /messages: Messages-style (content-block) format."""
    h = await spec.user("p4-chat")
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "[answer BLOCK]"}]}],
    }
    r = await spec.c.post("/messages", headers=h, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message" and r.json()["role"] == "assistant"
    assert r.json()["content"] == [{"type": "text", "text": "BLOCK"}]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/providers/health", id="SPEC part 4: GET /providers/health"),
        pytest.param(
            "/providers/health/openai", id="SPEC part 4: GET /providers/health/<provider>"
        ),
    ],
)
async def test_providers_health(spec: Spec, path: str) -> None:
    r = await spec.c.get(path, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert is_type(r.json(), "object")


# --- Workspace ------------------------------------------------------------------------------


async def test_workspace_endpoints(spec: Spec) -> None:
    """SPEC part 4 Workspace: write `{path, content}` creates parent directories; read ->
    `{path, content, size}`; edit `{path, old_text, new_text}` exact-match replace; search
    `{query: glob, max_results}` -> `{results:[{path, size, modified}], count}`; list
    ?path=&recursive= -> `{path, entries:[{path, type, size, modified}], count}`."""
    h = await spec.user("p4-ws")
    c = spec.c
    r = await c.post(
        "/workspace/write", headers=h, json={"path": "a/b/c.txt", "content": "hello world"}
    )
    assert r.status_code == 200, r.text
    r = await c.post("/workspace/read", headers=h, json={"path": "a/b/c.txt"})
    shape(r.json(), {"path": "string", "content": "string", "size": "integer"})
    assert (r.json()["path"], r.json()["content"], r.json()["size"]) == (
        "a/b/c.txt",
        "hello world",
        11,
    )
    r = await c.post(
        "/workspace/edit",
        headers=h,
        json={"path": "a/b/c.txt", "old_text": "world", "new_text": "there"},
    )
    assert r.status_code == 200, r.text
    assert (await c.post("/workspace/read", headers=h, json={"path": "a/b/c.txt"})).json()[
        "content"
    ] == "hello there"
    r = await c.post("/workspace/search", headers=h, json={"query": "**/*.txt", "max_results": 10})
    shape(r.json(), {"results": "array", "count": "integer"})
    assert [x["path"] for x in r.json()["results"]] == ["a/b/c.txt"] and r.json()["count"] == 1
    shape(r.json()["results"][0], {"path": "string", "size": "integer", "modified": "iso8601 utc"})
    r = await c.get("/workspace/list", headers=h, params={"path": "a", "recursive": "true"})
    shape(r.json(), {"path": "string", "entries": "array", "count": "integer"})
    assert [e["path"] for e in r.json()["entries"]] == ["a/b", "a/b/c.txt"]
    flat = await c.get("/workspace/list", headers=h, params={"path": "a", "recursive": "false"})
    assert [e["path"] for e in flat.json()["entries"]] == ["a/b"]


# --- Operations -----------------------------------------------------------------------------


async def test_health(spec: Spec) -> None:
    """SPEC part 4: GET /health -> `{status, version, uptime_seconds, components}`; components
    include a store (`status`, `tables` integer), a messaging layer (`status`, `sockets`
    integer), `providers` (`total`, `healthy`), `workers` (`active`, `idle`)."""
    body = (await spec.c.get("/health")).json()
    shape(
        body,
        {
            "status": "string",
            "version": "string",
            "uptime_seconds": "number",
            "components": "object",
        },
    )
    comps = body["components"]
    shape(comps["store"], {"status": "string", "tables": "integer"})
    shape(comps["messaging"], {"status": "string", "sockets": "integer"})
    shape(comps["providers"], {"total": "integer", "healthy": "integer"})
    shape(comps["workers"], {"active": "integer", "idle": "integer"})


async def test_ready(spec: Spec) -> None:
    """SPEC part 4: GET /ready "HTTP 200 with plain body `OK`"."""
    r = await spec.c.get("/ready")
    assert r.status_code == 200 and r.text == "OK"
    assert r.headers["content-type"].startswith("text/plain")


METRICS = [
    ("svc_http_requests_total", "counter", {"method", "path", "status"}),
    ("svc_provider_latency_seconds", "histogram", {"provider"}),
    ("svc_circuit_breaker_state", "gauge", {"provider"}),
    ("svc_active_workers", "gauge", set()),
    ("svc_memory_bytes", "gauge", set()),
    ("svc_event_total", "counter", {"type"}),
]


@pytest.mark.parametrize(
    ("name", "kind", "labels"),
    [pytest.param(n, k, lab, id=f"SPEC part 4 Metrics: {n} {k}") for n, k, lab in METRICS],
)
async def test_metrics(spec: Spec, name: str, kind: str, labels: set[str]) -> None:
    h = await spec.user("p4-metrics")
    # A provider call, so the provider metrics have a sample.
    await spec.c.post(
        "/chat/completions",
        headers=h,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    )
    sample = re.compile(rf"^{name}(_bucket|_count|_sum|_total)?(\{{(?P<labels>[^}}]*)\}})? ", re.M)

    async def scraped() -> list[re.Match[str]]:
        # Events reach svc_event_total through the bus's projection, after their commit:
        # scraped again until the first sample is there.
        r = await spec.c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert f"# TYPE {name} {kind}" in r.text
        return list(sample.finditer(r.text))

    found = await until(scraped)
    for m in found:
        have = set(re.findall(r'(\w+)="', m.group("labels") or ""))
        assert labels <= have, (name, m.group(0))


async def test_slo(spec: Spec) -> None:
    """SPEC part 4: GET /slo -> `{latency_p99, uptime_7d, error_rate}`, each `{target: number,
    current: number, compliant: boolean}`."""
    body = (await spec.c.get("/slo")).json()
    assert set(body) >= {"latency_p99", "uptime_7d", "error_rate"}
    for key in ("latency_p99", "uptime_7d", "error_rate"):
        shape(body[key], {"target": "number", "current": "number", "compliant": "boolean"})


# --- Events ---------------------------------------------------------------------------------


async def test_get_events_defaults_and_shape(spec: Spec) -> None:
    """SPEC part 4: GET /events `aggregate` (default `all`), `from_seq` (0), `limit` (100),
    `offset` (0) -> `{ok, data:[event], total, offset, limit}`."""
    h = await spec.user("p4-ev")
    wid = await create_workflow(spec.c, h, name="p4-ev", steps=[{"name": "a", "prompt": "x"}])
    await finished(spec.c, h, wid)
    r = await spec.c.get("/events", headers=h)
    body = r.json()
    shape(
        body,
        {
            "ok": "boolean",
            "data": "array",
            "total": "integer",
            "offset": "integer",
            "limit": "integer",
        },
    )
    assert (body["offset"], body["limit"]) == (0, 100)
    explicit = (
        await spec.c.get(
            "/events",
            headers=h,
            params={"aggregate": "all", "from_seq": 0, "limit": 100, "offset": 0},
        )
    ).json()
    assert [e["id"] for e in explicit["data"]] == [e["id"] for e in body["data"]]
    assert {e["aggregate_id"] for e in body["data"]} > {wid}
    one = (await spec.c.get("/events", headers=h, params={"aggregate": wid, "from_seq": 3})).json()
    assert one["data"] and all(e["aggregate_id"] == wid and e["seq"] >= 3 for e in one["data"])
    page = (await spec.c.get("/events", headers=h, params={"limit": 2, "offset": 1})).json()
    assert [e["id"] for e in page["data"]] == [e["id"] for e in body["data"][1:3]]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        pytest.param("/sync-events", {}, id="SPEC part 4: GET /sync-events SSE frames"),
        pytest.param(
            "/events", {"Accept": "text/event-stream"}, id="SPEC part 4: GET /events (Accept SSE)"
        ),
    ],
)
async def test_sse_stream(spec: Spec, path: str, headers: dict[str, str]) -> None:
    """SPEC part 4 Events: frames `event: <type>` plus `data: <json with id, type, data>`;
    keep-alive comment `: ping`; workflow stream event names of part 6 (colon style)."""
    h = {**(await spec.user("p4-sse")), **headers}
    names: list[str] = []
    pinged = False
    deadline = time.monotonic() + 60
    async with spec.c.stream("GET", path, headers=h, timeout=30) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        wid = None
        async for frame in sse_frames(s):
            assert time.monotonic() < deadline, "the stream did not show it in time"
            if frame.get("comment") == "ping":
                pinged = True
            if wid is None and ("comment" in frame):
                wid = await create_workflow(
                    spec.c,
                    await spec.user("p4-sse"),
                    name="p4-sse",
                    steps=[{"name": "a", "prompt": "x"}],
                )
            if "data" in frame:
                data = json.loads(frame["data"])
                assert {"id", "type", "data"} <= set(data)
                if data.get("aggregate_id") == wid:
                    names.append(frame["event"])
            if "workflow:completed" in names and pinged:
                break
    assert names == [
        "workflow:started",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:completed",
    ]


# --- Scheduler ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "value", "schedule_type"),
    [
        pytest.param(
            "cron", "*/5 * * * *", "cron", id="SPEC part 4: POST /schedules cron (5-field string)"
        ),
        pytest.param(
            "every", 90_000, "every", id="SPEC part 4: POST /schedules every (positive integer ms)"
        ),
        pytest.param("at", None, "at", id="SPEC part 4: POST /schedules at (Unix ms integer)"),
        pytest.param(
            "schedule",
            "every 5 minutes",
            "every",
            id="SPEC part 4: POST /schedules schedule (natural language)",
        ),
    ],
)
async def test_create_schedule(spec: Spec, kind: str, value: Any, schedule_type: str) -> None:
    """SPEC part 4: POST /schedules `prompt` required; `name`; exactly one of `cron`, `every`,
    `at`, `schedule`; `model`; `opts` -> `{status:'ok', id: integer, next_run: integer}`."""
    at = int(time.time() * 1000) + 3_600_000
    body = {"prompt": "x", "name": f"p4-{kind}", "model": MODEL, "opts": {}, kind: value or at}
    r = await spec.c.post("/schedules", headers=ADMIN, json=body)
    assert r.status_code == 200, r.text
    shape(r.json(), {"status": "string", "id": "integer", "next_run": "unix ms"})
    assert r.json()["status"] == "ok"
    job = (await spec.c.get(f"/schedules/{r.json()['id']}", headers=ADMIN)).json()
    assert job["schedule_type"] == schedule_type and job["next_run"] == r.json()["next_run"]
    assert job["name"] == f"p4-{kind}" and job["model"] == MODEL
    if kind == "at":
        assert job["next_run"] == at


async def test_delete_after_run(spec: Spec) -> None:
    """SPEC part 4: `delete_after_run` boolean (at jobs only, default false)."""
    soon = int(time.time() * 1000) + 300
    keep = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "[answer k]", "at": soon})
    drop = await spec.c.post(
        "/schedules",
        headers=ADMIN,
        json={"prompt": "[answer d]", "at": soon, "delete_after_run": True},
    )
    bad = await spec.c.post(
        "/schedules", headers=ADMIN, json={"prompt": "x", "every": 1000, "delete_after_run": True}
    )
    assert bad.status_code == 400, bad.text
    kid, did = keep.json()["id"], drop.json()["id"]

    async def gone() -> bool:
        return (await spec.c.get(f"/schedules/{did}", headers=ADMIN)).status_code == 404

    await until(gone)

    async def kept_ran() -> bool:
        return (await spec.c.get(f"/schedules/{kid}", headers=ADMIN)).json()["last_result"] == "ok"

    await until(kept_ran)


async def test_schedule_list_detail_and_actions(spec: Spec) -> None:
    """SPEC part 4: GET /schedules?page=&per_page= -> `{items, total, page, per_page}`; GET
    /schedules/<id> job detail; pause -> `{status:'paused'}`; unpause -> `{status:'active'}`;
    run -> `{status:'dispatched'}`; DELETE -> `{status:'deleted'}`."""
    c = spec.c
    r = await c.post(
        "/schedules",
        headers=ADMIN,
        json={"prompt": "[answer r]", "name": "p4-act", "every": 3_600_000},
    )
    jid = r.json()["id"]
    page = (await c.get("/schedules", headers=ADMIN, params={"page": 1, "per_page": 2})).json()
    shape(page, {"items": "array", "total": "integer", "page": "integer", "per_page": "integer"})
    assert (page["page"], page["per_page"]) == (1, 2) and len(page["items"]) <= 2
    detail = (await c.get(f"/schedules/{jid}", headers=ADMIN)).json()
    assert detail["id"] == jid and detail["prompt"] == "[answer r]"
    r = await c.post(f"/schedules/{jid}/pause", headers=ADMIN)
    assert r.json()["status"] == "paused"
    assert (await c.get(f"/schedules/{jid}", headers=ADMIN)).json()["enabled"] is False
    r = await c.post(f"/schedules/{jid}/unpause", headers=ADMIN)
    assert r.json()["status"] == "active"
    r = await c.post(f"/schedules/{jid}/run", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "dispatched"

    async def idle() -> bool:
        return not (await c.get(f"/schedules/{jid}", headers=ADMIN)).json()["running"]

    await until(idle)
    r = await c.delete(f"/schedules/{jid}", headers=ADMIN)
    assert r.json()["status"] == "deleted"


@pytest.mark.parametrize(
    "expr",
    [
        pytest.param(e, id=f"SPEC part 4: cron format {why}")
        for e, why in (
            ("0 0 1 1 0", "lowest values (0 Sunday)"),
            ("59 23 31 12 6", "highest values"),
            ("*/15 */2 * * *", "step values"),
            ("5 4 * * *", "numbers"),
        )
    ],
)
async def test_cron_format(spec: Spec, expr: str) -> None:
    r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "x", "cron": expr})
    assert r.status_code == 200, r.text


async def test_cron_day_of_week_zero_is_sunday(spec: Spec) -> None:
    """SPEC part 4: cron day of week 0-6 (0 Sunday)."""
    r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "x", "cron": "0 12 * * 0"})
    next_run = r.json()["next_run"]
    assert time.gmtime(next_run / 1000).tm_wday == 6  # Python: Monday 0 .. Sunday 6


async def test_job_attributed_to_creator(spec: Spec) -> None:
    """SPEC part 4 Scheduler: "A job is attributed to the `user_uuid` captured at creation;
    the dispatched task carries it"."""
    r = await spec.c.post(
        "/schedules", headers=ADMIN, json={"prompt": "[answer t]", "every": 3_600_000}
    )
    jid = r.json()["id"]
    run = (await spec.c.post(f"/schedules/{jid}/run", headers=ADMIN)).json()
    task = run["task_id"]
    evs = (await spec.c.get("/events", headers=ADMIN, params={"aggregate": task})).json()["data"]
    created = next(e for e in evs if e["type"] == "task.created")
    assert created["data"].get("user_uuid", created.get("user_uuid")) == "admin"


# --- Channels -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "config", "shown"),
    [
        pytest.param(
            "slack",
            {"webhook_url": "https://hooks.example.com/s", "signing_secret": "sig"},
            {"webhook_url": "https://hooks.example.com/s", "signing_secret": "***"},
            id="SPEC part 4: channel config slack (webhook_url, signing_secret)",
        ),
        pytest.param(
            "telegram",
            {"bot_token": TG_TOKEN, "chat_ids": ["1", "2"]},
            {"bot_token": "***", "chat_ids": ["1", "2"]},
            id="SPEC part 4: channel config telegram (bot_token, chat_ids)",
        ),
        pytest.param(
            "teams",
            {"webhook_url": "https://example.webhook.office.com/x", "tenant_id": "t-1"},
            {"webhook_url": "https://example.webhook.office.com/x", "tenant_id": "t-1"},
            id="SPEC part 4: channel config teams (webhook_url, tenant_id)",
        ),
    ],
)
async def test_channel_lifecycle(
    spec: Spec, kind: str, config: dict[str, Any], shown: dict[str, Any]
) -> None:
    """SPEC part 4 Channels: POST /channels `type`, `name`, `config`; GET /channels ->
    `{ok, data:[channel]}`; PUT /channels/<id> updates name and configuration; DELETE
    removes the integration."""
    h = await spec.user(f"p4-{kind}")
    r = await spec.c.post(
        "/channels", headers=h, json={"type": kind, "name": f"p4-{kind}", "config": config}
    )
    assert r.status_code == 200, r.text
    cid = r.json()["data"]["id"]
    listed = (await spec.c.get("/channels", headers=h)).json()
    shape(listed, {"ok": "boolean", "data": "array"})
    (ch,) = listed["data"]
    assert ch["id"] == cid and ch["type"] == kind and ch["name"] == f"p4-{kind}"
    for key, value in shown.items():
        assert ch["config"][key] == value, ch
    r = await spec.c.put(f"/channels/{cid}", headers=h, json={"name": "renamed", "config": config})
    assert r.status_code == 200, r.text
    assert (await spec.c.get("/channels", headers=h)).json()["data"][0]["name"] == "renamed"
    assert (await spec.c.delete(f"/channels/{cid}", headers=h)).status_code == 200
    assert (await spec.c.get("/channels", headers=h)).json()["data"] == []


async def test_generic_webhook_receiver(spec: Spec) -> None:
    """SPEC part 4: POST /channels/webhook/<token>, arbitrary JSON with typical fields `text`,
    `user`, `metadata`: a generic receiver; "A channel receives messages from the external
    platform, relays them to an agent for processing and sends the answer back"."""
    h = await spec.user("p4-hook")
    r = await spec.c.post(
        "/channels", headers=h, json={"type": "webhook", "name": "p4-hook", "config": {}}
    )
    path = r.json()["data"]["webhook_path"].removeprefix("/api/v1")
    body = {"text": "[answer RELAYED]", "user": "u1", "metadata": {"message_id": "p4-1"}}
    r = await spec.c.post(path, params={"sync": "true"}, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["answer"] == "RELAYED"


# --- Marketplace ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def skills(spec: Spec) -> dict[str, dict[str, str]]:
    ann = await spec.user("p4-ann")
    bob = await spec.user("p4-bob")
    for who, name, desc, tags in (
        (ann, "p4-alpha", "parses invoices", ["pdf", "finance"]),
        (bob, "p4-beta", "writes haiku", ["poetry"]),
        (bob, "p4-alpha", "bob's alpha", ["pdf"]),
    ):
        r = await spec.c.post(
            "/marketplace/publish",
            headers=who,
            json={"name": name, "description": desc, "tags": tags, "body": "b"},
        )
        assert r.status_code == 200, r.text
    await spec.c.get("/marketplace/detail/p4-beta", headers=ann)
    return {"ann": ann, "bob": bob}


async def test_browse(spec: Spec, skills: dict[str, Any]) -> None:
    """SPEC part 4: GET /marketplace/browse `sort` (newest default, or popular), `tags`
    (comma-separated), `limit` (50), `offset` (0) -> `{items:[{name, author, description,
    tags, downloads, version}], total, limit, offset, has_more}`."""
    h = skills["ann"]
    body = (await spec.c.get("/marketplace/browse", headers=h)).json()
    shape(
        body,
        {
            "items": "array",
            "total": "integer",
            "limit": "integer",
            "offset": "integer",
            "has_more": "boolean",
        },
    )
    assert (body["limit"], body["offset"], body["has_more"]) == (50, 0, False)
    assert [(s["name"], s["author"]) for s in body["items"]][:3] == [
        ("p4-alpha", "p4-bob"),
        ("p4-beta", "p4-bob"),
        ("p4-alpha", "p4-ann"),
    ]
    popular = (
        await spec.c.get("/marketplace/browse", headers=h, params={"sort": "popular"})
    ).json()
    assert popular["items"][0]["name"] == "p4-beta"
    tagged = (
        await spec.c.get("/marketplace/browse", headers=h, params={"tags": "pdf,finance"})
    ).json()
    assert [(s["name"], s["author"]) for s in tagged["items"]] == [("p4-alpha", "p4-ann")]
    page = (
        await spec.c.get("/marketplace/browse", headers=h, params={"limit": 1, "offset": 1})
    ).json()
    assert page["has_more"] is True and page["items"][0]["name"] == "p4-beta"


async def test_search(spec: Spec, skills: dict[str, Any]) -> None:
    """SPEC part 4: GET /marketplace/search?q= "Searches name and description"."""
    h = skills["ann"]
    by_desc = (await spec.c.get("/marketplace/search", headers=h, params={"q": "haiku"})).json()
    assert [s["name"] for s in by_desc["items"]] == ["p4-beta"]
    by_name = (await spec.c.get("/marketplace/search", headers=h, params={"q": "beta"})).json()
    assert "p4-beta" in [s["name"] for s in by_name["items"]]


async def test_detail_author(spec: Spec, skills: dict[str, Any]) -> None:
    """SPEC part 4: GET /marketplace/detail/<name>?author= (`author` disambiguates) ->
    `{name, author, description, tags, body, downloads, created_at}`."""
    h = skills["ann"]
    r = await spec.c.get("/marketplace/detail/p4-alpha", headers=h, params={"author": "p4-bob"})
    shape(
        r.json(),
        {
            "name": "string",
            "author": "string",
            "description": "string",
            "tags": "array of string",
            "body": "string",
            "downloads": "integer",
            "created_at": "unix ms",
        },
    )
    assert (r.json()["author"], r.json()["description"]) == ("p4-bob", "bob's alpha")


async def test_report_reports_dismiss(spec: Spec, skills: dict[str, Any]) -> None:
    """SPEC part 4: POST /marketplace/report/<name> `{reason}`; GET /marketplace/reports
    (admin) lists pending reports; POST /marketplace/dismiss/<name> (admin) dismisses."""
    h = skills["ann"]
    r = await spec.c.post("/marketplace/report/p4-beta", headers=h, json={"reason": "off-topic"})
    assert r.status_code == 200, r.text
    reports = (await spec.c.get("/marketplace/reports", headers=ADMIN)).json()
    pending = [x for x in reports["reports"] if x["name"] == "p4-beta"]
    assert [x["reason"] for x in pending] == ["off-topic"]
    r = await spec.c.post("/marketplace/dismiss/p4-beta", headers=ADMIN)
    assert r.status_code == 200, r.text
    reports = (await spec.c.get("/marketplace/reports", headers=ADMIN)).json()
    assert not [x for x in reports["reports"] if x["name"] == "p4-beta"]


# --- Memory ---------------------------------------------------------------------------------


async def test_memory_endpoints(spec: Spec) -> None:
    """SPEC part 4 Memory: store -> `{status:'ok'}`; GET -> `{key, value, created_at}`; search
    -> `{results:[{key, value, created_at}]}`; list -> `{entries:[{key, value, created_at}]}`;
    pin `{pinned}` -> `{status:'ok', pinned}`; reflections -> `{reflections:[{key, value}]}`;
    DELETE key and clear -> `{status:'ok'}`."""
    h = await spec.user("p4-mem")
    c = spec.c
    r = await c.post("/memory/p4m/store", headers=h, json={"key": "fruit", "value": "ripe mango"})
    assert r.json()["status"] == "ok"
    got = (await c.get("/memory/p4m/fruit", headers=h)).json()
    assert {k: got[k] for k in ("key", "value")} == {"key": "fruit", "value": "ripe mango"}
    assert is_type(got["created_at"], "unix ms")
    found = (await c.get("/memory/p4m/search", headers=h, params={"q": "mango"})).json()["results"]
    assert [x["key"] for x in found] == ["fruit"] and {"key", "value", "created_at"} <= set(
        found[0]
    )
    listed = (await c.get("/memory/p4m/list", headers=h)).json()["entries"]
    assert [x["key"] for x in listed] == ["fruit"] and {"key", "value", "created_at"} <= set(
        listed[0]
    )
    for pinned in (True, False):
        r = await c.post("/memory/p4m/fruit/pin", headers=h, json={"pinned": pinned})
        assert r.json() == {**r.json(), "status": "ok", "pinned": pinned}
    await c.post("/memory/p4m/store", headers=h, json={"key": "reflection:day", "value": "calm"})
    refl = (await c.get("/memory/p4m/reflections", headers=h)).json()
    assert refl["reflections"] == [{"key": "reflection:day", "value": "calm"}]
    assert (await c.delete("/memory/p4m/fruit", headers=h)).json()["status"] == "ok"
    assert (await c.get("/memory/p4m/fruit", headers=h)).status_code == 404
    assert (await c.delete("/memory/p4m/clear", headers=h)).json()["status"] == "ok"
    assert (await c.get("/memory/p4m/list", headers=h)).json()["entries"] == []


async def test_memory_delete_and_clear_are_owner_only(spec: Spec) -> None:
    """SPEC part 4: `DELETE /memory/<agent_id>/<key>` owner only; `DELETE
    /memory/<agent_id>/clear` owner only (`memory_admin_delete` false, the default): an
    admin, who sees the entry, cannot delete it (403) and their clear leaves it; pin and
    unpin as delete (issue 33)."""
    assert spec.settings.memory_admin_delete is False
    ann = await spec.user("p4-own")
    c = spec.c
    await c.post("/memory/p4o/store", headers=ann, json={"key": "hers", "value": "v"})
    assert (await c.get("/memory/p4o/hers", headers=ADMIN)).json()["value"] == "v"
    assert (await c.delete("/memory/p4o/hers", headers=ADMIN)).status_code == 403
    r = await c.post("/memory/p4o/hers/pin", headers=ADMIN, json={"pinned": True})
    assert r.status_code == 403
    assert (await c.delete("/memory/p4o/clear", headers=ADMIN)).json()["status"] == "ok"
    assert (await c.get("/memory/p4o/hers", headers=ann)).json()["value"] == "v"
    assert (await c.delete("/memory/p4o/hers", headers=ann)).json()["status"] == "ok"


async def test_memory_vector_search(spec: Spec) -> None:
    """SPEC part 4: POST /memory/<agent_id>/vector-search, one of `text` or `embedding` ->
    `{results:[{key, value, similarity}]}` (requires pgvector)."""
    h = await spec.user("p4-vec")
    dim = spec.settings.memory_embedding_dim
    vec = [0.0] * dim
    vec[3] = 1.0
    await spec.c.post(
        "/memory/p4v/store", headers=h, json={"key": "k", "value": "v", "embedding": vec}
    )
    r = await spec.c.post(
        "/memory/p4v/vector-search", headers=h, json={"embedding": vec, "limit": 10}
    )
    assert r.status_code == 200, r.text
    assert [(x["key"], x["value"]) for x in r.json()["results"]] == [("k", "v")]
    assert is_type(r.json()["results"][0]["similarity"], "number")


async def test_memory_admin_endpoints(spec: Spec) -> None:
    """SPEC part 4: GET /memory/stats (admin) -> `{total_entries, total_agents, pg_enabled,
    pgvector_enabled}`; POST /memory/decay -> `{status:'ok', forgotten: integer}`; POST
    /memory/share `{from, to, pattern}` (glob) -> `{status:'ok', copied: integer}`."""
    h = await spec.user("p4-share")
    for key in ("tip:a", "tip:b", "other"):
        await spec.c.post("/memory/p4src/store", headers=h, json={"key": key, "value": key})
    stats = (await spec.c.get("/memory/stats", headers=ADMIN)).json()
    shape(
        stats,
        {
            "total_entries": "integer",
            "total_agents": "integer",
            "pg_enabled": "boolean",
            "pgvector_enabled": "boolean",
        },
    )
    assert stats["pg_enabled"] is True and stats["pgvector_enabled"] is True
    decay = (await spec.c.post("/memory/decay", headers=ADMIN)).json()
    assert decay["status"] == "ok" and is_type(decay["forgotten"], "integer")
    share = (
        await spec.c.post(
            "/memory/share",
            headers=ADMIN,
            json={"from": "p4src", "to": "p4dst", "pattern": "tip:*"},
        )
    ).json()
    assert share["status"] == "ok" and share["copied"] == 2
    keys = {e["key"] for e in (await spec.c.get("/memory/p4dst/list", headers=h)).json()["entries"]}
    assert keys == {"tip:a", "tip:b"}
