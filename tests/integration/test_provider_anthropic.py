"""AnthropicAdapter against a real loopback server speaking the Messages API (tests/fakes)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from orchestrator.errors import ErrorCode
from orchestrator.providers import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatRequest,
    ImageBlock,
    Message,
    MessageEnd,
    MessageStart,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    build_adapter,
    collect,
)
from orchestrator.providers._anthropic import AnthropicAdapter
from orchestrator.providers._anthropic_format import encode_request
from tests.fakes.anthropic_server import (
    ErrorReply,
    FakeAnthropic,
    Reply,
    message_events,
    overloaded,
    rate_limited,
    text_reply,
    thinking_reply,
    tool_reply,
)

MODEL = "claude-sonnet-4-5"
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def _adapter(
    http: httpx.AsyncClient, base_url: str, api_key: str | None = "sk-ant-fake-key", **kw: Any
) -> AnthropicAdapter:
    config = ProviderConfig(
        name="anthropic", kind="anthropic", base_url=base_url, api_key=api_key, **kw
    )
    adapter = build_adapter(config, http)
    assert isinstance(adapter, AnthropicAdapter)
    return adapter


def _ask(text: str = "Hello", **kw: Any) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=(Message("user", (TextBlock(text),)),), **kw)


async def _events(adapter: AnthropicAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [event async for event in adapter.stream(request)]


async def _events_until_error(
    adapter: AnthropicAdapter, request: ChatRequest
) -> tuple[list[StreamEvent], ProviderError]:
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in adapter.stream(request):
            seen.append(event)
    return seen, info.value


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- success paths ----------------------------------------------------------------------------
async def test_complete_sends_exact_headers_and_body(
    fake: FakeAnthropic, http: httpx.AsyncClient
) -> None:
    fake.enqueue(text_reply("Bonjour!", input_tokens=9, output_tokens=3, id="msg_fixed"))
    request = _ask("Say hi in French", system="Be brief.", temperature=0.5, user="u-1")
    response = await _adapter(http, fake.url).complete(request)

    assert response.id == "msg_fixed"
    assert response.model == MODEL
    assert response.content == (TextBlock("Bonjour!"),)
    assert response.stop_reason == "end_turn"
    assert response.usage == Usage(9, 3)

    (sent,) = fake.requests
    assert sent.method == "POST" and sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-fake-key"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers
    assert sent.json == {
        "model": MODEL,
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi in French"}]}],
        "system": "Be brief.",
        "temperature": 0.5,
        "metadata": {"user_id": "u-1"},
    }
    assert sent.json == encode_request(request, stream=False)


async def test_base_url_with_v1_suffix(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(text_reply("ok"))
    response = await _adapter(http, f"{fake.url}/v1/").complete(_ask())
    assert response.text == "ok"
    assert fake.requests[-1].path == "/v1/messages"


async def test_stream_text_exact_events(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(text_reply("Hello, world", input_tokens=21, output_tokens=4, id="msg_s1", chunk=5))
    events = await _events(_adapter(http, fake.url), _ask())
    assert events == [
        MessageStart("msg_s1", MODEL, 21),
        BlockStart(0, "text"),
        BlockDelta(0, "Hello"),
        BlockDelta(0, ", wor"),
        BlockDelta(0, "ld"),
        BlockStop(0),
        MessageEnd("end_turn", Usage(21, 4)),
    ]
    sent = fake.requests[-1]
    assert sent.json["stream"] is True
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.headers["x-api-key"] == "sk-ant-fake-key"


async def test_stream_tool_use_with_input_split_mid_token(
    fake: FakeAnthropic, http: httpx.AsyncClient
) -> None:
    tool_input = {"city": "São Paulo", "days": 3, "units": ["metric", "iso"]}
    fake.enqueue(tool_reply("get_weather", tool_input, id="toolu_01A", text="Checking.", chunk=2))
    request = _ask("weather?", tools=(WEATHER,), tool_choice="auto")
    events = await _events(_adapter(http, fake.url), request)

    fragments = [e.text for e in events if isinstance(e, BlockDelta) and e.index == 1]
    assert len(fragments) > 10  # really fragmented, inside keys and strings
    assert "".join(fragments) == json.dumps(tool_input)
    assert BlockStart(1, "tool_use", "toolu_01A", "get_weather") in events
    assert isinstance(events[-1], MessageEnd) and events[-1].stop_reason == "tool_use"

    fake.enqueue(tool_reply("get_weather", tool_input, id="toolu_01A", text="Checking.", chunk=2))
    response = await collect(_adapter(http, fake.url).stream(request))
    assert response.content == (
        TextBlock("Checking."),
        ToolUseBlock("toolu_01A", "get_weather", tool_input),
    )
    assert response.stop_reason == "tool_use"
    sent = fake.requests[-1].json
    assert sent["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": WEATHER.parameters,
        }
    ]
    assert sent["tool_choice"] == {"type": "auto"}


async def test_stream_thinking_block(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(thinking_reply("Let me think about it.", "42", output_tokens=30))
    events = await _events(_adapter(http, fake.url), _ask("answer?"))
    thinking = "".join(e.text for e in events if isinstance(e, BlockDelta) and e.index == 0)
    assert thinking == "Let me think about it."
    assert [e for e in events if isinstance(e, BlockStart)] == [
        BlockStart(0, "thinking"),
        BlockStart(1, "text"),
    ]
    assert events[-1] == MessageEnd("end_turn", Usage(12, 30))


async def test_complete_tool_use_round_trip_conversation(
    fake: FakeAnthropic, http: httpx.AsyncClient
) -> None:
    """A multi-turn tool conversation with consecutive user turns (as decoded from OpenAI
    format) is accepted by the strict fake: roles alternate and tool results lead."""
    fake.enqueue(
        thinking_reply("plan", "Calling", signature="sig-abc"),
        tool_reply("get_weather", {"city": "Paris"}, id="toolu_1"),
        text_reply("It is sunny."),
    )
    adapter = _adapter(http, fake.url)
    first = await adapter.complete(_ask("weather in Paris?", tools=(WEATHER,)))
    assert first.content[0] == ThinkingBlock("plan", "sig-abc")

    second = await adapter.complete(_ask("weather in Paris?", tools=(WEATHER,)))
    assert second.stop_reason == "tool_use"
    assert second.tool_calls == [ToolUseBlock("toolu_1", "get_weather", {"city": "Paris"})]

    history = (
        Message("user", (TextBlock("weather in Paris?"),)),
        Message("user", (ImageBlock(media_type="image/png", data="iVBORw0KGgo="),)),
        Message("assistant", (*first.content, *second.content)),
        Message("user", (ToolResultBlock("toolu_1", (TextBlock("sunny"),)),)),
        Message("user", (TextBlock("and tomorrow?"),)),
    )
    third = await adapter.complete(ChatRequest(MODEL, history, tools=(WEATHER,)))
    assert third.text == "It is sunny."
    sent = fake.requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[0]["content"]] == ["text", "image"]
    assert sent[1]["content"][0] == {"type": "thinking", "thinking": "plan", "signature": "sig-abc"}
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text"]


# --- failures ---------------------------------------------------------------------------------
async def test_rate_limited_429(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(rate_limited(retry_after=7), rate_limited(retry_after=3))
    adapter = _adapter(http, fake.url)
    with pytest.raises(ProviderError) as info:
        await adapter.complete(_ask())
    err = info.value
    assert err.upstream_status == 429 and err.retry_after == 7.0 and err.retryable
    assert "per-minute rate limit" in err.message
    assert err.to_http().status_code == 429

    seen, err = await _events_until_error(adapter, _ask())
    assert seen == []
    assert err.upstream_status == 429 and err.retry_after == 3.0


async def test_overloaded_529_is_retryable(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(overloaded(), overloaded())
    adapter = _adapter(http, fake.url)
    with pytest.raises(ProviderError) as info:
        await adapter.complete(_ask())
    assert info.value.upstream_status == 529 and info.value.retryable
    assert "Overloaded" in info.value.message
    _, err = await _events_until_error(adapter, _ask())
    assert err.upstream_status == 529 and err.retryable


async def test_bad_key_401_is_not_retryable(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    with pytest.raises(ProviderError) as info:
        await _adapter(http, fake.url, api_key="sk-ant-wrong").complete(_ask())
    assert info.value.upstream_status == 401 and not info.value.retryable
    assert "invalid x-api-key" in info.value.message
    assert info.value.to_http().status_code == 502


async def test_invalid_request_400_carries_anthropics_message(
    fake: FakeAnthropic, http: httpx.AsyncClient
) -> None:
    fake.enqueue(ErrorReply(400, "invalid_request_error", "messages.0: bad thing"))
    with pytest.raises(ProviderError) as info:
        await _adapter(http, fake.url).complete(_ask())
    assert info.value.upstream_status == 400 and "messages.0: bad thing" in info.value.message


async def test_connection_refused(http: httpx.AsyncClient) -> None:
    adapter = _adapter(http, f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(ProviderError) as info:
        await adapter.complete(_ask())
    assert info.value.upstream_status == 0 and info.value.retryable
    assert info.value.code == ErrorCode.UPSTREAM_UNAVAILABLE
    _, err = await _events_until_error(adapter, _ask())
    assert err.code == ErrorCode.UPSTREAM_UNAVAILABLE


async def test_mid_stream_error_event(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(text_reply("partial answer here", chunk=4, error_after=5, id="msg_e"))
    seen, err = await _events_until_error(_adapter(http, fake.url), _ask())
    # message_start, block start, ping, two deltas were sent before the error frame
    assert seen == [
        MessageStart("msg_e", MODEL, 12),
        BlockStart(0, "text"),
        BlockDelta(0, "part"),
        BlockDelta(0, "ial "),
    ]
    assert err.upstream_status == 529 and err.retryable
    assert "overloaded_error" in err.message


async def test_mid_stream_error_event_types(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(
        text_reply("x", error_after=1, error=("invalid_request_error", "prompt is too long"))
    )
    seen, err = await _events_until_error(_adapter(http, fake.url), _ask())
    assert len(seen) == 1 and isinstance(seen[0], MessageStart)
    assert err.upstream_status == 400 and not err.retryable
    assert "prompt is too long" in err.message


async def test_mid_stream_connection_drop(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(text_reply("this answer will be cut", chunk=3, drop_after=6))
    seen, err = await _events_until_error(_adapter(http, fake.url), _ask())
    assert isinstance(seen[0], MessageStart)
    assert [e for e in seen if isinstance(e, BlockDelta)] == [
        BlockDelta(0, "thi"),
        BlockDelta(0, "s a"),
        BlockDelta(0, "nsw"),
    ]
    assert err.upstream_status == 0 and err.retryable
    assert not any(isinstance(e, MessageEnd) for e in seen)


async def test_read_timeout(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    fake.enqueue(text_reply("slow", delay_s=1.0))
    adapter = _adapter(http, fake.url, timeout_s=0.3)
    seen, err = await _events_until_error(adapter, _ask())
    assert seen == []
    assert err.code == ErrorCode.UPSTREAM_TIMEOUT and err.retryable


# --- probe ------------------------------------------------------------------------------------
async def test_probe_ok(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    await _adapter(http, fake.url).probe()
    (sent,) = fake.requests
    assert sent.method == "GET" and sent.path == "/v1/models"
    assert sent.headers["x-api-key"] == "sk-ant-fake-key"
    assert sent.headers["anthropic-version"] == "2023-06-01"


async def test_probe_failures(fake: FakeAnthropic, http: httpx.AsyncClient) -> None:
    with pytest.raises(ProviderError) as info:
        await _adapter(http, fake.url, api_key="sk-ant-wrong").probe()
    assert info.value.upstream_status == 401

    fake.models_error = ErrorReply(500, "api_error", "Internal server error")
    with pytest.raises(ProviderError) as info:
        await _adapter(http, fake.url).probe()
    assert info.value.upstream_status == 500 and info.value.retryable

    with pytest.raises(ProviderError) as info:
        await _adapter(http, f"http://127.0.0.1:{_free_port()}").probe()
    assert info.value.code == ErrorCode.UPSTREAM_UNAVAILABLE


# --- the fake itself, cross-checked with the official SDK -------------------------------------
async def test_fake_stream_parses_with_the_anthropic_sdk(fake: FakeAnthropic) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=fake.url, api_key=fake.api_key, max_retries=0
    ) as client:
        await _sdk_checks(fake, client)


async def _sdk_checks(fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    fake.enqueue(
        Reply(
            [
                {"type": "thinking", "thinking": "Consider the city.", "signature": "sig-9"},
                {"type": "text", "text": "Looking it up."},
                {
                    "type": "tool_use",
                    "id": "toolu_x",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
            stop_reason="tool_use",
            input_tokens=50,
            output_tokens=25,
            chunk=2,
        )
    )
    async with client.messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "weather?"}]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert final.stop_reason == "tool_use"
    assert final.usage.input_tokens == 50 and final.usage.output_tokens == 25
    thinking, text, tool = final.content
    assert thinking.type == "thinking" and thinking.thinking == "Consider the city."
    assert thinking.signature == "sig-9"
    assert text.type == "text" and text.text == "Looking it up."
    assert tool.type == "tool_use" and tool.input == {"city": "Oslo"}

    fake.enqueue(text_reply("plain"))
    message = await client.messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].type == "text" and message.content[0].text == "plain"

    fake.enqueue(rate_limited(retry_after=2))
    with pytest.raises(anthropic.RateLimitError) as info:
        await client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "Number of request tokens has exceeded your per-minute rate limit",
        },
        "request_id": info.value.request_id,
    }


async def test_fake_stream_bytes_and_default_echo(fake: FakeAnthropic) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{fake.url}/v1/messages",
            headers={"x-api-key": "sk-ant-fake-key", "anthropic-version": "2023-06-01"},
            json={
                "model": MODEL,
                "max_tokens": 5,
                "stream": True,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        # no script: the default reply echoes the last user text
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["request-id"].startswith("req_")
        frames = response.text.split("\n\n")
        assert frames[-1] == ""
        assert frames[2] == 'event: ping\ndata: {"type": "ping"}'
        names = [f.split("\n")[0].removeprefix("event: ") for f in frames[:-1]]
        message_id = json.loads(frames[0].split("data: ")[1])["message"]["id"]
        expected = message_events(text_reply("echo: x"), MODEL, message_id)
        assert names == [name for name, _ in expected]
        datas = [json.loads(f.split("\ndata: ")[1]) for f in frames[:-1]]
        assert datas == [data for _, data in expected]

        # strict mode rejects what the real API rejects
        bad = await client.post(
            f"{fake.url}/v1/messages",
            headers={"x-api-key": "sk-ant-fake-key", "anthropic-version": "2023-06-01"},
            json={
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            },
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        assert "roles must alternate" in bad.json()["error"]["message"]
