"""The chat-completions adapters (OpenAI, GLM, DeepSeek, Qwen, local llama-server) against a
real loopback server speaking OpenAI's wire format; the official `openai` SDK checks that the
fake is faithful."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from orchestrator.errors import BadGateway, ErrorCode, RateLimited
from orchestrator.providers import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatRequest,
    Message,
    MessageEnd,
    MessageStart,
    ProviderAdapter,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    _params,
    build_adapter,
    collect,
)
from orchestrator.providers._openai import (
    DeepSeekAdapter,
    LocalAdapter,
    OpenAIAdapter,
    QwenAdapter,
    ZhipuAdapter,
)
from tests.conftest import free_port
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

KEY = "sk-test-0123456789"
CLASSES: dict[str, type[OpenAIAdapter]] = {
    "openai": OpenAIAdapter,
    "zhipu": ZhipuAdapter,
    "deepseek": DeepSeekAdapter,
    "qwen": QwenAdapter,
    "local": LocalAdapter,
}
MODELS = {
    "openai": "gpt-4o-mini",
    "zhipu": "glm-4.6",
    "deepseek": "deepseek-chat",
    "qwen": "qwen-plus",
    "local": "SmolLM2-135M-Instruct-Q8_0.gguf",
}
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@dataclass
class Env:
    kind: str
    fake: OpenAIFake
    adapter: OpenAIAdapter
    http: httpx.AsyncClient

    @property
    def model(self) -> str:
        return MODELS[self.kind]

    def request(self, text: str = "Hello?", **kw: Any) -> ChatRequest:
        return ChatRequest(self.model, (Message("user", (TextBlock(text),)),), **kw)

    def reply(self, **kw: Any) -> FakeReply:
        # GLM documents no stream_options and puts the usage on its final chunk.
        kw.setdefault("usage_on_last_choice", self.kind == "zhipu")
        return FakeReply(**kw)


def config(kind: str, base_url: str, **kw: Any) -> ProviderConfig:
    kw.setdefault("api_key", None if kind == "local" else KEY)
    return ProviderConfig(name=kind, kind=kind, base_url=base_url, **kw)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture(scope="module", params=list(CLASSES))
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, OpenAIFake]]:
    """One fake per kind for the module (starting a server per test is the slow part)."""
    kind: str = request.param
    async with OpenAIFake(api_key=None if kind == "local" else KEY) as fake:
        yield kind, fake


@pytest.fixture
async def env(served: tuple[str, OpenAIFake], http: httpx.AsyncClient) -> Env:
    kind, fake = served
    fake.reset()
    adapter = build_adapter(config(kind, fake.base_url), http)
    assert type(adapter) is CLASSES[kind]  # the registry maps the kind to this class
    assert isinstance(adapter, OpenAIAdapter)
    return Env(kind, fake, adapter, http)


async def events_of(adapter: ProviderAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [e async for e in adapter.stream(request)]


# --- every adapter -------------------------------------------------------------------------
async def test_stream_text(env: Env) -> None:
    env.fake.script([env.reply(text="Hello, world!", prompt_tokens=12, completion_tokens=4)])
    events = await events_of(env.adapter, env.request(max_tokens=50))

    assert isinstance(events[0], MessageStart) and events[0].model == env.model
    assert events[1] == BlockStart(0, "text")
    deltas = [e for e in events if isinstance(e, BlockDelta)]
    assert len(deltas) > 1 and "".join(d.text for d in deltas) == "Hello, world!"
    assert events[-2:] == [BlockStop(0), MessageEnd("end_turn", Usage(12, 4))]

    sent = env.fake.last_request
    assert sent.method == "POST" and sent.path == "/v1/chat/completions"
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.headers["content-type"] == "application/json"
    if env.kind == "local":
        assert "authorization" not in sent.headers
    else:
        assert sent.headers["authorization"] == f"Bearer {KEY}"
    body = sent.json
    assert body["model"] == env.model and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "Hello?"}]
    if env.kind == "zhipu":
        assert "stream_options" not in body
    else:
        assert body["stream_options"] == {"include_usage": True}
    field = "max_completion_tokens" if env.kind == "openai" else "max_tokens"
    assert body[field] == 50 and len({"max_tokens", "max_completion_tokens"} & set(body)) == 1


async def test_complete_text(env: Env) -> None:
    env.fake.script([env.reply(text="Bonjour", prompt_tokens=3, completion_tokens=2)])
    resp = await env.adapter.complete(env.request(system="Speak French.", temperature=0.2))

    assert resp.content == (TextBlock("Bonjour"),)
    assert (resp.stop_reason, resp.usage, resp.model) == ("end_turn", Usage(3, 2), env.model)
    assert resp.id.startswith("chatcmpl-") and resp.created > 0
    body = env.fake.last_request.json
    assert body["stream"] is False and "stream_options" not in body
    assert body["messages"][0] == {"role": "system", "content": "Speak French."}
    assert body["temperature"] == 0.2
    assert env.fake.last_request.headers["accept"] == "application/json"


async def test_stream_tool_calls_with_fragmented_arguments(env: Env) -> None:
    env.fake.script(
        [
            env.reply(
                text="Checking.",
                tool_calls=[
                    FakeToolCall("get_weather", {"city": "Paris", "unit": "C"}, id="call_p"),
                    FakeToolCall("get_weather", {"city": "Rome"}, id="call_r"),
                ],
                args_chunk=3,
            )
        ]
    )
    events = await events_of(env.adapter, env.request(tools=(WEATHER,), tool_choice="auto"))

    starts = [e for e in events if isinstance(e, BlockStart)]
    assert starts == [
        BlockStart(0, "text"),
        BlockStart(1, "tool_use", "call_p", "get_weather"),
        BlockStart(2, "tool_use", "call_r", "get_weather"),
    ]
    assert len([e for e in events if isinstance(e, BlockDelta) and e.index == 1]) > 3
    resp = await collect(_replay(events))
    assert resp.text == "Checking."
    assert resp.tool_calls == [
        ToolUseBlock("call_p", "get_weather", {"city": "Paris", "unit": "C"}),
        ToolUseBlock("call_r", "get_weather", {"city": "Rome"}),
    ]
    assert resp.stop_reason == "tool_use"
    sent = env.fake.last_request.json
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert sent["tool_choice"] == "auto"


async def _replay(events: list[StreamEvent]) -> AsyncIterator[StreamEvent]:
    for e in events:
        yield e


async def test_complete_tool_calls_and_results_in_history(env: Env) -> None:
    env.fake.script([env.reply(tool_calls=[FakeToolCall("get_weather", '{"city":"Oslo"}')])])
    first = await env.adapter.complete(env.request("Weather in Oslo?", tools=(WEATHER,)))
    assert first.stop_reason == "tool_use" and first.text == ""
    (call,) = first.tool_calls
    assert call.name == "get_weather" and call.input == {"city": "Oslo"}
    assert call.id.startswith("call_")

    env.fake.script([env.reply(text="It is cold.")])
    follow_up = ChatRequest(
        env.model,
        (
            Message("user", (TextBlock("Weather in Oslo?"),)),
            Message("assistant", first.content),
            Message("user", (ToolResultBlock(call.id, (TextBlock("-5C"),)),)),
        ),
        tools=(WEATHER,),
    )
    second = await env.adapter.complete(follow_up)
    assert second.text == "It is cold."
    messages = env.fake.last_request.json["messages"]
    assert messages[1]["tool_calls"][0]["id"] == call.id
    assert messages[1]["content"] is None
    assert messages[2] == {"role": "tool", "tool_call_id": call.id, "content": "-5C"}


async def test_rate_limit_is_a_provider_error_with_retry_after(env: Env) -> None:
    env.fake.script([FakeReply.rate_limited(retry_after=2), FakeReply.rate_limited(7)])
    with pytest.raises(ProviderError) as info:
        await env.adapter.complete(env.request())
    err = info.value
    assert (err.upstream_status, err.retry_after, err.retryable) == (429, 2.0, True)
    assert err.provider == env.kind and "Rate limit reached" in err.message
    mapped = err.to_http()
    assert isinstance(mapped, RateLimited) and mapped.headers["Retry-After"] == "2"

    with pytest.raises(ProviderError) as info:
        await events_of(env.adapter, env.request())
    assert (info.value.upstream_status, info.value.retry_after) == (429, 7.0)


async def test_server_error_is_retryable(env: Env) -> None:
    env.fake.script([FakeReply.server_error(), FakeReply.server_error(503)])
    with pytest.raises(ProviderError) as info:
        await env.adapter.complete(env.request())
    assert (info.value.upstream_status, info.value.retryable) == (500, True)
    assert "The server had an error" in info.value.message
    assert isinstance(info.value.to_http(), BadGateway)
    with pytest.raises(ProviderError) as info:
        await events_of(env.adapter, env.request())
    assert (info.value.upstream_status, info.value.retryable) == (503, True)


async def test_rejected_credentials_are_not_retryable(env: Env) -> None:
    env.fake.script([FakeReply.unauthorized()])
    with pytest.raises(ProviderError) as info:
        await env.adapter.complete(env.request())
    assert (info.value.upstream_status, info.value.retryable) == (401, False)
    assert "Incorrect API key" in info.value.message
    assert info.value.to_http().status_code == 502  # our key, not the caller's fault


async def test_connection_refused_is_unreachable(env: Env) -> None:
    adapter = CLASSES[env.kind](
        config(env.kind, f"http://127.0.0.1:{free_port()}/v1", connect_timeout_s=2), env.http
    )
    for call in (
        adapter.complete(env.request()),
        events_of(adapter, env.request()),
        adapter.probe(),
    ):
        with pytest.raises(ProviderError) as info:
            await call
        err = info.value
        assert err.code == ErrorCode.UPSTREAM_UNAVAILABLE
        assert (err.upstream_status, err.retryable, err.provider) == (0, True, env.kind)
        assert err.to_http().status_code == 503


@pytest.mark.parametrize("fail_with", ["close", "error_chunk"])
async def test_mid_stream_failure_raises_from_the_iterator(env: Env, fail_with: str) -> None:
    env.fake.script(
        [env.reply(text="a long answer that breaks", fail_after=4, fail_with=fail_with)]
    )
    received: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in env.adapter.stream(env.request()):
            received.append(event)
    assert isinstance(received[0], MessageStart)
    assert [e.text for e in received if isinstance(e, BlockDelta)] == ["a l", "ong", " an"]
    assert not any(isinstance(e, MessageEnd) for e in received)
    assert info.value.retryable and info.value.provider == env.kind


async def test_a_slow_upstream_times_out(env: Env) -> None:
    adapter = CLASSES[env.kind](config(env.kind, env.fake.base_url, timeout_s=0.2), env.http)
    env.fake.script([env.reply(text="late", delay_s=0.8)])
    with pytest.raises(ProviderError) as info:
        await adapter.complete(env.request())
    assert info.value.code == ErrorCode.UPSTREAM_TIMEOUT and info.value.retryable


async def test_probe(env: Env) -> None:
    await env.adapter.probe()
    probe_path = "/health" if env.kind == "local" else "/v1/models"
    assert (env.fake.last_request.method, env.fake.last_request.path) == ("GET", probe_path)
    if env.kind == "local":
        env.fake.health_status = 503  # llama-server while the model loads
    else:
        env.fake.models_status = 401
    with pytest.raises(ProviderError) as info:
        await env.adapter.probe()
    assert info.value.upstream_status == (503 if env.kind == "local" else 401)


# --- provider differences ------------------------------------------------------------------
async def test_deepseek_reasoning_streams_as_thinking_and_returns_only_for_tool_turns(
    http: httpx.AsyncClient,
) -> None:
    async with OpenAIFake(api_key=KEY) as fake:
        adapter = DeepSeekAdapter(config("deepseek", fake.base_url), http)
        fake.script(
            [
                FakeReply(reasoning="9.11 < 9.8 because...", text="9.8 is greater."),
                FakeReply(reasoning="Compare decimals.", text="9.8"),
            ]
        )
        question = Message("user", (TextBlock("9.11 or 9.8?"),))
        events = await events_of(adapter, ChatRequest("deepseek-reasoner", (question,)))
        starts = [e for e in events if isinstance(e, BlockStart)]
        assert starts == [BlockStart(0, "thinking"), BlockStart(1, "text")]
        streamed = await collect(_replay(events))
        assert streamed.content == (
            ThinkingBlock("9.11 < 9.8 because..."),
            TextBlock("9.8 is greater."),
        )

        resp = await adapter.complete(ChatRequest("deepseek-reasoner", (question,)))
        assert resp.content == (ThinkingBlock("Compare decimals."), TextBlock("9.8"))

        history = (
            question,
            Message("assistant", resp.content),
            Message("user", (TextBlock("Check with the tool"),)),
            Message(
                "assistant",
                (ThinkingBlock("I will call it."), ToolUseBlock("call_1", "calc", {"a": 9.8})),
            ),
            Message("user", (ToolResultBlock("call_1", (TextBlock("ok"),)),)),
        )
        await adapter.complete(ChatRequest("deepseek-reasoner", history))
        sent = [m for m in fake.last_request.json["messages"] if m["role"] == "assistant"]
        assert "reasoning_content" not in sent[0]  # a plain turn: DeepSeek ignores or rejects
        assert sent[1]["reasoning_content"] == "I will call it."  # a tool turn: required


async def test_zhipu_request_follows_glm_documented_parameters(http: httpx.AsyncClient) -> None:
    async with OpenAIFake(api_key=KEY, prefix="/api/paas/v4") as fake:
        adapter = ZhipuAdapter(config("zhipu", fake.base_url), http)
        noop = ToolDef("noop", None, {"type": "object", "properties": {}})
        base = ChatRequest(
            "glm-4.6",
            (Message("user", (TextBlock("hi"),)),),
            tools=(WEATHER, noop),
            temperature=1.5,
            stop=("END",),
            user="end-user-77",
        )
        await adapter.complete(replace(base, tool_choice="none"))
        body = fake.last_request.json
        assert fake.last_request.path == "/api/paas/v4/chat/completions"
        assert "tools" not in body and "tool_choice" not in body
        assert body["temperature"] == 1.0 and body["stop"] == ["END"]
        assert body["user_id"] == "end-user-77" and "user" not in body

        forced = replace(base, tool_choice={"name": "get_weather"})
        fake.script([FakeReply(usage_on_last_choice=True, text="ok")])
        events = await events_of(adapter, forced)
        body = fake.last_request.json
        assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
        assert body["tool_choice"] == "auto" and "stream_options" not in body
        assert events[-1] == MessageEnd("end_turn", Usage(11, 7))

        requests_before = len(fake.requests)
        too_many = replace(base, stop=("a", "b"))
        with pytest.raises(ProviderError) as info:
            await adapter.complete(too_many)
        assert info.value.upstream_status == 400 and "one stop sequence" in info.value.message
        assert len(fake.requests) == requests_before  # refused before sending


async def test_zhipu_network_error_finish_is_a_retryable_failure(http: httpx.AsyncClient) -> None:
    async with OpenAIFake(api_key=KEY) as fake:
        adapter = ZhipuAdapter(config("zhipu", fake.base_url), http)
        fake.script([FakeReply(text="partial", finish_reason="network_error")])
        with pytest.raises(ProviderError, match="network_error") as info:
            await adapter.complete(ChatRequest("glm-4.6", (Message("user", (TextBlock("x"),)),)))
        assert info.value.retryable


async def test_local_adapter_sends_no_key_and_checks_health(http: httpx.AsyncClient) -> None:
    async with OpenAIFake() as fake:
        adapter = LocalAdapter(config("local", fake.base_url), http)
        await adapter.probe()
        assert fake.last_request.path == "/health"
        resp = await adapter.complete(
            ChatRequest("any-name.gguf", (Message("user", (TextBlock("ping"),)),))
        )
        assert resp.text == "echo: ping"  # the fake echoes when nothing is scripted
        sent = fake.last_request
        assert "authorization" not in sent.headers and sent.json["model"] == "any-name.gguf"


async def test_local_server_logprobs_come_back_streamed_and_not(
    http: httpx.AsyncClient,
) -> None:
    """llama-server (and vLLM, a custom openai-format provider) take OpenAI's `logprobs` /
    `top_logprobs` and answer them in OpenAI's shape: declared in their tables, passed on,
    and read back onto the answer's text (ChatResponse.logprobs, BlockDelta.logprobs)."""
    async with OpenAIFake(profile="llamacpp") as fake:
        adapter = LocalAdapter(config("local", fake.base_url), http)
        assert not _params.unsupported(adapter, {"logprobs": True, "top_logprobs": 2})
        request = ChatRequest(
            "m.gguf",
            (Message("user", (TextBlock("ping"),)),),
            params={"logprobs": True, "top_logprobs": 2},
        )
        fake.script([FakeReply(text="pong pong")])
        response = await adapter.complete(request)
        assert (fake.last_request.json["logprobs"], fake.last_request.json["top_logprobs"]) == (
            True,
            2,
        )
        assert response.logprobs is not None
        assert "".join(t["token"] for t in response.logprobs["content"]) == "pong pong"
        fake.script([FakeReply(text="pong pong", text_chunk=3)])
        events = await events_of(adapter, request)
        tokens = [
            t["token"]
            for e in events
            if isinstance(e, BlockDelta) and e.logprobs
            for t in e.logprobs
        ]
        assert "".join(tokens) == "pong pong"
        # llama-server counts a prompt: its chat template applied, then tokenized.
        count = await adapter.count_tokens(request)
        assert [r.path for r in fake.requests[-2:]] == ["/apply-template", "/tokenize"]
        assert count == len(fake.requests[-1].json["content"].split()) + 1
    custom = build_adapter(
        ProviderConfig("vllm", "custom", "http://x", extra={"format": "openai"}), http
    )
    assert not _params.unsupported(custom, {"logprobs": True, "top_logprobs": 2})


