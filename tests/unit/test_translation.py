"""Cross-format round trips: OpenAI -> internal -> Anthropic -> internal -> OpenAI, for
requests (text, images, tools, tool results) and streams (text and tool-call argument
fragments), so a conversation can move between providers without losing anything."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.providers import StreamAssembler, StreamEvent
from orchestrator.providers import _anthropic_format as ant
from orchestrator.providers import _openai_format as oai

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5E"
    "rkJggg=="
)

OPENAI_BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 300,
    "temperature": 0.5,
    "messages": [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image, and the weather in Paris?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"tz": "CET"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, cloudy"},
        {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
        {"role": "assistant", "content": "A red dot; Paris is 18C at 14:05."},
        {"role": "user", "content": "Thanks!"},
    ],
    "tools": [
        {
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
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "Local time",
                "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
            },
        },
    ],
    "tool_choice": "auto",
}


def test_request_round_trip_openai_anthropic_openai() -> None:
    first = oai.decode_request(OPENAI_BODY)
    anthropic_body = ant.encode_request(first, stream=False)
    # The Anthropic body carries the same conversation in content blocks.
    assert anthropic_body["system"] == "You are terse."
    assert anthropic_body["messages"][0]["content"][1]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": PNG,
    }
    uses = [b for b in anthropic_body["messages"][1]["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        ("call_1", "get_weather", {"city": "Paris"}),
        ("call_2", "get_time", {"tz": "CET"}),
    ]
    results = anthropic_body["messages"][2]["content"]
    assert [(r["type"], r["tool_use_id"]) for r in results] == [
        ("tool_result", "call_1"),
        ("tool_result", "call_2"),
    ]
    assert anthropic_body["tools"][0]["input_schema"]["required"] == ["city"]

    second = ant.decode_request(anthropic_body)
    assert second.messages == first.messages
    assert second.system == first.system and second.tools == first.tools
    back = oai.encode_request(second, stream=False)
    assert back["messages"] == oai.encode_request(first, stream=False)["messages"]
    assert oai.decode_request(back).messages == first.messages
    assert back["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "18C, cloudy",
    }
    assert json.loads(back["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris"
    }


def upstream_openai_chunks() -> list[dict[str, Any]]:
    """What an OpenAI upstream streams: text, then two tool calls whose arguments arrive in
    fragments cut mid-token, then the finish and usage chunks."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me "}),
        chunk({"content": "check."}),
    ]
    for i, (cid, name, args) in enumerate(
        [("call_a", "get_weather", '{"city": "Par'), ("call_b", "get_time", '{"tz": "C')]
    ):
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": cid,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args}}]}))
        rest = 'is"}' if i == 0 else 'ET"}'
        out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": rest}}]}))
    out.append(chunk({}, "tool_calls"))
    out.append(
        {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
        }
    )
    return out


def test_stream_round_trip_openai_anthropic_openai() -> None:
    decoder = oai.ChunkDecoder("openai")
    events: list[StreamEvent] = []
    for c in upstream_openai_chunks():
        events.extend(decoder.feed(c))
    events.extend(decoder.finish())

    # Internal -> Anthropic wire events -> internal again.
    encoder = ant.EventEncoder("m")
    wire = [pair for e in events for pair in encoder.feed(e)]
    names = [name for name, _ in wire]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    partials = [
        d["delta"]["partial_json"]
        for n, d in wire
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert "".join(partials) == '{"city": "Paris"}{"tz": "CET"}'
    back = ant.EventDecoder("anthropic")
    again: list[StreamEvent] = []
    for name, data in wire:
        again.extend(back.feed(name, json.dumps(data)))
    back.finish()
    # Identical but for the message id, which takes each format's prefix (msg_...).
    assert again[1:] == events[1:]
    assert again[0].id.endswith(events[0].id)  # type: ignore[union-attr]

    # Internal -> OpenAI chunks: what a caller of /chat/completions receives.
    chunk_encoder = oai.ChunkEncoder("m", True)
    chunks = [c for e in again for c in chunk_encoder.feed(e)]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
            slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] = tc.get("id") or slot["id"]
            slot["name"] = tc.get("function", {}).get("name") or slot["name"]
            slot["arguments"] += tc.get("function", {}).get("arguments") or ""
    assert text == "Let me check."
    assert calls == {
        0: {"id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        1: {"id": "call_b", "name": "get_time", "arguments": '{"tz": "CET"}'},
    }
    finishes = [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finishes == ["tool_calls"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 40

    assembled = StreamAssembler()
    for e in again:
        assembled.feed(e)
    response = assembled.result()
    assert response.stop_reason == "tool_use"
    assert [(t.id, t.input) for t in response.tool_calls] == [
        ("call_a", {"city": "Paris"}),
        ("call_b", {"tz": "CET"}),
    ]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 12)


def test_non_streaming_response_across_formats() -> None:
    openai_answer = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_z",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    response = oai.decode_response(openai_answer, "openai")
    message = ant.encode_response(response, "m")
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "tool_use", "id": "call_z", "name": "f", "input": {"a": 1}}
    ]
    assert message["usage"] == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 4,
    }
    again = ant.decode_response(message, "anthropic")
    out = oai.encode_response(again, "m")
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert (
        out["choices"][0]["message"]["tool_calls"]
        == openai_answer["choices"][0]["message"]["tool_calls"]
    )  # type: ignore[index]
    assert out["usage"] == openai_answer["usage"]
