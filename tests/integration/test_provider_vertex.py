"""The `vertex` kind against real loopback servers speaking Vertex AI's model endpoints and
Google's OAuth token endpoint (tests/fakes/vertex_server.py). Credentials come through
google-auth's own default chain: GOOGLE_APPLICATION_CREDENTIALS names a service-account file
(an RSA key made here) whose `token_uri` is the loopback fake, so google-auth's real
JWT-bearer flow runs. Gemini models and Claude models, streamed and not, tools, errors,
embeddings, the probe; then through the gateway with the official openai and anthropic SDKs."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from orchestrator.config import Settings
from orchestrator.errors import ErrorCode, RateLimited, ValidationFailed
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import (
    BlockDelta,
    ChatRequest,
    EmbedRequest,
    Gateway,
    Message,
    MessageEnd,
    MessageStart,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    _params,
    build_adapter,
    collect,
    configured_providers,
)
from orchestrator.providers._vertex import GoogleToken, VertexAdapter
from tests.conftest import ADMIN_TOKEN, ServedApp, free_port
from tests.fakes.anthropic_server import Reply, rate_limited, text_reply, tool_reply
from tests.fakes.gemini_server import GeminiTurn
from tests.fakes.vertex_server import GoogleTokenFake, VertexFake, service_account

PROJECT = "test-project"
GEMINI = "gemini-2.0-flash"
CLAUDE = "claude-sonnet-4-5@20250929"
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
async def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[VertexFake, GoogleTokenFake, Path]]:
    async with GoogleTokenFake() as tokens, VertexFake(tokens=tokens, project=PROJECT) as fake:
        key_file = tmp_path_factory.mktemp("gcp") / "service-account.json"
        key_file.write_text(json.dumps(tokens.account(PROJECT)))
        yield fake, tokens, key_file


@pytest.fixture
def vertex(
    servers: tuple[VertexFake, GoogleTokenFake, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[VertexFake]:
    fake, tokens, key_file = servers
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    fake.requests.clear()
    fake.violations.clear()
    tokens.requests.clear()
    with fake._lock:
        fake._script.clear()
    yield fake


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def adapter(
    base_url: str, http: httpx.AsyncClient, *, project: str | None = PROJECT, timeout_s: float = 10
) -> VertexAdapter:
    config = ProviderConfig(
        "vertex",
        "vertex",
        base_url,
        timeout_s=timeout_s,
        connect_timeout_s=2,
        extra={"project": project, "location": "us-central1"},
    )
    built = build_adapter(config, http)
    assert isinstance(built, VertexAdapter)
    return built


def ask(model: str, text: str = "Hello?", **kw: Any) -> ChatRequest:
    kw.setdefault("max_tokens", 256)
    return ChatRequest(model, (Message("user", (TextBlock(text),)),), **kw)


async def events_of(vertex_adapter: VertexAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [e async for e in vertex_adapter.stream(request)]


def root(model: str, publisher: str = "google") -> str:
    return f"/v1/projects/{PROJECT}/locations/us-central1/publishers/{publisher}/models/{model}"


# --- Gemini on Vertex --------------------------------------------------------------------------
async def test_gemini_complete_with_a_token_from_the_service_account(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    vertex.script(GeminiTurn(parts=[{"text": "Hello "}, {"text": "Vertex"}], candidates_tokens=3))
    answer = await adapter(vertex.base_url, http).complete(ask(GEMINI))
    assert answer.content == (TextBlock("Hello Vertex"),)
    assert (answer.stop_reason, answer.usage.input_tokens, answer.usage.output_tokens) == (
        "end_turn",
        12,
        3,
    )
    sent = vertex.requests[-1]
    assert sent.path == root(GEMINI) + ":generateContent"
    assert sent.json["contents"] == [{"role": "user", "parts": [{"text": "Hello?"}]}]
    assert "x-goog-api-key" not in sent.headers
    tokens = vertex.tokens
    assert sent.headers["authorization"] == f"Bearer {tokens.issued[-1]}"
    # google-auth's real JWT-bearer grant reached the token endpoint
    claims = tokens.claims[-1]
    assert (
        claims["iss"] == tokens.client_email
        and claims["aud"] == "https://oauth2.googleapis.com/token"
    )
    assert "https://www.googleapis.com/auth/cloud-platform" in claims["scope"]
    assert not vertex.violations


async def test_gemini_stream_and_tools(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    vertex.script(
        GeminiTurn(
            parts=[
                {"text": "Let me check. "},
                {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}},
            ]
        ),
        GeminiTurn(parts=[{"text": "It is sunny."}]),
    )
    vertex_adapter = adapter(vertex.base_url, http)
    events = await events_of(vertex_adapter, ask(GEMINI, tools=(WEATHER,)))
    assert isinstance(events[0], MessageStart)
    end = events[-1]
    assert isinstance(end, MessageEnd) and end.stop_reason == "tool_use"
    first = await collect(_replay(events))
    call = next(b for b in first.content if isinstance(b, ToolUseBlock))
    assert (call.name, call.input) == ("get_weather", {"city": "Oslo"})
    assert vertex.requests[-1].path == root(GEMINI) + ":streamGenerateContent"
    assert vertex.requests[-1].query == "alt=sse"
    history = (
        Message("user", (TextBlock("Weather in Oslo?"),)),
        Message("assistant", first.content),
        Message("user", (ToolResultBlock(call.id, (TextBlock("sunny"),)),)),
    )
    second = await collect(vertex_adapter.stream(ChatRequest(GEMINI, history, tools=(WEATHER,))))
    assert second.content == (TextBlock("It is sunny."),)
    parts = vertex.requests[-1].json["contents"][2]["parts"]
    assert parts[0]["functionResponse"]["name"] == "get_weather"
    assert len(vertex.tokens.requests) == 1  # the token is cached across calls
    assert not vertex.violations


async def _replay(events: list[StreamEvent]) -> AsyncIterator[StreamEvent]:
    for event in events:
        yield event


async def test_gemini_rate_limit_reads_retry_info(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    vertex.script(
        GeminiTurn.rate_limited("9s"), GeminiTurn.failing(503, "The service is unavailable.")
    )
    vertex_adapter = adapter(vertex.base_url, http)
    with pytest.raises(ProviderError) as info:
        await vertex_adapter.complete(ask(GEMINI))
    err = info.value
    assert (err.upstream_status, err.retry_after, err.retryable) == (429, 9.0, True)
    assert isinstance(err.to_http(), RateLimited)
    with pytest.raises(ProviderError) as info:
        await events_of(vertex_adapter, ask(GEMINI))
    assert (info.value.upstream_status, info.value.retryable) == (503, True)


# --- Claude on Vertex --------------------------------------------------------------------------
async def test_claude_complete_uses_raw_predict_with_vertex_anthropic_version(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    vertex.script(text_reply("Hello from Claude", input_tokens=10, output_tokens=4))
    answer = await adapter(vertex.base_url, http).complete(ask(CLAUDE, system="Be brief."))
    assert answer.content == (TextBlock("Hello from Claude"),)
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (10, 4)
    sent = vertex.requests[-1]
    assert sent.path == root(CLAUDE, "anthropic") + ":rawPredict"
    assert "model" not in sent.json
    assert sent.json["anthropic_version"] == "vertex-2023-10-16"
    assert sent.json["system"] == "Be brief." and sent.json["max_tokens"] == 256
    assert sent.headers["authorization"].startswith("Bearer ya29.")
    assert "x-api-key" not in sent.headers and "anthropic-version" not in sent.headers
    assert not vertex.violations


async def test_claude_stream_with_a_tool_call(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    vertex.script(tool_reply("get_weather", {"city": "Paris"}, id="toolu_v1", text="Checking."))
    events = await events_of(adapter(vertex.base_url, http), ask(CLAUDE, tools=(WEATHER,)))
    answer = await collect(_replay(events))
    assert answer.content == (
        TextBlock("Checking."),
        ToolUseBlock("toolu_v1", "get_weather", {"city": "Paris"}),
    )
    assert answer.stop_reason == "tool_use"
    assert "".join(e.text for e in events if isinstance(e, BlockDelta)).startswith("Checking.")
    sent = vertex.requests[-1]
    assert sent.path == root(CLAUDE, "anthropic") + ":streamRawPredict"
    assert sent.json["stream"] is True and sent.json["tools"][0]["name"] == "get_weather"
    assert not vertex.violations


async def test_claude_errors(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    vertex.script(
        rate_limited(retry_after=4),
        GeminiTurn.failing(
            429,
            "Quota exceeded for aiplatform.googleapis.com/"
            "online_prediction_requests_per_base_model",
        ),
    )
    vertex_adapter = adapter(vertex.base_url, http)
    with pytest.raises(ProviderError) as info:
        await vertex_adapter.complete(ask(CLAUDE))
    assert (info.value.upstream_status, info.value.retry_after) == (429, 4.0)
    with pytest.raises(ProviderError) as info:
        await events_of(vertex_adapter, ask(CLAUDE))
    assert info.value.upstream_status == 429 and "Quota exceeded" in info.value.message


async def test_a_slow_claude_stream_times_out(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    vertex.script(Reply([{"type": "text", "text": "slow answer"}], delay_s=0.8))
    with pytest.raises(ProviderError) as info:
        await events_of(adapter(vertex.base_url, http, timeout_s=0.3), ask(CLAUDE))
    assert info.value.code == ErrorCode.UPSTREAM_TIMEOUT and info.value.retryable


# --- credentials -------------------------------------------------------------------------------
async def test_a_revoked_token_is_a_gateway_error(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    vertex_adapter = adapter(vertex.base_url, http)
    await vertex_adapter.complete(ask(GEMINI))
    issued = list(vertex.tokens.issued)
    vertex.tokens.issued.clear()  # Google no longer honours it
    try:
        with pytest.raises(ProviderError) as info:
            await vertex_adapter.complete(ask(GEMINI))
    finally:
        vertex.tokens.issued.extend(issued)
    assert info.value.upstream_status == 401 and "UNAUTHENTICATED" in info.value.message
    assert info.value.to_http().status_code == 502


async def test_refused_or_missing_credentials_fail_cleanly(
    vertex: VertexFake,
    http: httpx.AsyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A key the token endpoint does not know: google-auth's RefreshError (invalid_grant).
    stranger, _ = service_account(token_uri=vertex.tokens.token_uri)
    stranger["client_email"] = vertex.tokens.client_email
    (tmp_path / "stranger.json").write_text(json.dumps(stranger))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "stranger.json"))
    with pytest.raises(ProviderError) as info:
        await adapter(vertex.base_url, http).complete(ask(GEMINI))
    assert info.value.upstream_status == 401 and "Invalid JWT Signature" in info.value.message
    assert "PRIVATE KEY" not in info.value.message
    assert info.value.to_http().status_code == 502
    # No credentials at all.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ProviderError) as info:
        await adapter(vertex.base_url, http).complete(ask(GEMINI))
    assert info.value.upstream_status == 401 and "Google credentials" in info.value.message
    assert not vertex.requests  # nothing went to the model endpoint


async def test_the_project_comes_from_the_credentials_when_not_set(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    await adapter(vertex.base_url, http, project=None).complete(ask(GEMINI))
    assert vertex.requests[-1].path == root(GEMINI) + ":generateContent"


async def test_the_refresh_runs_off_the_event_loop(
    vertex: VertexFake, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = GoogleToken._load_and_refresh

    def spy(self: GoogleToken) -> None:
        threads.append(threading.current_thread().name)
        real(self)

    monkeypatch.setattr(GoogleToken, "_load_and_refresh", spy)
    await adapter(vertex.base_url, http).complete(ask(GEMINI))
    assert threads and threads[0] != threading.main_thread().name


# --- transport, probe, embeddings, table ----------------------------------------------------------
async def test_connection_refused_is_unreachable(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    gone = adapter(f"http://127.0.0.1:{free_port()}/v1", http)
    for call in (gone.complete(ask(GEMINI)), events_of(gone, ask(CLAUDE)), gone.probe()):
        with pytest.raises(ProviderError) as info:
            await call
        assert info.value.code == ErrorCode.UPSTREAM_UNAVAILABLE


async def test_probe_reads_the_location(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    await adapter(vertex.base_url, http).probe()
    sent = vertex.requests[-1]
    assert (sent.method, sent.path) == ("GET", f"/v1/projects/{PROJECT}/locations/us-central1")
    with pytest.raises(ProviderError) as info:
        await adapter(vertex.base_url, http, project="someone-else").probe()
    assert info.value.upstream_status == 403


async def test_embeddings_use_predict(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    vertex_adapter = adapter(vertex.base_url, http)
    got = await vertex_adapter.embed(
        EmbedRequest("text-embedding-005", ("red apple", "green pear tree"), dimensions=256)
    )
    assert [len(v) for v in got.vectors] == [256, 256] and got.input_tokens == 5
    sent = vertex.requests[-1]
    assert sent.path == root("text-embedding-005") + ":predict"
    assert sent.json == {
        "instances": [{"content": "red apple"}, {"content": "green pear tree"}],
        "parameters": {"outputDimensionality": 256},
    }
    # gemini-embedding-001 takes one instance per request
    vertex.requests.clear()
    got = await vertex_adapter.embed(EmbedRequest("gemini-embedding-001", ("a", "b", "c")))
    assert len(got.vectors) == 3 and len(vertex.requests) == 3
    with pytest.raises(ProviderError) as info:
        await vertex_adapter.embed(EmbedRequest(CLAUDE, ("a",)))
    assert info.value.upstream_status == 404
    assert not vertex.violations


async def test_anthropics_vertex_client_reads_the_fake(
    vertex: VertexFake, http: httpx.AsyncClient
) -> None:
    """anthropic-python's own AnthropicVertex (its URL, body and SSE parsing) against the fake,
    so the fake is what Anthropic's Vertex client expects."""
    await adapter(vertex.base_url, http).ready()  # a token the fake issued
    client = anthropic.AsyncAnthropicVertex(
        region="us-central1",
        project_id=PROJECT,
        access_token=vertex.tokens.issued[-1],
        base_url=vertex.base_url,
    )
    vertex.script(text_reply("whole"), text_reply("streamed"))
    async with client:
        done = await client.messages.create(
            model=CLAUDE, max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        )
        assert done.content[0].type == "text" and done.content[0].text == "whole"
        async with client.messages.stream(
            model=CLAUDE, max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert await stream.get_final_text() == "streamed"
    assert [r.path.rsplit(":", 1)[1] for r in vertex.claude_requests] == [
        "rawPredict",
        "streamRawPredict",
    ]
    assert not vertex.violations


def test_the_base_url_follows_the_location() -> None:
    def base(location: str | None) -> str:
        settings = Settings.load(
            environ={}, providers={"vertex": {"project": "p", "location": location}}
        )
        (config,) = configured_providers(settings)
        return config.base_url

    assert base("europe-west4") == "https://europe-west4-aiplatform.googleapis.com/v1"
    assert base("global") == "https://aiplatform.googleapis.com/v1"
    assert base(None) == "https://us-central1-aiplatform.googleapis.com/v1"


def test_the_declared_table_follows_the_model() -> None:
    config = ProviderConfig("vertex", "vertex", "http://x/v1", extra={"project": "p"})
    vertex_adapter = VertexAdapter(config, httpx.AsyncClient())
    assert vertex_adapter.params_for(GEMINI) is _params.GEMINI
    assert vertex_adapter.params_for(CLAUDE) is _params.VERTEX_ANTHROPIC
    both = {"top_k": 5, "response_format": {"type": "json_object"}}
    assert _params.fit(both, vertex_adapter, "vertex", drop=False, model=CLAUDE) == both
    assert _params.fit(both, vertex_adapter, "vertex", drop=False, model=GEMINI) == both
    with pytest.raises(ValidationFailed):  # Gemini has seed, Anthropic has not
        _params.fit({"seed": 1}, vertex_adapter, "vertex", drop=False, model=CLAUDE)
    assert _params.fit({"seed": 1}, vertex_adapter, "vertex", drop=False, model=GEMINI)


async def test_params_reach_each_body(vertex: VertexFake, http: httpx.AsyncClient) -> None:
    vertex_adapter = adapter(vertex.base_url, http)
    await vertex_adapter.complete(ask(GEMINI, params={"seed": 3, "top_k": 4}))
    assert vertex.requests[-1].json["generationConfig"]["seed"] == 3
    await vertex_adapter.complete(ask(CLAUDE, params={"top_k": 4}))
    assert vertex.requests[-1].json["top_k"] == 4


async def test_the_gateway_fits_params_to_the_routed_models_table(vertex: VertexFake) -> None:
    """One provider, two tables: seed reaches Gemini and is refused (or, with
    drop_unsupported_params, dropped) for Claude."""
    providers = {"vertex": {"base_url": vertex.base_url, "project": PROJECT}}
    for drop in (False, True):
        settings = Settings.load(
            environ={},
            providers=providers,
            provider_retries=0,
            admin_token="x" * 32,
            drop_unsupported_params=drop,
        )
        gw = Gateway(settings, MetricsRecorder("test"))
        try:
            await gw.complete(ask(GEMINI, params={"seed": 5}))
            assert vertex.requests[-1].json["generationConfig"]["seed"] == 5
            if drop:
                await gw.complete(ask(CLAUDE, params={"seed": 5, "top_k": 3}))
                assert "seed" not in vertex.requests[-1].json
                assert vertex.requests[-1].json["top_k"] == 3
            else:
                with pytest.raises(ValidationFailed) as caught:
                    await gw.complete(ask(CLAUDE, params={"seed": 5}))
                assert caught.value.extra["provider"] == "vertex"
                assert "seed" in caught.value.message
        finally:
            await gw.aclose()
    assert len(vertex.claude_requests) == 1 and not vertex.violations


# --- through the gateway ---------------------------------------------------------------------
async def test_through_the_gateway_with_the_openai_and_anthropic_sdks(
    make_settings: Any, vertex: VertexFake
) -> None:
    settings = make_settings(
        providers={
            "vertex": {"base_url": vertex.base_url, "project": PROJECT, "location": "us-central1"}
        },
        provider_retry_backoff_s=0.01,
        rate_limit_per_minute=0,
    )
    vertex.script(
        GeminiTurn.rate_limited("0s"),  # retried by the gateway
        GeminiTurn(parts=[{"text": "Gemini says hi"}]),
        GeminiTurn(parts=[{"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}]),
        text_reply("Claude says hi"),
        tool_reply("get_weather", {"city": "Lima"}, id="toolu_gw"),
    )
    async with ServedApp(settings) as app:
        oai = openai.AsyncOpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0)
        async with oai:
            done = await oai.chat.completions.create(
                model=GEMINI, messages=[{"role": "user", "content": "hi"}]
            )
            assert done.choices[0].message.content == "Gemini says hi"
            stream = await oai.chat.completions.create(
                model=GEMINI,
                messages=[{"role": "user", "content": "Rome?"}],
                tools=[
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "parameters": WEATHER.parameters},
                    }
                ],
                stream=True,
            )
            calls = [
                call
                async for chunk in stream
                for choice in chunk.choices
                for call in choice.delta.tool_calls or []
            ]
            assert calls[0].function is not None and calls[0].function.name == "get_weather"
            vectors = await oai.embeddings.create(model="text-embedding-005", input=["a b"])
            assert len(vectors.data[0].embedding) == 768
        claude = anthropic.AsyncAnthropic(
            base_url=f"{app.url}/api", api_key=ADMIN_TOKEN, max_retries=0
        )
        async with claude:
            message = await claude.messages.create(
                model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            )
            assert message.content[0].type == "text"
            assert message.content[0].text == "Claude says hi"
            async with claude.messages.stream(
                model=CLAUDE,
                max_tokens=64,
                messages=[{"role": "user", "content": "Lima?"}],
                tools=[{"name": "get_weather", "input_schema": WEATHER.parameters}],
            ) as events:
                final = await events.get_final_message()
            assert final.stop_reason == "tool_use"
            assert final.content[-1].type == "tool_use" and final.content[-1].input == {
                "city": "Lima"
            }
            with pytest.raises(anthropic.BadRequestError) as bad:  # Gemini's table: no metadata
                await claude.messages.create(
                    model=GEMINI,
                    max_tokens=64,
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={"service_tier": "auto"},
                )
            assert "not supported by provider vertex" in bad.value.response.text
        async with httpx.AsyncClient(
            base_url=f"{app.url}/api/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as admin:
            health = (await admin.get("/providers/health/vertex")).json()
    assert health["configured"] is True and health["reachable"] is True, health
    assert len([r for r in vertex.requests if r.path.endswith(":generateContent")]) == 2
    assert len(vertex.claude_requests) == 2
    assert not vertex.violations
