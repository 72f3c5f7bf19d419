"""The gateway endpoints over HTTP (the real app under uvicorn, real Postgres and Redis) in
front of loopback upstreams speaking OpenAI's and Anthropic's wire formats; the clients are
the official `openai` and `anthropic` SDKs and raw httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse

from orchestrator.auth import Principal
from orchestrator.db import connect
from orchestrator.errors import BadRequest, OrchestratorError, Unauthorized
from orchestrator.events import EventQuery, EventStore
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import FakeAnthropic, overloaded, text_reply, tool_reply
from tests.fakes.anthropic_server import rate_limited as anthropic_rate_limited
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": WEATHER_TOOL_OPENAI["function"]["parameters"],  # type: ignore[index]
}


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[OpenAIFake, FakeAnthropic]]:
    async with OpenAIFake(api_key="sk-openai") as oai, FakeAnthropic(api_key="sk-ant") as ant:
        yield oai, ant


def gateway_settings(make_settings: Any, oai: OpenAIFake, ant: FakeAnthropic, **kw: Any) -> Any:
    values: dict[str, Any] = {
        "providers": {
            "openai": {
                "base_url": oai.base_url,
                "api_key": "sk-openai",
                "models": ["gpt-4o-mini", "gpt-4o"],
            },
            "anthropic": {
                "base_url": ant.url,
                "api_key": "sk-ant",
                "models": ["claude-sonnet-4-5"],
            },
        },
        "provider_retry_backoff_s": 0.01,
        "rate_limit_per_minute": 0,
    }
    values.update(kw)
    return make_settings(**values)


@pytest.fixture
async def app(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> AsyncIterator[ServedApp]:
    oai, ant = upstreams
    async with ServedApp(gateway_settings(make_settings, oai, ant)) as served:
        yield served


def oai_client(app: ServedApp) -> openai.OpenAI:
    return app.track(
        openai.OpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0)
    )


def ant_client(app: ServedApp) -> anthropic.Anthropic:
    return app.track(
        anthropic.Anthropic(base_url=f"{app.url}/api", api_key=ADMIN_TOKEN, max_retries=0)
    )


async def test_openai_sdk_to_anthropic_upstream_text_and_tools(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    _, ant = upstreams
    ant.enqueue(text_reply("Bonjour!", input_tokens=21, output_tokens=3))
    client = oai_client(app)
    r = await asyncio.to_thread(
        client.chat.completions.create,
        model="claude-sonnet-4-5",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert r.choices[0].message.content == "Bonjour!"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (21, 3)
    sent = ant.requests[-1]
    assert sent.headers["x-api-key"] == "sk-ant"
    assert sent.json["system"] == "be brief"
    assert sent.json["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]

    # Tools, streamed: the Anthropic tool_use block arrives as OpenAI tool_call fragments.
    ant.enqueue(tool_reply("get_weather", {"city": "Paris"}, id="toolu_01", text="Checking."))
    stream = await asyncio.to_thread(
        client.chat.completions.create,
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER_TOOL_OPENAI],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = await asyncio.to_thread(list, stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    args = "".join(
        tc.function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for tc in c.choices[0].delta.tool_calls
    )
    names = [
        tc.function.name
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for tc in c.choices[0].delta.tool_calls
        if tc.function and tc.function.name
    ]
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text == "Checking."
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
    assert finish == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert ant.requests[-1].json["tools"][0]["name"] == "get_weather"
    assert ant.requests[-1].json["stream"] is True


async def test_anthropic_sdk_to_openai_upstream_stream_and_tools(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    oai.script(
        [
            FakeReply(
                text="Let me look.",
                tool_calls=[FakeToolCall("get_weather", {"city": "Oslo"}, id="call_9")],
                prompt_tokens=30,
                completion_tokens=9,
            )
        ]
    )
    client = ant_client(app)

    def run() -> Any:
        with client.messages.stream(
            model="gpt-4o-mini",
            max_tokens=100,
            tools=[WEATHER_TOOL_ANTHROPIC],  # type: ignore[list-item]
            messages=[{"role": "user", "content": "weather in Oslo?"}],
        ) as stream:
            kinds = [event.type for event in stream]
            return kinds, stream.get_final_message()

    kinds, final = await asyncio.to_thread(run)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "text" and final.content[0].text == "Let me look."
    tool = final.content[1]
    assert tool.type == "tool_use" and tool.id == "call_9" and tool.input == {"city": "Oslo"}
    assert (final.usage.input_tokens, final.usage.output_tokens) == (30, 9)
    sent = oai.chat_requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-openai"
    assert sent.json["tools"][0]["function"]["name"] == "get_weather"

    # Non-streaming, the tool result goes back as an OpenAI `tool` message.
    oai.script([FakeReply(text="It is sunny.")])
    message = await asyncio.to_thread(
        client.messages.create,
        model="gpt-4o-mini",
        max_tokens=100,
        messages=[
            {"role": "user", "content": "weather in Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_9",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call_9", "content": "sunny"}],
            },
        ],
    )
    assert message.stop_reason == "end_turn" and message.content[0].text == "It is sunny."  # type: ignore[union-attr]
    msgs = oai.chat_requests[-1].json["messages"]
    assert msgs[1]["tool_calls"][0]["id"] == "call_9"
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}


async def test_conversation_switches_provider_mid_way(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """Turn 1 on an OpenAI-format model calls a tool; turn 2, with the tool result, goes to
    an Anthropic-format model, which receives proper tool_use / tool_result blocks."""
    oai, ant = upstreams
    oai.script([FakeReply(tool_calls=[FakeToolCall("get_weather", {"city": "Rome"}, id="call_r")])])
    ant.enqueue(text_reply("Rome: 24C."))
    client = oai_client(app)
    history: list[dict[str, Any]] = [{"role": "user", "content": "weather in Rome?"}]
    first = await asyncio.to_thread(
        client.chat.completions.create,
        model="gpt-4o",
        messages=history,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL_OPENAI],  # type: ignore[list-item]
    )
    assert first.choices[0].finish_reason == "tool_calls"
    history.append(first.choices[0].message.model_dump(exclude_none=True))
    history.append({"role": "tool", "tool_call_id": "call_r", "content": "24C"})
    second = await asyncio.to_thread(
        client.chat.completions.create,
        model="claude-sonnet-4-5",
        messages=history,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL_OPENAI],  # type: ignore[list-item]
    )
    assert second.choices[0].message.content == "Rome: 24C."
    messages = ant.requests[-1].json["messages"]
    assert messages[1]["role"] == "assistant"
    assert messages[1]["content"][-1] == {
        "type": "tool_use",
        "id": "call_r",
        "name": "get_weather",
        "input": {"city": "Rome"},
    }
    assert messages[2]["content"][0]["type"] == "tool_result"
    assert messages[2]["content"][0]["tool_use_id"] == "call_r"


async def test_retry_after_429_then_success(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    oai.script([FakeReply.rate_limited(retry_after=0), FakeReply(text="finally")])
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        r = await http.post(
            "/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
        )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "finally"
    assert len(oai.chat_requests) == 2


async def test_upstream_429_stays_429_with_retry_after(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    ant.enqueue(*[anthropic_rate_limited(retry_after=30)] * 3)
    async with ServedApp(gateway_settings(make_settings, oai, ant)) as app:
        client = ant_client(app)
        with pytest.raises(anthropic.RateLimitError) as caught:
            await asyncio.to_thread(
                client.messages.create,
                model="claude-sonnet-4-5",
                max_tokens=10,
                messages=[{"role": "user", "content": "x"}],
            )
    # Retry-After 30 s is too long to hold the caller: one attempt, the 429 passed on.
    assert len(ant.requests) == 1
    assert caught.value.response.headers["retry-after"] == "30"
    body = caught.value.response.json()
    assert body["ok"] is False and body["code"] == "rate_limited"
    assert body["provider"] == "anthropic" and body["upstream_status"] == 429


async def test_breaker_opens_then_half_opens_and_closes(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(
        make_settings,
        oai,
        ant,
        provider_retries=0,
        breaker_failure_threshold=2,
        breaker_cooldown_s=1.0,
    )
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
    async with (
        ServedApp(settings) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http,
    ):
        oai.script([FakeReply.server_error(500), FakeReply.server_error(503)])
        assert (await http.post("/chat/completions", json=body)).status_code == 502
        assert (await http.post("/chat/completions", json=body)).status_code == 502
        # Open: answered at once, the upstream is not called.
        r = await http.post("/chat/completions", json=body)
        assert r.status_code == 503 and r.json()["code"] == "circuit_open"
        assert int(r.headers["retry-after"]) >= 1
        assert len(oai.chat_requests) == 2
        health = (await http.get("/providers/health/openai")).json()
        assert health["breaker"] == "open" and health["breaker_state"] == 2
        assert "500" in (health["last_error"] or "") or health["last_error"]
        await asyncio.sleep(1.1)
        # Half-open: one trial goes through; it succeeds and closes the breaker.
        oai.script([FakeReply(text="back")])
        r = await http.post("/chat/completions", json=body)
        assert r.status_code == 200 and len(oai.chat_requests) == 3
        assert (await http.get("/providers/health/openai")).json()["breaker"] == "closed"
        await asyncio.sleep(1.2)  # one metrics flush
        metrics = (await http.get("/metrics")).text
    assert 'svc_circuit_breaker_state{provider="openai"} 0.0' in metrics
    assert 'svc_provider_latency_seconds_count{provider="openai"}' in metrics


async def test_fallback_to_a_second_provider(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(
        make_settings,
        oai,
        ant,
        provider_retries=1,
        fallback_models={"gpt-4o": ["claude-sonnet-4-5"]},
    )
    oai.script([FakeReply.server_error(500), FakeReply.server_error(502)])
    ant.enqueue(text_reply("from claude"))
    async with ServedApp(settings) as app:
        client = oai_client(app)
        r = await asyncio.to_thread(
            client.chat.completions.create,
            model="gpt-4o",
            messages=[{"role": "user", "content": "x"}],
        )
    assert r.choices[0].message.content == "from claude"
    assert r.model == "gpt-4o"  # the caller's model name is kept
    assert len(oai.chat_requests) == 2  # one try + one retry, then the fallback
    assert ant.requests[-1].json["model"] == "claude-sonnet-4-5"


async def test_error_mid_stream_is_an_error_frame(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    oai.script([FakeReply(text="partial answer that breaks", fail_after=3)])
    client = oai_client(app)

    def consume() -> list[str]:
        seen: list[str] = []
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append(chunk.choices[0].delta.content)
        return seen

    with pytest.raises(openai.APIError):
        await asyncio.to_thread(consume)

    # Anthropic side: the upstream's own `event: error` arrives as an `event: error` frame.
    ant.enqueue(overloaded())  # before the first byte: retried...
    ant.enqueue(text_reply("x" * 40, error_after=4))  # ...then broken mid-stream
    client_a = ant_client(app)

    def consume_a() -> None:
        with client_a.messages.stream(
            model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            for _ in stream:
                pass

    with pytest.raises(anthropic.APIStatusError) as caught:
        await asyncio.to_thread(consume_a)
    assert "overloaded" in str(caught.value).lower()


async def test_heartbeat_while_upstream_is_silent(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant, stream_heartbeat_s=0.2)
    oai.script([FakeReply(text="slow", text_chunk=2, delay_s=0.3)])
    async with (
        ServedApp(settings) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http,
        http.stream(
            "POST",
            "/chat/completions",
            json={
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
            },
        ) as r,
    ):
        raw = (await r.aread()).decode()
    assert r.headers["content-type"].startswith("text/event-stream")
    assert ": heartbeat\n\n" in raw
    assert raw.endswith("data: [DONE]\n\n")
    content = "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in raw.splitlines()
        if line.startswith("data: {")
    )
    assert content == "slow"


async def test_provider_health(app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        r = await http.get("/providers/health")
        assert r.status_code == 200
        body = r.json()
        assert body["configured"] == 2 and body["healthy"] == 2
        providers = body["providers"]
        assert providers["openai"]["configured"] and providers["openai"]["reachable"] is True
        assert providers["anthropic"]["reachable"] is True
        assert providers["gemini"] == {
            "configured": False,
            "reachable": None,
            "breaker": "closed",
            "breaker_state": 0,
            "last_error": None,
        }
        assert set(providers) >= {"bedrock", "ollama", "deepseek", "qwen", "zhipu", "local"}
        one = (await http.get("/providers/health/anthropic")).json()
        assert one["provider"] == "anthropic" and one["configured"] is True
        assert (await http.get("/providers/health/nope")).status_code == 404
        health = (await http.get("/health")).json()
        assert health["components"]["providers"] == {"total": 2, "healthy": 2}
        assert providers["openai"]["base_url"] == upstreams[0].base_url  # admins see where
        # A user sees whether providers work, never where they live or what they answered.
        made = await http.post("/tokens", json={"user_uuid": "uma"})
        uma = {"Authorization": f"Bearer {made.json()['token']}"}
        as_user = (await http.get("/providers/health", headers=uma)).json()
        assert as_user["healthy"] == 2
        for view in (
            *as_user["providers"].values(),
            (await http.get("/providers/health/openai", headers=uma)).json(),
        ):
            assert not {"base_url", "last_error", "probe_error"} & set(view), view
            assert "127.0.0.1" not in json.dumps(view)


async def test_unreachable_provider_probe(make_settings: Any) -> None:
    settings = make_settings(
        providers={"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k"}},
        provider_connect_timeout_s=0.5,
    )
    async with (
        ServedApp(settings) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http,
    ):
        one = (await http.get("/providers/health/openai")).json()
        assert one["configured"] is True and one["reachable"] is False
        assert one["probe_error"]
        r = await http.post(
            "/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 503 and r.json()["code"] == "upstream_unavailable"


async def test_bad_input_and_unknown_model(app: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        r = await http.post("/chat/completions", json={"model": "gpt-4o"})
        assert r.status_code == 400 and "messages" in r.text
        r = await http.post(
            "/messages",
            json={"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 400 and "max_tokens" in r.text
        r = await http.post(
            "/chat/completions",
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 404 and r.json()["code"] == "model_not_found"
        r = await http.post(
            "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        anon = await http.post(
            "/chat/completions",
            json={"model": "gpt-4o", "messages": []},
            headers={"Authorization": ""},
        )
        assert anon.status_code == 401


async def test_a_body_that_is_no_json_object_gets_the_frameworks_answer(app: ServedApp) -> None:
    """A JsonRoute calls its endpoint directly only for a JSON object body; anything else
    is FastAPI's own handler, whose validation answers as on every route."""
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        for path in ("/chat/completions", "/messages"):
            for body in (b"[1, 2]", b'"text"', b"null"):
                r = await http.post(
                    path, content=body, headers={"content-type": "application/json"}
                )
                assert r.status_code == 400, (path, body, r.text)
                assert r.json()["fields"] == [
                    {"field": "body", "message": "Input should be a valid dictionary"}
                ]
                assert r.json()["request_id"] == r.headers["x-request-id"]
        # An error of the endpoint itself carries the same body.
        r = await http.post("/messages", json={"model": "m", "max_tokens": 5})
        assert r.status_code == 400 and r.json()["ok"] is False
        assert r.json()["request_id"] == r.headers["x-request-id"]


