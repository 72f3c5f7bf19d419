"""OllamaAdapter against a real loopback server speaking Ollama's `/api/chat` (NDJSON)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import pytest

from orchestrator.errors import BadRequest
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
    Usage,
    collect,
)
from orchestrator.providers._ollama import OllamaAdapter
from tests.fakes.ollama_server import OllamaFake, OllamaTurn

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
async def server() -> AsyncIterator[OllamaFake]:
    async with OllamaFake() as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def adapter(server: OllamaFake, http: httpx.AsyncClient, **kw: object) -> OllamaAdapter:
    config = ProviderConfig(
        name="ollama", kind="ollama", base_url=server.url, timeout_s=10, connect_timeout_s=2, **kw
    )
    return OllamaAdapter(config, http)


def ask(text: str = "Hi", **kw: object) -> ChatRequest:
    return ChatRequest(model="llama3.2", messages=(Message("user", (TextBlock(text),)),), **kw)


async def events_of(adapter: OllamaAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [event async for event in adapter.stream(request)]


async def test_streams_thinking_then_text_with_exact_usage(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    server.script(
        OllamaTurn(content="Hello there", thinking="Hmm, ok", prompt_eval_count=26, eval_count=9)
    )
    request = ask(system="Be brief.", temperature=0.2, top_p=0.9, max_tokens=64, stop=("\n\n",))
    events = await events_of(adapter(server, http), request)

    assert isinstance(events[0], MessageStart) and events[0].model == "llama3.2"
    assert events[1:] == [
        BlockStart(0, "thinking"),
        BlockDelta(0, "Hmm,"),
        BlockDelta(0, " ok"),
        BlockStop(0),
        BlockStart(1, "text"),
        BlockDelta(1, "Hell"),
        BlockDelta(1, "o th"),
        BlockDelta(1, "ere"),
        BlockStop(1),
        MessageEnd("end_turn", Usage(26, 9)),
    ]
    [sent] = server.chat_requests
    assert sent.json == {
        "model": "llama3.2",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "stream": True,
        "options": {"temperature": 0.2, "top_p": 0.9, "num_predict": 64, "stop": ["\n\n"]},
    }
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers


async def test_complete_uses_the_non_streaming_answer(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    server.script(
        OllamaTurn(content="Hello there", thinking="Hmm", prompt_eval_count=5, eval_count=3)
    )
    response = await adapter(server, http).complete(ask())

    assert server.chat_requests[0].json["stream"] is False
    assert response.content == (ThinkingBlock("Hmm"), TextBlock("Hello there"))
    assert response.model == "llama3.2"
    assert response.stop_reason == "end_turn"
    assert response.usage == Usage(5, 3)
    assert response.id.startswith("ollama-")


async def test_length_is_max_tokens(server: OllamaFake, http: httpx.AsyncClient) -> None:
    server.script(
        OllamaTurn(content="cut", done_reason="length"),
        OllamaTurn(content="cut", done_reason="length"),
    )
    ollama = adapter(server, http)
    assert (await ollama.complete(ask())).stop_reason == "max_tokens"
    events = await events_of(ollama, ask())
    assert events[-1] == MessageEnd("max_tokens", Usage(26, 9))


async def test_tool_calls_get_stable_ids_and_round_trip(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    turn = OllamaTurn(
        tool_calls=[
            {"name": "get_weather", "arguments": {"city": "Paris"}},
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
        ],
        prompt_eval_count=40,
        eval_count=20,
    )
    server.script(turn, turn)
    ollama = adapter(server, http)
    request = ask("Weather in Paris and Oslo?", tools=(WEATHER,), tool_choice="auto")

    events = await events_of(ollama, request)
    starts = [e for e in events if isinstance(e, BlockStart)]
    assert [(s.index, s.block_type, s.name) for s in starts] == [
        (0, "tool_use", "get_weather"),
        (1, "tool_use", "get_weather"),
    ]
    ids = [s.id or "" for s in starts]
    assert ids[0].startswith("call_0_") and ids[1].startswith("call_1_") and ids[0] != ids[1]
    assert BlockDelta(0, '{"city": "Paris"}') in events
    assert events[-1] == MessageEnd("tool_use", Usage(40, 20))
    assert server.chat_requests[0].json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER.parameters,
            },
        }
    ]

    # The same reply answered non-streaming: the same ids, the same calls.
    response = await ollama.complete(request)
    assert [c.id for c in response.tool_calls] == ids
    assert response.tool_calls[0].input == {"city": "Paris"}
    assert response.stop_reason == "tool_use"
    assembled = await collect(_replay(events))
    assert (assembled.content, assembled.stop_reason, assembled.usage) == (
        response.content,
        "tool_use",
        Usage(40, 20),
    )

    # The results go back as role "tool" messages naming the function.
    server.script(OllamaTurn(content="Sunny in Paris, rain in Oslo."))
    follow_up = ChatRequest(
        model="llama3.2",
        messages=(
            request.messages[0],
            Message("assistant", tuple(response.content)),
            Message(
                "user",
                (
                    ToolResultBlock(ids[0], (TextBlock("18C sunny"),)),
                    ToolResultBlock(ids[1], (TextBlock("no data"),), is_error=True),
                ),
            ),
        ),
        tools=(WEATHER,),
    )
    answer = await ollama.complete(follow_up)
    assert answer.text == "Sunny in Paris, rain in Oslo."
    assert server.chat_requests[-1].json["messages"] == [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            ],
        },
        {"role": "tool", "content": "18C sunny", "tool_name": "get_weather"},
        {"role": "tool", "content": "Error: no data", "tool_name": "get_weather"},
    ]


async def _replay(events: list[StreamEvent]) -> AsyncIterator[StreamEvent]:
    for event in events:
        yield event


async def test_tool_call_ids_differ_between_replies(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    server.script(
        OllamaTurn(tool_calls=[call], created_at="2025-01-01T00:00:00.000001Z"),
        OllamaTurn(tool_calls=[call], created_at="2025-01-01T00:00:09.000001Z"),
    )
    ollama = adapter(server, http)
    first = await ollama.complete(ask(tools=(WEATHER,)))
    second = await ollama.complete(ask(tools=(WEATHER,)))
    assert first.tool_calls[0].id != second.tool_calls[0].id


async def test_tool_choice_none_offers_no_tools(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    await adapter(server, http).complete(ask(tools=(WEATHER,), tool_choice="none"))
    assert "tools" not in server.chat_requests[0].json


async def test_images_go_inline_as_base64(server: OllamaFake, http: httpx.AsyncClient) -> None:
    raw_gif = "data:image/gif;base64," + base64.b64encode(b"GIF89a").decode()
    request = ChatRequest(
        model="llava:7b",
        messages=(
            Message(
                "user",
                (TextBlock("What is this?"), ImageBlock("image/png", PNG), ImageBlock(url=raw_gif)),
            ),
        ),
    )
    await adapter(server, http).complete(request)
    assert server.chat_requests[0].json["messages"] == [
        {
            "role": "user",
            "content": "What is this?",
            "images": [PNG, base64.b64encode(b"GIF89a").decode()],
        }
    ]


async def test_a_remote_image_url_is_refused_before_any_request(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    request = ChatRequest(
        model="llava:7b",
        messages=(Message("user", (ImageBlock(url="https://example.com/cat.png"),)),),
    )
    with pytest.raises(BadRequest, match="inline"):
        await adapter(server, http).complete(request)
    assert server.requests == []


async def test_a_configured_key_is_sent_as_bearer(http: httpx.AsyncClient) -> None:
    async with OllamaFake(api_key="proxy-token") as fake:
        assert (await adapter(fake, http, api_key="proxy-token").complete(ask())).text == "echo: Hi"
        assert fake.requests[-1].headers["authorization"] == "Bearer proxy-token"
        with pytest.raises(ProviderError) as info:
            await adapter(fake, http, api_key="wrong").complete(ask())
        assert info.value.upstream_status == 401
        assert info.value.to_http().status_code == 502


async def test_rate_limit_is_retryable_and_a_retry_succeeds(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    server.script(
        OllamaTurn(status=429, error="too many requests", headers={"Retry-After": "3"}),
        OllamaTurn(content="ok now"),
    )
    ollama = adapter(server, http)
    with pytest.raises(ProviderError) as info:
        await ollama.complete(ask())
    err = info.value
    assert (err.upstream_status, err.retryable, err.retry_after) == (429, True, 3.0)
    assert err.message == "ollama: too many requests"
    assert (await ollama.complete(ask())).text == "ok now"


@pytest.mark.parametrize(
    ("status", "message", "retryable", "http_status"),
    [
        (400, "invalid options: num_predict", False, 400),
        (404, 'model "nope" not found, try pulling it first', False, 404),
        (500, "llama runner process has terminated", True, 502),
    ],
)
async def test_error_statuses_keep_their_meaning(
    server: OllamaFake,
    http: httpx.AsyncClient,
    status: int,
    message: str,
    retryable: bool,
    http_status: int,
) -> None:
    server.script(
        OllamaTurn(status=status, error=message), OllamaTurn(status=status, error=message)
    )
    ollama = adapter(server, http)
    with pytest.raises(ProviderError) as info:
        await ollama.complete(ask())
    assert info.value.upstream_status == status
    assert info.value.retryable is retryable
    assert info.value.message == f"ollama: {message}"
    assert info.value.to_http().status_code == http_status
    # The streaming call raises the same from the iterator, before any event.
    stream = ollama.stream(ask())
    with pytest.raises(ProviderError) as streamed:
        await anext(stream)
    assert streamed.value.upstream_status == status


async def test_a_dropped_connection_mid_stream_raises_from_the_iterator(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    server.script(OllamaTurn(content="a long answer that never ends", fail_after=3))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in adapter(server, http).stream(ask()):
            seen.append(event)
    assert isinstance(seen[0], MessageStart)
    assert BlockDelta(0, "a lo") in seen
    assert not any(isinstance(e, MessageEnd) for e in seen)
    assert info.value.retryable is True
    assert info.value.code == "upstream_unavailable"


async def test_an_error_line_mid_stream_raises_from_the_iterator(
    server: OllamaFake, http: httpx.AsyncClient
) -> None:
    server.script(OllamaTurn(content="partial answer", error_after=2, error="out of memory"))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError, match="out of memory"):
        async for event in adapter(server, http).stream(ask()):
            seen.append(event)
    assert [e for e in seen if isinstance(e, BlockDelta)] == [
        BlockDelta(0, "part"),
        BlockDelta(0, "ial "),
    ]


async def test_probe_and_model_listing(server: OllamaFake, http: httpx.AsyncClient) -> None:
    ollama = adapter(server, http)
    await ollama.probe()
    assert server.requests[-1].method == "GET" and server.requests[-1].path == "/api/tags"
    models = await ollama.list_models()
    assert [(m["name"], m["size"]) for m in models] == [
        ("llama3.2:latest", 1_321_098_329),
        ("llava:7b", 4_733_363_377),
    ]
    assert models[0]["details"]["parameter_size"] == "1.2B"
    server.tags_status = 503
    with pytest.raises(ProviderError) as info:
        await ollama.probe()
    assert info.value.upstream_status == 503


async def test_probe_of_a_server_that_is_not_there(http: httpx.AsyncClient) -> None:
    async with OllamaFake() as fake:
        url = fake.url
    config = ProviderConfig("ollama", "ollama", url, timeout_s=5, connect_timeout_s=1)
    with pytest.raises(ProviderError) as info:
        await OllamaAdapter(config, http).probe()
    assert info.value.code == "upstream_unavailable"
    assert info.value.retryable is True
