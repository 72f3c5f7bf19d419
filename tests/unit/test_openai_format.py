"""The OpenAI chat-completions wire format: decoding callers' requests, encoding answers and
chunks exactly as OpenAI does, and the client side (requests out, answers and chunks in)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from orchestrator.errors import ValidationFailed
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
    StopReason,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.providers._openai_format import (
    SSE_DONE,
    ChunkDecoder,
    ChunkEncoder,
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
    sse_data,
    stop_reason_of,
    wants_usage,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really-a-png").decode()
WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def user(*blocks: Any) -> Message:
    return Message("user", tuple(TextBlock(b) if isinstance(b, str) else b for b in blocks))


def assistant(*blocks: Any) -> Message:
    return Message("assistant", tuple(TextBlock(b) if isinstance(b, str) else b for b in blocks))


# --- round trips ---------------------------------------------------------------------------
ROUND_TRIPS = {
    "text": ChatRequest(
        model="gpt-4o-mini",
        messages=(user("Hello"),),
        system="Be brief.",
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
        stop=("END", "STOP"),
        stream=True,
        user="user-42",
    ),
    "images": ChatRequest(
        model="gpt-4o",
        messages=(
            user(
                "What is in these?",
                ImageBlock(media_type="image/png", data=PNG),
                ImageBlock(url="https://example.com/cat.jpg"),
            ),
        ),
    ),
    "tools": ChatRequest(
        model="gpt-4o",
        messages=(user("Weather in Paris?"),),
        tools=(WEATHER, ToolDef("noop", None, {"type": "object", "properties": {}})),
        tool_choice={"name": "get_weather"},
    ),
    "tool_choice_any": ChatRequest(
        model="gpt-4o", messages=(user("go"),), tools=(WEATHER,), tool_choice="any"
    ),
    "tool_results": ChatRequest(
        model="gpt-4o",
        messages=(
            user("Weather in Paris and Rome?"),
            assistant(
                "Checking both.",
                ToolUseBlock("call_1", "get_weather", {"city": "Paris"}),
                ToolUseBlock("call_2", "get_weather", {"city": "Rome"}),
            ),
            user(
                ToolResultBlock("call_1", (TextBlock("18C, sunny"),)),
                ToolResultBlock("call_2", (TextBlock("24C"),)),
                "Also, which is warmer?",
            ),
            assistant("Rome."),
        ),
        tools=(WEATHER,),
        tool_choice="auto",
    ),
    "multi_turn": ChatRequest(
        model="gpt-4o",
        messages=(
            user("Hi"),
            assistant("Hello! How can I help?"),
            user("Call a tool"),
            assistant(ToolUseBlock("call_9", "noop", {})),
            user(ToolResultBlock("call_9", ())),
            assistant("Done."),
            user("Thanks", "and bye"),
        ),
        tools=(ToolDef("noop", "does nothing", {"type": "object", "properties": {}}),),
        tool_choice="none",
    ),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_decode_inverts_encode(name: str) -> None:
    req = ROUND_TRIPS[name]
    body = encode_request(req, stream=req.stream, include_usage=False)
    assert json.loads(json.dumps(body)) == body  # plain JSON
    assert decode_request(body) == req


def test_thinking_round_trips_when_kept_and_is_dropped_by_default() -> None:
    req = ChatRequest(
        model="deepseek-reasoner",
        messages=(user("2+2?"), assistant(ThinkingBlock("Add them."), "4"), user("3+3?")),
    )
    assert decode_request(encode_request(req, stream=False, reasoning="keep")) == req
    body = encode_request(req, stream=False)
    assert body["messages"][1] == {"role": "assistant", "content": "4"}


def test_tool_turns_policy_sends_reasoning_only_for_turns_that_called_tools() -> None:
    req = ChatRequest(
        model="deepseek-chat",
        messages=(
            user("plain question"),
            assistant(ThinkingBlock("think 1"), "plain answer"),
            user("use a tool"),
            assistant(ThinkingBlock("think 2"), ToolUseBlock("c1", "noop", {})),
            user(ToolResultBlock("c1", (TextBlock("ok"),))),
            assistant(ThinkingBlock("think 3"), "done"),
            user("next"),
        ),
    )
    body = encode_request(req, stream=False, reasoning="tool_turns")
    sent = [m.get("reasoning_content") for m in body["messages"] if m["role"] == "assistant"]
    assert sent == [None, "think 2", "think 3"]


def test_encode_request_wire_shape() -> None:
    req = ROUND_TRIPS["tool_results"]
    body = encode_request(req, stream=True, max_tokens_field="max_completion_tokens")
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][1] == {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    }
    assert body["messages"][2:5] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "24C"},
        {"role": "user", "content": "Also, which is warmer?"},
    ]
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": WEATHER.parameters,
        },
    }
    only_calls = encode_request(
        ChatRequest("m", (assistant(ToolUseBlock("c", "noop", {})),), max_tokens=5),
        stream=False,
        max_tokens_field="max_completion_tokens",
    )
    assert only_calls["messages"][0]["content"] is None
    assert only_calls["max_completion_tokens"] == 5 and "stream_options" not in only_calls


def test_images_in_tool_results_follow_as_a_user_message() -> None:
    image = ImageBlock(media_type="image/jpeg", data=PNG)
    req = ChatRequest("m", (user(ToolResultBlock("c1", (TextBlock("see image"), image))),))
    assert encode_request(req, stream=False)["messages"] == [
        {"role": "tool", "tool_call_id": "c1", "content": "see image"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{PNG}"}}
            ],
        },
    ]


# --- decoding callers' requests ------------------------------------------------------------
def test_decode_request_from_an_openai_body() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Rule one."},
            {"role": "developer", "content": [{"type": "text", "text": "Rule two."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "need the tool",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "cold"},
            {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "x"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        "tool_choice": "required",
        "max_completion_tokens": 100,
        "stop": "\n\n",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = decode_request(body)
    assert req.system == "Rule one.\n\nRule two."
    assert req.messages == (
        user("Look:", ImageBlock(media_type="image/png", data=PNG)),
        assistant(
            ThinkingBlock("need the tool"), ToolUseBlock("call_a", "get_weather", {"city": "Oslo"})
        ),
        user(
            ToolResultBlock("call_a", (TextBlock("cold"),)),
            ToolResultBlock("call_b", (TextBlock("x"),)),
        ),
    )
    assert req.tools == (ToolDef("get_weather", None, {"type": "object", "properties": {}}),)
    assert (req.tool_choice, req.max_tokens, req.stop, req.stream) == ("any", 100, ("\n\n",), True)
    assert wants_usage(body)
    assert not wants_usage({**body, "stream_options": {"include_usage": False}})
    assert not wants_usage({**body, "stream": False})
    assert decode_request({**body, "max_completion_tokens": None, "max_tokens": 7}).max_tokens == 7


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "", "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m", "messages": [{"role": "system", "content": "only"}]}, "messages"),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": 42},
                ],
            },
            "messages[2].content",
        ),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}],
                    }
                ],
            },
            "messages[0].content[0].image_url.url",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}
                        ],
                    }
                ],
            },
            "messages[0].content[0].image_url.url",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "function": {"name": "f", "arguments": "{not json"}}
                        ],
                    }
                ],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
            },
            "messages[0].tool_calls[0].id",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"description": "no name"}}],
            },
            "tools[0].function.name",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "maybe"},
            "tool_choice",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
            "temperature",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": "1"}, "top_p"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
def test_invalid_requests_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        decode_request(body)
    err = info.value
    assert err.status_code == 400
    assert err.message.startswith(f"invalid request: {field}: ")
    assert err.extra["fields"][0]["field"] == field


def test_a_body_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(ValidationFailed, match="body: must be a JSON object"):
        decode_request(["not", "an", "object"])


# --- encoding answers ----------------------------------------------------------------------
def test_encode_response_text() -> None:
    resp = ChatResponse(
        "abc", "upstream-model", (TextBlock("Hi there"),), "end_turn", Usage(9, 3), created=1700
    )
    assert encode_response(resp, "gpt-4o-mini") == {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1700,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }


def test_encode_response_tool_calls_and_reasoning() -> None:
    resp = ChatResponse(
        "chatcmpl-1",
        "m",
        (ThinkingBlock("hmm"), ToolUseBlock("call_1", "get_weather", {"city": "Oslo"})),
        "tool_use",
        Usage(5, 6),
        created=1,
    )
    body = encode_response(resp, "m")
    assert body["id"] == "chatcmpl-1"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
        "reasoning_content": "hmm",
    }
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    parsed = ChatCompletion.model_validate(body)  # what the official SDK makes of it
    assert parsed.choices[0].message.tool_calls is not None
    assert parsed.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
    ],
)
def test_finish_reason_mapping(stop: StopReason, finish: str) -> None:
    resp = ChatResponse("x", "m", (TextBlock("t"),), stop, Usage())
    assert encode_response(resp, "m")["choices"][0]["finish_reason"] == finish
    chunks = ChunkEncoder("m").feed(MessageEnd(stop, Usage()))
    assert chunks[-1]["choices"][0]["finish_reason"] == finish


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        ("sensitive", "refusal"),
        (None, "end_turn"),
    ],
)
def test_upstream_finish_reason_mapping(finish: str | None, stop: StopReason) -> None:
    assert stop_reason_of(finish) == stop


def test_a_broken_generation_is_a_retryable_error() -> None:
    with pytest.raises(ProviderError) as info:
        stop_reason_of("network_error", "zhipu")
    assert info.value.retryable and info.value.provider == "zhipu"


STREAM: list[StreamEvent] = [
    MessageStart("abc", "upstream", input_tokens=12),
    BlockStart(0, "text"),
    BlockDelta(0, "Let me "),
    BlockDelta(0, "check."),
    BlockStop(0),
    BlockStart(1, "tool_use", "call_1", "get_weather"),
    BlockDelta(1, '{"city":'),
    BlockDelta(1, '"Paris"}'),
    BlockStop(1),
    BlockStart(2, "tool_use", "call_2", "get_time"),
    BlockDelta(2, "{}"),
    BlockStop(2),
    MessageEnd("tool_use", Usage(0, 20)),
]


def test_chunk_encoder_text_two_tool_calls_and_usage() -> None:
    encoder = ChunkEncoder("gpt-4o", include_usage=True, created=1700)
    chunks = [c for e in STREAM for c in encoder.feed(e)]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-abc",
            "object": "chat.completion.chunk",
            "created": 1700,
            "model": "gpt-4o",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }

    assert chunks == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me "}),
        chunk({"content": "check."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
        {
            "id": "chatcmpl-abc",
            "object": "chat.completion.chunk",
            "created": 1700,
            "model": "gpt-4o",
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32},
        },
    ]

    # The official SDK parses every chunk and accumulates the same completion.
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    final = state.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Let me check."
    assert message.tool_calls is not None
    assert [(t.id, t.function.name, t.function.arguments) for t in message.tool_calls] == [
        ("call_1", "get_weather", '{"city":"Paris"}'),
        ("call_2", "get_time", "{}"),
    ]
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None and final.usage.total_tokens == 32


def test_chunk_encoder_without_usage_and_with_reasoning() -> None:
    encoder = ChunkEncoder("m", created=5)
    events: list[StreamEvent] = [
        MessageStart("chatcmpl-z", "m"),
        BlockStart(0, "thinking"),
        BlockDelta(0, "ponder"),
        BlockStop(0),
        BlockStart(1, "text"),
        BlockDelta(1, "answer"),
        BlockStop(1),
        MessageEnd("max_tokens", Usage(1, 2)),
    ]
    chunks = [c for e in events for c in encoder.feed(e)]
    assert all("usage" not in c for c in chunks)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "ponder"},
        {"content": "answer"},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert {c["id"] for c in chunks} == {"chatcmpl-z"}


def test_sse_framing() -> None:
    assert sse_data({"a": "é", "b": [1, 2]}) == 'data: {"a":"é","b":[1,2]}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"
    assert encode_error("bad model", status=404, code="model_not_found") == {
        "error": {
            "message": "bad model",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }


# --- the client side: upstream answers -----------------------------------------------------
def test_chunk_decoder_fragmented_tool_calls_and_usage_chunk() -> None:
    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {"id": "chatcmpl-9", "model": "gpt-4o", "choices": choices, "usage": None}

    upstream = [
        chunk({"role": "assistant", "content": None}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Pa'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "function": {"name": "noop", "arguments": "{}"}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
        {**chunk(None), "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}},
    ]
    decoder = ChunkDecoder("openai")
    events = [e for c in upstream for e in decoder.feed(c)]
    assert not any(isinstance(e, MessageEnd) for e in events)  # usage may still come
    events += decoder.finish()
    assert events == [
        MessageStart("chatcmpl-9", "gpt-4o"),
        BlockStart(0, "tool_use", "call_a", "get_weather"),
        BlockDelta(0, '{"ci'),
        BlockDelta(0, 'ty": "Pa'),
        BlockDelta(0, 'ris"}'),
        BlockStop(0),
        BlockStart(1, "tool_use", "call_b", "noop"),
        BlockDelta(1, "{}"),
        BlockStop(1),
        MessageEnd("tool_use", Usage(30, 8)),
    ]


def test_chunk_decoder_reasoning_and_usage_on_the_last_choice() -> None:
    upstream = [
        {"id": "g1", "model": "glm-4.6", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"id": "g1", "choices": [{"index": 0, "delta": {"reasoning_content": "so "}}]},
        {"id": "g1", "choices": [{"index": 0, "delta": {"reasoning_content": "then"}}]},
        {"id": "g1", "choices": [{"index": 0, "delta": {"content": "Yes"}}]},
        {
            "id": "g1",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        },
    ]
    decoder = ChunkDecoder("zhipu")
    events = [e for c in upstream for e in decoder.feed(c)] + decoder.finish()
    assert events == [
        MessageStart("g1", "glm-4.6"),
        BlockStart(0, "thinking"),
        BlockDelta(0, "so "),
        BlockDelta(0, "then"),
        BlockStop(0),
        BlockStart(1, "text"),
        BlockDelta(1, "Yes"),
        BlockStop(1),
        MessageEnd("end_turn", Usage(4, 2)),
    ]


def test_chunk_decoder_round_trips_the_encoder() -> None:
    encoder = ChunkEncoder("gpt-4o", include_usage=True)
    decoder = ChunkDecoder("openai")
    events = [e for ev in STREAM for c in encoder.feed(ev) for e in decoder.feed(c)]
    events += decoder.finish()
    # The prompt tokens known at the start reach the caller in the final usage.
    end = MessageEnd("tool_use", Usage(12, 20))
    assert events == [MessageStart("chatcmpl-abc", "gpt-4o"), *STREAM[1:-1], end]


def test_chunk_decoder_errors() -> None:
    decoder = ChunkDecoder("openai")
    decoder.feed({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]})
    with pytest.raises(ProviderError) as info:
        decoder.feed({"error": {"message": "overloaded", "type": "server_error", "code": None}})
    assert "overloaded" in info.value.message and info.value.retryable

    with pytest.raises(ProviderError) as info:
        ChunkDecoder("p").feed({"error": {"message": "slow down", "code": 429}})
    assert info.value.upstream_status == 429

    truncated = ChunkDecoder("openai")
    truncated.feed({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]})
    with pytest.raises(ProviderError, match="before its finish_reason"):
        truncated.finish()
    with pytest.raises(ProviderError, match="before any chunk"):
        ChunkDecoder("openai").finish()

    interleaved = ChunkDecoder("openai")
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "{"}}
    interleaved.feed({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    interleaved.feed({"choices": [{"index": 0, "delta": {"content": "text in between"}}]})
    late = {"index": 0, "function": {"arguments": "}"}}
    with pytest.raises(ProviderError, match="malformed stream"):
        interleaved.feed({"choices": [{"index": 0, "delta": {"tool_calls": [late]}}]})


def test_decode_response() -> None:
    body = {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "created": 1712,
        "model": "deepseek-reasoner",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "It is 4.",
                    "reasoning_content": "2+2",
                    "tool_calls": [
                        {
                            "id": "call_s",
                            "type": "function",
                            "function": {"name": "calc", "arguments": '{"x": 2}'},
                        },
                        {"id": "call_o", "function": {"name": "glm", "arguments": {"y": 1}}},
                    ],
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
    }
    assert decode_response(body, "deepseek") == ChatResponse(
        "chatcmpl-7",
        "deepseek-reasoner",
        (
            ThinkingBlock("2+2"),
            TextBlock("It is 4."),
            ToolUseBlock("call_s", "calc", {"x": 2}),
            ToolUseBlock("call_o", "glm", {"y": 1}),
        ),
        "tool_use",  # a provider that says stop while calling tools
        Usage(10, 20),
        created=1712,
    )
    with pytest.raises(ProviderError, match="no choices"):
        decode_response({"id": "x", "choices": []}, "openai")
    with pytest.raises(ProviderError, match="quota"):
        decode_response({"error": {"message": "quota exceeded", "type": "x"}}, "openai")