async def test_the_apps_exception_handlers_answer_for_the_model_endpoints(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """The model endpoints are routes of the app (issue 31): an exception handler installed
    on the FastAPI app answers their errors, the endpoint's own (a missing model) and a
    refusal before any route ran (no token), with the request's id and records as ever."""
    from deployments.api import create_app

    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant)
    app = create_app(settings)

    async def teapot(request: Request, exc: OrchestratorError) -> JSONResponse:
        return JSONResponse(
            {"handled": exc.code, "request_id": request.state.request_id},
            status_code=418,
        )

    app.add_exception_handler(BadRequest, teapot)  # type: ignore[arg-type]
    app.add_exception_handler(Unauthorized, teapot)  # type: ignore[arg-type]
    async with ServedApp(settings, app=app) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", headers=ADMIN) as http:
            for path in ("/chat/completions", "/messages"):
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
                r = await http.post(path, json=body)
                assert r.status_code == 418, (path, r.text)
                # A BadRequest of the endpoint's decoder (no model): its code varies by format.
                assert r.json()["handled"] in ("bad_request", "validation_error")
                assert r.json()["request_id"] == r.headers["x-request-id"]
                r = await http.post(path, json=body, headers={"Authorization": ""})
                assert r.status_code == 418 and r.json()["handled"] == "unauthorized"
            # Every other route answers through the same handlers.
            r = await http.get("/whoami", headers={"Authorization": ""})
            assert r.status_code == 418 and r.json()["handled"] == "unauthorized"
            metrics = (await http.get("/metrics")).text
    for route in ("/api/v1/chat/completions", "/api/v1/messages"):
        assert f'method="POST",path="{route}",status="418"}} 2' in metrics


async def test_calls_are_recorded_as_inference_events(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic], make_settings: Any
) -> None:
    oai, _ = upstreams
    oai.script([FakeReply(text="ok", prompt_tokens=5, completion_tokens=2)])
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        r = await http.post(
            "/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
        )
        request_id = r.headers["x-request-id"]
    settings = make_settings()
    db = await connect(settings.database_url)
    try:
        store = EventStore(db.pool)
        for _ in range(50):
            events, _ = await store.query(
                EventQuery(aggregate=request_id), Principal("test", is_admin=True)
            )
            if any(e.type == "inference.complete" for e in events):
                break
            await asyncio.sleep(0.05)
    finally:
        await db.close()
    # The call's start (issue 33), then its outcome.
    start, event = events
    assert start.type == "inference.request" and start.user_uuid == "admin"
    assert start.data["model"] == "gpt-4o-mini" and start.data["stream"] is False
    assert event.type == "inference.complete" and event.user_uuid == "admin"
    assert event.data["provider"] == "openai"
    assert (event.data["tokens_in"], event.data["tokens_out"]) == (5, 2)
    assert event.data["finish_reason"] == "end_turn"