async def test_wrong_key_is_rejected_by_the_fake_as_openai_does(http: httpx.AsyncClient) -> None:
    async with OpenAIFake(api_key=KEY) as fake:
        adapter = OpenAIAdapter(config("openai", fake.base_url, api_key="sk-wrong"), http)
        with pytest.raises(ProviderError) as info:
            await adapter.probe()
        assert info.value.upstream_status == 401 and "Incorrect API key" in info.value.message


# --- the fake, checked by the official SDK -------------------------------------------------
async def test_the_openai_sdk_reads_the_fake() -> None:
    async with (
        OpenAIFake(api_key=KEY) as fake,
        openai.AsyncOpenAI(base_url=fake.base_url, api_key=KEY, max_retries=0) as client,
    ):
        fake.script(
            [
                FakeReply(
                    text="On it.",
                    tool_calls=[FakeToolCall("get_weather", {"city": "Lima"}, id="call_l")],
                    prompt_tokens=20,
                    completion_tokens=9,
                ),
                FakeReply(text="plain", reasoning="thought"),
                FakeReply.rate_limited(retry_after=3),
            ]
        )
        tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "Weather in Lima?"}],
            tools=tools,
            stream=True,
            stream_options={"include_usage": True},
        )
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        async for chunk in stream:
            state.handle_chunk(chunk)
        final = state.get_final_completion()
        message = final.choices[0].message
        assert message.content == "On it."
        assert message.tool_calls is not None
        (tool_call,) = message.tool_calls
        assert (tool_call.id, tool_call.function.arguments) == ("call_l", '{"city": "Lima"}')
        assert final.choices[0].finish_reason == "tool_calls"
        assert final.usage is not None and final.usage.total_tokens == 29

        completion = await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.choices[0].message.content == "plain"
        extra = completion.choices[0].message.model_extra or {}
        assert extra["reasoning_content"] == "thought"  # DeepSeek's field, kept by the SDK
        assert completion.usage is not None and completion.usage.prompt_tokens == 11

        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
        assert info.value.code == "rate_limit_exceeded"
        assert info.value.response.headers["retry-after"] == "3"
        assert fake.chat_requests[0].headers["authorization"] == f"Bearer {KEY}"
