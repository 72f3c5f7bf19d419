"""GeminiAdapter against a real loopback server speaking the Generative Language API
(`generateContent`, `streamGenerateContent?alt=sse`)."""

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
    DocumentBlock,
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
)
from orchestrator.providers._gemini import SKIP_SIGNATURE, GeminiAdapter, gemini_schema
from tests.fakes.gemini_server import GeminiFake, GeminiTurn

KEY = "test-gemini-key"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
CLOCK = ToolDef("get_time", None, {"type": "object", "properties": {}})


@pytest.fixture
async def server() -> AsyncIterator[GeminiFake]:
    async with GeminiFake(api_key=KEY) as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def adapter(server: GeminiFake, http: httpx.AsyncClient, key: str = KEY) -> GeminiAdapter:
    config = ProviderConfig(
        "gemini", "gemini", server.base_url, api_key=key, timeout_s=10, connect_timeout_s=2
    )
    return GeminiAdapter(config, http)


def ask(text: str = "Hi", **kw: object) -> ChatRequest:
    return ChatRequest(
        model="gemini-2.0-flash", messages=(Message("user", (TextBlock(text),)),), **kw
    )


async def events_of(gemini: GeminiAdapter, request: ChatRequest) -> list[StreamEvent]:
    return [event async for event in gemini.stream(request)]


async def test_streams_thoughts_and_text_over_sse(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    server.script(
        GeminiTurn(
            parts=[{"text": "Let me think", "thought": True}, {"text": "Hel"}, {"text": "lo!"}],
            prompt_tokens=12,
            candidates_tokens=8,
            thoughts_tokens=5,
            response_id="resp-1",
        )
    )
    request = ask(system="Be brief.", max_tokens=64, temperature=0.2, top_p=0.9, stop=("END",))
    events = await events_of(adapter(server, http), request)

    assert events == [
        MessageStart("resp-1", "gemini-2.0-flash-001", 12),
        BlockStart(0, "thinking"),
        BlockDelta(0, "Let me think"),
        BlockStop(0),
        BlockStart(1, "text"),
        BlockDelta(1, "Hel"),
        BlockDelta(1, "lo!"),
        BlockStop(1),
        MessageEnd("end_turn", Usage(12, 13)),  # thinking tokens are output
    ]
    [sent] = server.generate_requests
    assert sent.method == "POST"
    assert sent.path == "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
    assert sent.query == "alt=sse"
    assert sent.headers["x-goog-api-key"] == KEY
    assert sent.headers["content-type"] == "application/json"
    assert sent.json == {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "maxOutputTokens": 64,
            "temperature": 0.2,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
    }


async def test_complete_uses_generate_content(server: GeminiFake, http: httpx.AsyncClient) -> None:
    server.script(
        GeminiTurn(
            parts=[
                {"text": "Plan", "thought": True},
                {"text": " it.", "thought": True, "thoughtSignature": "c2ln"},
                {"text": "Hel"},
                {"text": "lo!"},
            ],
            prompt_tokens=7,
            candidates_tokens=3,
            thoughts_tokens=4,
            response_id="resp-2",
        )
    )
    response = await adapter(server, http).complete(ask())
    [sent] = server.generate_requests
    assert sent.path == "/v1beta/models/gemini-2.0-flash:generateContent" and sent.query == ""
    assert response.id == "resp-2"
    assert response.model == "gemini-2.0-flash-001"
    assert response.content == (ThinkingBlock("Plan it.", "c2ln"), TextBlock("Hello!"))
    assert response.usage == Usage(7, 7)
    assert response.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("MAX_TOKENS", "max_tokens"),
        ("SAFETY", "refusal"),
        ("RECITATION", "refusal"),
        ("OTHER", "end_turn"),
    ],
)
async def test_finish_reasons(
    server: GeminiFake, http: httpx.AsyncClient, finish: str, stop: str
) -> None:
    turn = GeminiTurn(parts=[{"text": "partial"}], finish_reason=finish)
    server.script(turn, turn)
    gemini = adapter(server, http)
    assert (await gemini.complete(ask())).stop_reason == stop
    assert (await events_of(gemini, ask()))[-1] == MessageEnd(stop, Usage(12, 8))


