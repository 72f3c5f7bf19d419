"""Request logs and metrics of the real app in-process (uvicorn on loopback, real Postgres and
Redis, a loopback OpenAI-compatible upstream): the access line per request, the
per-route duration histogram, the gateway's token counters and time-to-first-token."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.observability import ACCESS_LOGGER, JsonFormatter, access_at_info
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.openai_server import FakeReply, OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def access_lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    access_at_info()  # what the service's log setup does (deployments/logs.py)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


def samples(text: str, name: str) -> list[Any]:
    return [
        s for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name
    ]


async def test_one_access_line_per_request_with_route_template_and_no_secret(
    make_settings: Any, access_lines: io.StringIO
) -> None:
    settings = make_settings(access_log=True, log_format="json")
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        r = await c.get(
            "/api/v1/workflows/wf-missing", headers={**ADMIN, "X-Request-ID": "req-known-1"}
        )
        assert r.status_code == 404
        r = await c.get("/api/v1/whoami", headers={**ADMIN, "X-Request-ID": "req-known-2"})
        assert r.status_code == 200
        r = await c.get("/api/v1/no/such/thing", headers={"X-Request-ID": "req-known-3"})
        assert r.status_code in (401, 404)
    lines = [json.loads(line) for line in access_lines.getvalue().splitlines()]
    # The client's ids are kept apart; each request has its own (docs/design-notes.md).
    by_id = {line["client_request_id"]: line for line in lines}
    assert [line["client_request_id"] for line in lines].count("req-known-1") == 1
    assert not {line["request_id"] for line in lines} & set(by_id)
    first = by_id["req-known-1"]
    assert first["route"] == "/api/v1/workflows/{workflow_id}"
    assert first["method"] == "GET" and first["status"] == 404 and first["user"] == "admin"
    assert isinstance(first["duration_ms"], float) and first["duration_ms"] > 0
    assert {"time", "level", "logger", "message"} <= set(first)
    assert first["logger"] == ACCESS_LOGGER
    assert by_id["req-known-2"]["route"] == "/api/v1/whoami"
    assert by_id["req-known-3"]["route"] == "<unmatched>" and by_id["req-known-3"]["user"] is None
    assert ADMIN_TOKEN not in access_lines.getvalue()


async def test_no_access_line_unless_asked(make_settings: Any, access_lines: io.StringIO) -> None:
    async with ServedApp(make_settings()) as app, httpx.AsyncClient(base_url=app.url) as c:
        assert (await c.get("/api/v1/whoami", headers=ADMIN)).status_code == 200
    assert access_lines.getvalue() == ""


async def test_request_duration_histogram_by_route_template_and_status_class(
    make_settings: Any,
) -> None:
    async with ServedApp(make_settings()) as app, httpx.AsyncClient(base_url=app.url) as c:
        for workflow_id in ("a", "b", "c"):
            await c.get(f"/api/v1/workflows/{workflow_id}", headers=ADMIN)
        await c.get("/api/v1/whoami", headers=ADMIN)
        await c.request("PROPFIND", "/api/v1/random/path/1", headers=ADMIN)
        text = (await c.get("/api/v1/metrics")).text
    count = {
        (s.labels["method"], s.labels["route"], s.labels["status_class"]): s.value
        for s in samples(text, "svc_http_request_duration_seconds_count")
    }
    assert count[("GET", "/api/v1/workflows/{workflow_id}", "4xx")] == 3
    assert count[("GET", "/api/v1/whoami", "2xx")] == 1
    # Unknown paths and methods are one label value each: cardinality stays bounded.
    assert not any("random" in route for _, route, _ in count)
    assert count[("OTHER", "<unmatched>", "4xx")] == 1
    buckets = [
        s
        for s in samples(text, "svc_http_request_duration_seconds_bucket")
        if s.labels["route"] == "/api/v1/whoami"
    ]
    assert [b.labels["le"] for b in buckets][-1] == "+Inf" and buckets[-1].value == 1
    assert len(buckets) >= 10


async def test_gateway_tokens_and_time_to_first_token(make_settings: Any) -> None:
    async with OpenAIFake(api_key="sk-openai") as oai:
        settings = make_settings(
            providers={
                "openai": {
                    "base_url": oai.base_url,
                    "api_key": "sk-openai",
                    "models": ["gpt-4o-mini"],
                }
            },
            rate_limit_per_minute=0,
        )
        oai.script(
            [
                FakeReply(text="plain answer", prompt_tokens=21, completion_tokens=4),
                FakeReply(text="streamed answer", prompt_tokens=30, completion_tokens=6),
            ]
        )
        async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
            client = app.track(openai.OpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN))
            messages = [{"role": "user", "content": "hi"}]

            def call() -> None:
                client.chat.completions.create(model="gpt-4o-mini", messages=messages)  # type: ignore[arg-type]
                stream = client.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=messages,  # type: ignore[arg-type]
                    stream=True,
                    stream_options={"include_usage": True},
                )
                assert "".join(
                    ch.choices[0].delta.content or "" for ch in stream if ch.choices
                ) == ("streamed answer")

            await asyncio.to_thread(call)
            # The flusher records them within a flush window: wait for that, not a fixed time.
            deadline = time.monotonic() + 10
            while True:
                text = (await c.get("/api/v1/metrics")).text
                ttft = samples(text, "svc_gateway_ttft_seconds_count")
                if ttft or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
    tokens = {
        (s.labels["model"], s.labels["provider"], s.labels["direction"]): s.value
        for s in samples(text, "svc_gateway_tokens_total")
    }
    assert tokens == {
        ("gpt-4o-mini", "openai", "in"): 51,
        ("gpt-4o-mini", "openai", "out"): 10,
    }
    (count,) = ttft  # only the stream has a first token
    assert count.labels == {"model": "gpt-4o-mini", "provider": "openai"} and count.value == 1
    (total,) = samples(text, "svc_gateway_ttft_seconds_sum")
    assert 0 < total.value < 10
