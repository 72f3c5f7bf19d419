"""The Anthropic Messages wire format: request/response codecs and the SSE event codecs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.errors import BadRequest, ValidationFailed
from orchestrator.providers import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatRequest,
    ChatResponse,
    ImageBlock,
    Message,
    MessageEnd,
    MessageStart,
    ProviderError,
    RedactedThinkingBlock,
    StreamAssembler,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.providers._anthropic_format import (
    PING,
    EventDecoder,
    EventEncoder,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_body,
    error_event,
    sse_event,
)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"

FULL_REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these images, and the weather?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
                {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Need the weather.", "signature": "sig-1"},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "content": [{"type": "text", "text": "clock broken"}],
                    "is_error": True,
                },
            ],
        },
    ],
    "tools": [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "temperature": 0.2,
    "top_p": 0.9,
    "stop_sequences": ["STOP"],
    "stream": True,
    "metadata": {"user_id": "user-42"},
}


# --- decode_request ---------------------------------------------------------------------------
def test_decode_request_reads_every_field() -> None:
    req = decode_request(FULL_REQUEST)
    assert req.model == "claude-sonnet-4-5"
    assert req.max_tokens == 1024
    assert req.system == "You are terse.\n\nUse tools."
    assert req.temperature == 0.2 and req.top_p == 0.9
    assert req.stop == ("STOP",)
    assert req.stream is True
    assert req.user == "user-42"
    assert req.tool_choice == {"name": "get_weather"}
    assert req.tools == (
        ToolDef(
            "get_weather",
            "Weather for a city",
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        ),
        ToolDef("get_time", None, {"type": "object", "properties": {}}),
    )
    user, assistant, results = req.messages
    assert user == Message(
        "user",
        (
            TextBlock("What is in these images, and the weather?"),
            ImageBlock(media_type="image/png", data=PNG),
            ImageBlock(url="https://x.test/cat.jpg"),
        ),
    )
    # redacted_thinking is kept for an Anthropic-format upstream (the others skip it)
    assert assistant == Message(
        "assistant",
        (
            ThinkingBlock("Need the weather.", "sig-1"),
            RedactedThinkingBlock("EmwKAhgBEgy3va3pzix"),
            TextBlock("Let me check."),
            ToolUseBlock("toolu_01", "get_weather", {"city": "Paris"}),
            ToolUseBlock("toolu_02", "get_time", {}),
        ),
    )
    assert results == Message(
        "user",
        (
            ToolResultBlock("toolu_01", (TextBlock("18C, sunny"),)),
            ToolResultBlock("toolu_02", (TextBlock("clock broken"),), is_error=True),
        ),
    )


def test_decode_request_string_content_and_defaults() -> None:
    req = decode_request(
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 5,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi"}],
        }
    )
    assert req == ChatRequest(
        model="claude-haiku-4-5",
        messages=(Message("user", (TextBlock("Hi"),)),),
        system="Be brief.",
        max_tokens=5,
    )


@pytest.mark.parametrize(
    ("choice", "expected"),
    [({"type": "auto"}, "auto"), ({"type": "any"}, "any"), ({"type": "none"}, "none")],
)
def test_decode_tool_choice_kinds(choice: dict[str, str], expected: str) -> None:
    body = {**FULL_REQUEST, "tool_choice": choice}
    assert decode_request(body).tool_choice == expected


def _bad(body: dict[str, Any], field: str) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as info:
        decode_request(body)
    err = info.value
    assert isinstance(err, BadRequest) and err.status_code == 400
    assert err.extra["fields"][0]["field"] == field, err.message
    assert field in err.message
    return err


def _with_message(content: Any, role: str = "user") -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": [{"role": role, "content": content}]}


def test_validation_errors_name_the_field() -> None:
    base = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    err = _bad({"model": "m", "messages": base["messages"]}, "max_tokens")
    assert "required" in err.message
    _bad({**base, "max_tokens": -1}, "max_tokens")
    _bad({**base, "max_tokens": "10"}, "max_tokens")
    _bad({**base, "model": 3}, "model")
    _bad({**base, "messages": []}, "messages")
    _bad({**base, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role")
    _bad({**base, "messages": [{"role": "user", "content": 5}]}, "messages.0.content")
    _bad({**base, "temperature": 1.5}, "temperature")
    _bad({**base, "top_p": "high"}, "top_p")
    _bad({**base, "stream": "yes"}, "stream")
    _bad({**base, "stop_sequences": "STOP"}, "stop_sequences")
    _bad({**base, "system": [{"type": "image"}]}, "system.0.type")
    _bad({**base, "tools": [{"name": "t"}]}, "tools.0.input_schema")
    _bad({**base, "tools": [{"type": 7, "name": "web_search"}]}, "tools.0.type")
    _bad({**base, "thinking": {"type": "sometimes"}}, "thinking.type")
    _bad({**base, "output_config": {"effort": "extreme"}}, "output_config.effort")
    _bad({**base, "unknown_field": 1}, "unknown_field")
    _bad(
        _with_message([{"type": "text", "text": "x", "cache_control": {}}]),
        "messages.0.content.0.cache_control.type",
    )
    _bad({**base, "tool_choice": {"type": "tool"}}, "tool_choice.name")
    _bad({**base, "tool_choice": {"type": "some"}}, "tool_choice.type")
    _bad({**base, "metadata": {"user_id": 7}}, "metadata.user_id")
    _bad(_with_message([{"type": "document", "source": {}}]), "messages.0.content.0.source.type")
    _bad(_with_message([{"type": "mystery"}]), "messages.0.content.0.type")
    _bad(
        _with_message([{"type": "image", "source": {"type": "base64", "data": PNG}}]),
        "messages.0.content.0.source.media_type",
    )
    _bad(
        _with_message([{"type": "image", "source": {"type": "s3", "file_id": "f"}}]),
        "messages.0.content.0.source.type",
    )
    _bad(
        _with_message([{"type": "tool_use", "id": "t1", "name": "f", "input": []}], "assistant"),
        "messages.0.content.0.input",
    )
    _bad(
        _with_message([{"type": "tool_result", "tool_use_id": "t1", "is_error": "no"}]),
        "messages.0.content.0.is_error",
    )
    _bad(
        _with_message([{"type": "tool_result", "content": "x"}]),
        "messages.0.content.0.tool_use_id",
    )
    _bad(
        _with_message([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "x"}]}]),
        "messages.0.content.0.content.0.type",
    )
    _bad([], "body")  # type: ignore[arg-type]


def test_missing_model_is_left_to_the_default() -> None:
    req = decode_request({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]})
    assert req.model == ""


# --- encode_response / EventEncoder -----------------------------------------------------------
def test_encode_response_is_an_exact_message_object() -> None:
    resp = ChatResponse(
        id="chatcmpl-abc",
        model="gpt-4o",
        content=(
            ThinkingBlock("hmm"),
            TextBlock("Checking."),
            ToolUseBlock("call_1", "get_weather", {"city": "Paris"}),
        ),
        stop_reason="tool_use",
        usage=Usage(11, 22),
    )
    assert encode_response(resp, "claude-sonnet-4-5") == {
        "id": "msg_chatcmpl-abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 11,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 22,
        },
    }
    anthropic_id = ChatResponse("msg_01X", "m", (TextBlock("hi"),), "end_turn", Usage(1, 1))
    assert encode_response(anthropic_id, "m")["id"] == "msg_01X"
    assert encode_response(ChatResponse("", "m", (), "end_turn", Usage()), "m")["id"].startswith(
        "msg_"
    )


def test_event_encoder_exact_sequence_for_text_and_tool_use() -> None:
    events = [
        MessageStart("msg_1", "upstream-model", input_tokens=25),
        BlockStart(0, "text"),
        BlockDelta(0, "Hello"),
        BlockDelta(0, ""),  # nothing to say: no frame
        BlockDelta(0, " there"),
        BlockStop(0),
        BlockStart(1, "tool_use", "toolu_9", "get_weather"),
        BlockDelta(1, '{"city": '),
        BlockDelta(1, '"Par'),
        BlockDelta(1, 'is"}'),
        BlockStop(1),
        MessageEnd("tool_use", Usage(25, 40)),
    ]
    encoder = EventEncoder("claude-sonnet-4-5")
    out = [pair for e in events for pair in encoder.feed(e)]
    assert out == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 25,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                        "output_tokens": 0,
                    },
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hello"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " there"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_9",
                    "name": "get_weather",
                    "input": {},
                },
            },
        ),
        *[
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": fragment},
                },
            )
            for fragment in ('{"city": ', '"Par', 'is"}')
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {
                    "input_tokens": 25,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 40,
                },
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_event_encoder_thinking_block_and_sse_framing() -> None:
    encoder = EventEncoder("m")
    assert encoder.feed(BlockStart(0, "thinking")) == [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        )
    ]
    assert encoder.encode(BlockDelta(0, "Let me think")) == (
        b"event: content_block_delta\n"
        b'data: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"thinking_delta","thinking":"Let me think"}}\n\n'
    )
    assert sse_event("message_stop", {"type": "message_stop"}) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert sse_event("x", {"t": "caf\u00e9"}) == 'event: x\ndata: {"t":"café"}\n\n'.encode()
    assert PING == b'event: ping\ndata: {"type": "ping"}\n\n'


def test_error_body_and_error_event() -> None:
    assert error_body(429, "slow down", request_id="req_1") == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
        "request_id": "req_1",
    }
    assert error_body(400, "bad")["error"]["type"] == "invalid_request_error"
    assert error_body(401, "who")["error"]["type"] == "authentication_error"
    assert error_body(404, "where")["error"]["type"] == "not_found_error"
    assert error_body(413, "big")["error"]["type"] == "request_too_large"
    assert error_body(502, "upstream")["error"]["type"] == "api_error"
    assert error_body(529, "busy")["error"]["type"] == "overloaded_error"

    frame = error_event(ProviderError.from_status("anthropic", 529, "Overloaded"))
    name, data = frame.decode().split("\n")[:2]
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "anthropic: Overloaded"},
    }
    # our key rejected upstream is not the caller's auth problem: a 502 api_error
    frame = error_event(ProviderError.from_status("anthropic", 401, "invalid x-api-key"))
    assert json.loads(frame.decode().split("data: ")[1])["error"]["type"] == "api_error"
    frame = error_event(ProviderError.from_status("openai", 429, "quota", retry_after=3))
    assert json.loads(frame.decode().split("data: ")[1])["error"]["type"] == "rate_limit_error"
    frame = error_event(ProviderError.timeout("openai"))
    assert json.loads(frame.decode().split("data: ")[1])["error"]["type"] == "timeout_error"


# --- encode_request ---------------------------------------------------------------------------
def test_encode_request_round_trips_a_decoded_request() -> None:
    body = encode_request(decode_request(FULL_REQUEST), stream=True)
    expected_messages = [
        FULL_REQUEST["messages"][0],
        FULL_REQUEST["messages"][1],  # redacted thinking included
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "18C, sunny"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "content": [{"type": "text", "text": "clock broken"}],
                    "is_error": True,
                },
            ],
        },
    ]
    assert body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "messages": expected_messages,
        "system": FULL_REQUEST["system"],  # with its cache breakpoint
        "tools": FULL_REQUEST["tools"],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["STOP"],
        "metadata": {"user_id": "user-42"},
        "stream": True,
    }
    # and decoding what we send gives the same conversation back
    again = decode_request(body)
    assert again.messages == decode_request(FULL_REQUEST).messages


def test_encode_request_fits_a_foreign_conversation_to_anthropic_rules() -> None:
    req = ChatRequest(
        model="gpt-4o",
        messages=(
            Message("user", (TextBlock("weather?"),)),
            Message("user", (ImageBlock(url="data:image/jpeg;base64,QUJD"),)),
            Message(
                "assistant",
                (
                    ThinkingBlock("deepseek reasoning, unsigned"),
                    TextBlock(""),
                    ToolUseBlock("call_1", "get_weather", {"city": "Paris"}),
                ),
            ),
            # an OpenAI `tool` message and the next user message both decode to user turns
            Message("user", (ToolResultBlock("call_1", (TextBlock("sunny"),)),)),
            Message("user", (TextBlock("thanks"), ToolResultBlock("call_2", ()))),
            Message("assistant", (TextBlock(""),)),
        ),
        tools=(ToolDef("get_weather", None, {}),),
        tool_choice="any",
    )
    body = encode_request(req, stream=False, model="claude-haiku-4-5")
    assert body == {
        "model": "claude-haiku-4-5",
        "max_tokens": 4096,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "weather?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": [{"type": "text", "text": "sunny"}],
                    },
                    {"type": "tool_result", "tool_use_id": "call_2"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}],
        "tool_choice": {"type": "any"},
    }


def test_encode_request_leaves_tool_choice_out_without_tools() -> None:
    req = ChatRequest("m", (Message("user", (TextBlock("x"),)),), tool_choice="none")
    assert "tool_choice" not in encode_request(req, stream=False)


# --- decode_response --------------------------------------------------------------------------
def test_decode_response_reads_a_message() -> None:
    body = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "thinking", "thinking": "plan", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 10,
            "cache_creation_input_tokens": 3,
            "cache_read_input_tokens": 5,
            "output_tokens": 7,
            "service_tier": "standard",
        },
    }
    assert decode_response(body, "anthropic") == ChatResponse(
        id="msg_01",
        model="claude-sonnet-4-5-20250929",
        content=(
            ThinkingBlock("plan", "sig"),
            RedactedThinkingBlock("xyz"),
            TextBlock("Calling."),
            ToolUseBlock("toolu_1", "f", {"a": 1}),
        ),
        stop_reason="tool_use",
        usage=Usage(18, 7, cache_creation_input_tokens=3, cache_read_input_tokens=5),
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("refusal", "refusal"),
        ("pause_turn", "end_turn"),
        ("model_context_window_exceeded", "max_tokens"),
        (None, "end_turn"),
    ],
)
def test_decode_response_stop_reasons(raw: str | None, expected: str) -> None:
    body = {"id": "m", "content": [], "stop_reason": raw, "usage": {}}
    assert decode_response(body, "anthropic").stop_reason == expected


def test_decode_response_rejects_a_malformed_body() -> None:
    with pytest.raises(ProviderError) as info:
        decode_response({"type": "message"}, "anthropic")
    assert info.value.upstream_status == 200 and "malformed" in info.value.message


# --- EventDecoder -----------------------------------------------------------------------------
def _sse(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(name, json.dumps(data)) for name, data in events]


UPSTREAM = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_abc",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 30,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 2,
                    "output_tokens": 1,
                },
            },
        },
    ),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
    ),
    ("ping", {"type": "ping"}),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "hm"},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "s"},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "xyz"},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_7",
                "name": "get_weather",
                "input": {},
            },
        },
    ),
    *[
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": fragment},
            },
        )
        for fragment in ("", '{"ci', 'ty": "Pa', "ris", '", "days"', ": 3", "}")
    ],
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 55},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]


def test_event_decoder_fragmented_tool_input_and_usage() -> None:
    decoder = EventDecoder("anthropic")
    out = [e for name, data in _sse(UPSTREAM) for e in decoder.feed(name, data)]
    decoder.finish()
    assert out == [
        MessageStart("msg_abc", "claude-sonnet-4-5", 32, cache_read_input_tokens=2),
        BlockStart(0, "thinking"),
        BlockDelta(0, "hm"),
        BlockStop(0, signature="s"),  # the signature_delta, with the block's end
        BlockStart(1, "redacted_thinking", data="xyz"),  # whole at its start
        BlockStop(1),
        BlockStart(2, "tool_use", "toolu_7", "get_weather"),
        BlockDelta(2, '{"ci'),
        BlockDelta(2, 'ty": "Pa'),
        BlockDelta(2, "ris"),
        BlockDelta(2, '", "days"'),
        BlockDelta(2, ": 3"),
        BlockDelta(2, "}"),
        BlockStop(2),
        MessageEnd("tool_use", Usage(32, 55, cache_read_input_tokens=2)),
    ]
    assembler = StreamAssembler()
    for event in out:
        assembler.feed(event)
    assert assembler.result().tool_calls == [
        ToolUseBlock("toolu_7", "get_weather", {"city": "Paris", "days": 3})
    ]


def test_event_decoder_cumulative_input_in_message_delta() -> None:
    decoder = EventDecoder("anthropic")
    events = [
        UPSTREAM[0],
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"input_tokens": 40, "output_tokens": 9},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    out = [e for name, data in _sse(events) for e in decoder.feed(name, data)]
    assert out[-1] == MessageEnd("end_turn", Usage(42, 9, cache_read_input_tokens=2))


def test_event_decoder_requires_message_stop() -> None:
    decoder = EventDecoder("anthropic")
    for name, data in _sse(UPSTREAM[:4]):
        decoder.feed(name, data)
    with pytest.raises(ProviderError) as info:
        decoder.finish()
    assert info.value.upstream_status == 0 and info.value.retryable


@pytest.mark.parametrize(
    ("error_type", "status", "retryable"),
    [
        ("overloaded_error", 529, True),
        ("rate_limit_error", 429, True),
        ("api_error", 500, True),
        ("invalid_request_error", 400, False),
        ("authentication_error", 401, False),
        ("permission_error", 403, False),
        ("not_found_error", 404, False),
        ("request_too_large", 413, False),
    ],
)
def test_event_decoder_error_event_mapping(error_type: str, status: int, retryable: bool) -> None:
    decoder = EventDecoder("anthropic")
    decoder.feed(*_sse(UPSTREAM[:1])[0])
    payload = {"type": "error", "error": {"type": error_type, "message": "boom"}}
    with pytest.raises(ProviderError) as info:
        decoder.feed("error", json.dumps(payload))
    err = info.value
    assert err.upstream_status == status
    assert err.retryable is retryable
    assert err.provider == "anthropic"
    assert "boom" in err.message and error_type in err.message


def test_event_decoder_rejects_garbage() -> None:
    with pytest.raises(ProviderError) as info:
        EventDecoder("anthropic").feed("message_start", "{not json")
    assert "not JSON" in info.value.message


def test_encoder_output_decodes_to_the_same_events() -> None:
    events = [
        MessageStart("msg_1", "m", 7),
        BlockStart(0, "thinking"),
        BlockDelta(0, "why"),
        BlockStop(0),
        BlockStart(1, "text"),
        BlockDelta(1, "because"),
        BlockStop(1),
        BlockStart(2, "tool_use", "toolu_1", "f"),
        BlockDelta(2, '{"x": 1}'),
        BlockStop(2),
        MessageEnd("tool_use", Usage(7, 8)),
    ]
    encoder, decoder = EventEncoder("m"), EventDecoder("anthropic")
    decoded = [
        out
        for event in events
        for name, data in encoder.feed(event)
        for out in decoder.feed(name, json.dumps(data))
    ]
    decoder.finish()
    assert decoded == events