async def test_a_blocked_prompt_is_a_refusal(server: GeminiFake, http: httpx.AsyncClient) -> None:
    turn = GeminiTurn(prompt_feedback={"blockReason": "SAFETY"}, candidates_tokens=0)
    server.script(turn, turn)
    gemini = adapter(server, http)
    response = await gemini.complete(ask())
    assert (response.content, response.stop_reason) == ((), "refusal")
    events = await events_of(gemini, ask())
    assert events[1:] == [MessageEnd("refusal", Usage(12, 0))]


async def test_a_malformed_function_call_is_a_retryable_error(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    server.script(GeminiTurn(parts=[{"text": ""}], finish_reason="MALFORMED_FUNCTION_CALL"))
    with pytest.raises(ProviderError, match="malformed function call") as info:
        await adapter(server, http).complete(ask())
    assert info.value.retryable is True


async def test_function_calls_get_ids_and_their_results_go_back_by_name(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    turn = GeminiTurn(
        parts=[
            {
                "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                "thoughtSignature": "sig-1",
            },
            {"functionCall": {"name": "get_time", "args": {}}},
        ],
        response_id="resp-tools",
    )
    server.script(turn, turn)
    gemini = adapter(server, http)
    request = ask("Weather and time?", tools=(WEATHER, CLOCK), tool_choice={"name": "get_weather"})

    events = await events_of(gemini, request)
    starts = [e for e in events if isinstance(e, BlockStart)]
    assert [(s.index, s.block_type, s.name) for s in starts] == [
        (0, "tool_use", "get_weather"),
        (1, "tool_use", "get_time"),
    ]
    ids = [s.id or "" for s in starts]
    assert ids[0].startswith("call_0_") and ids[1].startswith("call_1_")
    assert BlockDelta(0, '{"city": "Paris"}') in events
    assert events[-1] == MessageEnd("tool_use", Usage(12, 8))
    assert server.generate_requests[0].json["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "description": "City name"}},
                        "required": ["city"],
                    },
                },
                {"name": "get_time"},  # no arguments: no (empty OBJECT) parameters
            ]
        }
    ]
    assert server.generate_requests[0].json["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }

    response = await gemini.complete(request)
    assert [c.id for c in response.tool_calls] == ids  # same reply, same ids
    assert response.tool_calls[0] == ToolUseBlock(ids[0], "get_weather", {"city": "Paris"})
    assert response.stop_reason == "tool_use"

    server.script(GeminiTurn(parts=[{"text": "Sunny, and it is noon."}]))
    follow_up = ChatRequest(
        model="gemini-2.0-flash",
        messages=(
            request.messages[0],
            Message("assistant", response.content),
            Message(
                "user",
                (
                    ToolResultBlock(ids[0], (TextBlock("18C sunny"),)),
                    ToolResultBlock(ids[1], (TextBlock("clock broken"),), is_error=True),
                ),
            ),
        ),
        tools=(WEATHER, CLOCK),
        tool_choice="auto",
    )
    assert (await gemini.complete(follow_up)).text == "Sunny, and it is noon."
    sent = server.generate_requests[-1].json
    assert sent["contents"] == [
        {"role": "user", "parts": [{"text": "Weather and time?"}]},
        {
            "role": "model",
            "parts": [
                # The signature Gemini gave with the call goes back with it.
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                    "thoughtSignature": "sig-1",
                },
                {"functionCall": {"name": "get_time", "args": {}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"output": "18C sunny"}}},
                {"functionResponse": {"name": "get_time", "response": {"error": "clock broken"}}},
            ],
        },
    ]
    assert sent["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}


async def test_calls_from_another_provider_get_the_documented_placeholder_signature(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    request = ChatRequest(
        model="gemini-2.0-flash",
        messages=(
            Message("user", (TextBlock("Weather?"),)),
            Message(
                "assistant",
                (TextBlock("Checking."), ToolUseBlock("toolu_01", "get_weather", {"city": "Rome"})),
            ),
            Message("user", (ToolResultBlock("toolu_01", (TextBlock("21C"),)),)),
        ),
        tools=(WEATHER,),
        tool_choice="none",
    )
    await adapter(server, http).complete(request)
    sent = server.generate_requests[0].json
    assert sent["contents"][1] == {
        "role": "model",
        "parts": [
            {"text": "Checking."},
            {
                "functionCall": {"name": "get_weather", "args": {"city": "Rome"}},
                "thoughtSignature": SKIP_SIGNATURE,
            },
        ],
    }
    assert sent["contents"][2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"output": "21C"}}}
    ]
    assert sent["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}


async def test_a_result_for_an_unknown_call_is_a_bad_request(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    request = ChatRequest(
        model="gemini-2.0-flash",
        messages=(Message("user", (ToolResultBlock("call_nowhere", (TextBlock("x"),)),)),),
    )
    with pytest.raises(BadRequest, match="call_nowhere"):
        await adapter(server, http).complete(request)
    assert server.requests == []


def test_json_schema_is_narrowed_to_what_gemini_accepts() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Args",
        "type": "object",
        "additionalProperties": False,
        "$defs": {
            "Unit": {"type": "string", "enum": ["c", "f"], "title": "Unit"},
            "Place": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "extra": {"type": "object", "additionalProperties": True},
                },
                "required": ["name", "ghost"],
            },
        },
        "properties": {
            "unit": {"$ref": "#/$defs/Unit"},
            "place": {"allOf": [{"$ref": "#/$defs/Place"}], "description": "Where"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "count": {"type": ["integer", "null"], "minimum": 0, "exclusiveMaximum": 10},
            "mode": {"const": "fast"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "format": "uri"},
                "uniqueItems": True,
            },
            "either": {"oneOf": [{"type": "string"}, {"type": "number"}]},
        },
        "required": ["unit"],
    }
    assert gemini_schema(schema) == {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "place": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "extra": {"type": "object"}},
                "required": ["name"],
                "description": "Where",
            },
            "note": {"type": "string", "nullable": True, "default": None},
            "count": {"type": "integer", "nullable": True, "minimum": 0},
            "mode": {"type": "string", "enum": ["fast"]},
            "tags": {"type": "array", "items": {"type": "string", "format": "uri"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "number"}]},
        },
        "required": ["unit"],
    }


async def test_images_inline_and_by_uri(server: GeminiFake, http: httpx.AsyncClient) -> None:
    request = ChatRequest(
        model="gemini-2.0-flash",
        messages=(
            Message(
                "user",
                (
                    TextBlock("Compare"),
                    ImageBlock("image/png", PNG),
                    ImageBlock(url="https://example.com/cat.jpg"),
                    ImageBlock(url="data:image/webp;base64,UklGRg=="),
                ),
            ),
        ),
    )
    await adapter(server, http).complete(request)
    assert server.generate_requests[0].json["contents"][0]["parts"] == [
        {"text": "Compare"},
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
        {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/cat.jpg"}},
        {"inlineData": {"mimeType": "image/webp", "data": "UklGRg=="}},
    ]


async def test_documents_inline(server: GeminiFake, http: httpx.AsyncClient) -> None:
    """A base64 PDF is inlineData application/pdf; a plain-text document is text."""
    pdf = base64.b64encode(b"%PDF-1.4 minimal").decode()
    request = ChatRequest(
        model="gemini-2.0-flash",
        messages=(
            Message(
                "user",
                (
                    DocumentBlock(media_type="application/pdf", data=pdf),
                    DocumentBlock(media_type="text/plain", text="Notes."),
                    TextBlock("Summarise"),
                ),
            ),
        ),
        params={"document": ("base64", "text")},
    )
    await adapter(server, http).complete(request)
    assert server.generate_requests[0].json["contents"][0]["parts"] == [
        {"inlineData": {"mimeType": "application/pdf", "data": pdf}},
        {"text": "Notes."},
        {"text": "Summarise"},
    ]


async def test_count_tokens_is_geminis_own(server: GeminiFake, http: httpx.AsyncClient) -> None:
    server.token_count = 321
    request = ask("How many?", system="Be brief.")
    assert await adapter(server, http).count_tokens(request) == 321
    sent = server.requests[-1]
    assert sent.path.endswith("/models/gemini-2.0-flash:countTokens") and server.violations == []
    inner = sent.json["generateContentRequest"]
    assert inner["model"] == "models/gemini-2.0-flash"
    assert inner["systemInstruction"] == {"parts": [{"text": "Be brief."}]}


async def test_rate_limit_reads_retry_info_and_a_retry_succeeds(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    server.script(GeminiTurn.rate_limited("37s"), GeminiTurn(parts=[{"text": "done"}]))
    gemini = adapter(server, http)
    with pytest.raises(ProviderError) as info:
        await gemini.complete(ask())
    err = info.value
    assert (err.upstream_status, err.retryable, err.retry_after) == (429, True, 37.0)
    assert err.message.startswith("gemini: RESOURCE_EXHAUSTED: You exceeded your current quota")
    assert err.to_http().status_code == 429
    assert (await gemini.complete(ask())).text == "done"


@pytest.mark.parametrize(
    ("status", "message", "retryable", "http_status"),
    [
        (400, "Invalid value at 'contents[0].role'", False, 400),
        (404, "models/nope is not found for API version v1beta", False, 404),
        (500, "An internal error has occurred. Please retry or report.", True, 502),
        (503, "The model is overloaded. Please try again later.", True, 502),
    ],
)
async def test_error_statuses(
    server: GeminiFake,
    http: httpx.AsyncClient,
    status: int,
    message: str,
    retryable: bool,
    http_status: int,
) -> None:
    server.script(GeminiTurn.failing(status, message), GeminiTurn.failing(status, message))
    gemini = adapter(server, http)
    with pytest.raises(ProviderError) as info:
        await gemini.complete(ask())
    assert info.value.upstream_status == status
    assert info.value.retryable is retryable
    assert message in info.value.message
    assert info.value.to_http().status_code == http_status
    with pytest.raises(ProviderError) as streamed:
        await anext(gemini.stream(ask()))
    assert streamed.value.upstream_status == status


async def test_a_bad_key_is_our_problem_not_the_callers(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    with pytest.raises(ProviderError) as info:
        await adapter(server, http, key="wrong").complete(ask())
    assert info.value.upstream_status == 401  # Gemini's 400 API_KEY_INVALID
    assert "API key not valid" in info.value.message
    assert info.value.to_http().status_code == 502
    assert server.requests[-1].headers["x-goog-api-key"] == "wrong"


async def test_failures_mid_stream_raise_from_the_iterator(
    server: GeminiFake, http: httpx.AsyncClient
) -> None:
    parts = [{"text": "one "}, {"text": "two "}, {"text": "three"}]
    server.script(GeminiTurn(parts=parts, fail_after=2), GeminiTurn(parts=parts, error_after=1))
    gemini = adapter(server, http)
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as dropped:
        async for event in gemini.stream(ask()):
            seen.append(event)
    assert [e for e in seen if isinstance(e, BlockDelta)] == [
        BlockDelta(0, "one "),
        BlockDelta(0, "two "),
    ]
    assert dropped.value.retryable is True
    seen.clear()
    with pytest.raises(ProviderError, match="INTERNAL: An internal error") as errored:
        async for event in gemini.stream(ask()):
            seen.append(event)
    assert [e for e in seen if isinstance(e, BlockDelta)] == [BlockDelta(0, "one ")]
    assert errored.value.upstream_status == 500


async def test_probe(server: GeminiFake, http: httpx.AsyncClient) -> None:
    await adapter(server, http).probe()
    probe = server.requests[-1]
    assert (probe.method, probe.path, probe.headers["x-goog-api-key"]) == (
        "GET",
        "/v1beta/models",
        KEY,
    )
    with pytest.raises(ProviderError) as info:
        await adapter(server, http, key="wrong").probe()
    assert info.value.upstream_status == 401
    server.models_status = 500
    with pytest.raises(ProviderError) as failed:
        await adapter(server, http).probe()
    assert failed.value.upstream_status == 500


async def test_probe_of_a_server_that_is_not_there(http: httpx.AsyncClient) -> None:
    async with GeminiFake() as fake:
        url = fake.base_url
    config = ProviderConfig("gemini", "gemini", url, api_key=KEY, connect_timeout_s=1)
    with pytest.raises(ProviderError) as info:
        await GeminiAdapter(config, http).probe()
    assert info.value.code == "upstream_unavailable"
