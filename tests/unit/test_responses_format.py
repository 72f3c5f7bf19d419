"""The Responses API wire format <-> the internal model (orchestrator/providers/
_responses_format), without a server: input items to messages, options to ChatRequest
fields and params, blocks to output items, stream events to OpenAI's typed events (each
checked against OpenAI's schema)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.errors import ValidationFailed
from orchestrator.providers import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatResponse,
    DocumentBlock,
    ImageBlock,
    MessageEnd,
    MessageStart,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.providers import _responses_format as rf
from tests.openai_schema import validate

PNG = "data:image/png;base64,iVBORw0KGgo="
FILE = {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0="}


def test_items_become_merged_turns_with_system_from_instructions_and_messages() -> None:
    req = rf.decode_request(
        {
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "developer", "content": "answer in French"},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is this?"},
                        {"type": "input_image", "image_url": PNG},
                    ],
                },
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "sig"},
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "look", "arguments": '{"a":1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "a cat"},
                {"type": "function_call_output", "call_id": "c2", "output": "a hat"},
                {"role": "user", "content": "and now?"},
            ],
        }
    )
    chat = rf.conversation(req, [])
    assert chat.system == "be brief\n\nanswer in French"
    assert [m.role for m in chat.messages] == ["user", "assistant", "user"]
    user, assistant, results = chat.messages
    assert user.content == (TextBlock("what is this?"), ImageBlock("image/png", "iVBORw0KGgo="))
    assert assistant.content == (
        ThinkingBlock("", "sig"),
        TextBlock("Checking."),
        ToolUseBlock("c1", "look", {}),
        ToolUseBlock("c2", "look", {"a": 1}),
    )
    assert results.content == (
        ToolResultBlock("c1", (TextBlock("a cat"),)),
        ToolResultBlock("c2", (TextBlock("a hat"),)),
        TextBlock("and now?"),
    )
    # Stored shape: every item has an id, string content became parts.
    assert all(item["id"] for item in req.items)
    assert req.items[0]["content"] == [{"type": "input_text", "text": "answer in French"}]
    assert req.items[3]["content"][0]["type"] == "output_text"


def test_options_map_to_the_internal_request_and_params() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    req = rf.decode_request(
        {
            "model": "m",
            "input": "hi",
            "max_output_tokens": 64,
            "temperature": 0.2,
            "top_p": 0.9,
            "user": "u-1",
            "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "name": "f"},
            "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": True}],
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}},
            "reasoning": {"effort": "high", "summary": "auto"},
            "metadata": {"k": "v"},
            "store": False,
            "stream": True,
            "prompt_cache_key": "pk",
        }
    )
    chat = req.chat
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.user) == (64, 0.2, 0.9, "u-1")
    assert chat.tool_choice == {"name": "f"} and chat.tools[0].parameters == schema
    assert chat.stream and not req.store and req.summary
    assert chat.params == {
        "prompt_cache_key": "pk",
        "reasoning_effort": "high",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": schema},
        },
        "user": "u-1",
        "parallel_tool_calls": False,
    }
    assert req.metadata == {"k": "v"}  # ours: stored and echoed, never sent upstream


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0].file_data",
        ),
        (
            {"input": [{"role": "user", "content": [{**FILE, "file_id": "file_1"}]}]},
            "input[0].content[0].file_id",
        ),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.name"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
        ({"input": "x", "nope": 1}, "nope"),
        (  # ids are the input_items cursors: a repeated one would page forever
            {"input": [{"role": "user", "content": "a", "id": "m"}] * 2},
            "input[1].id",
        ),
        ({}, "input"),
    ],
)
def test_what_we_cannot_do_is_refused_by_name(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        rf.decode_request({"model": "m", **body})
    assert caught.value.extra["fields"][0]["field"] == field


def test_history_comes_first_and_its_instructions_do_not() -> None:
    first = rf.decode_request({"model": "m", "input": "one", "instructions": "old"})
    reply = rf.encode_response(
        ChatResponse("x", "m", (TextBlock("uno"),), "end_turn", Usage(1, 1)),
        first,
        id="resp_1",
        model="m",
        created_at=1,
    )
    second = rf.decode_request({"model": "m", "input": "two", "previous_response_id": "resp_1"})
    chat = rf.conversation(second, [*first.items, *reply["output"]])
    assert chat.system is None
    assert [(m.role, m.text) for m in chat.messages] == [
        ("user", "one"),
        ("assistant", "uno"),
        ("user", "two"),
    ]


def test_answer_is_a_valid_response_object() -> None:
    req = rf.decode_request({"model": "m", "input": "hi", "reasoning": {"summary": "auto"}})
    answer = rf.encode_response(
        ChatResponse(
            "x",
            "m",
            (
                ThinkingBlock("hmm", "sig"),
                TextBlock("Let me check."),
                ToolUseBlock("call_1", "f", {"a": 1}),
            ),
            "tool_use",
            Usage(10, 5),
        ),
        req,
        id="resp_1",
        model="m",
        created_at=1,
    )
    validate(answer, "Response")
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message", "function_call"]
    assert answer["output"][0]["summary"] == [{"type": "summary_text", "text": "hmm"}]
    assert json.loads(answer["output"][2]["arguments"]) == {"a": 1}
    assert answer["usage"]["total_tokens"] == 15 and answer["status"] == "completed"
    cut = rf.encode_response(
        ChatResponse("x", "m", (TextBlock("…"),), "max_tokens", Usage(1, 1)),
        req,
        id="resp_2",
        model="m",
        created_at=1,
    )
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def _frames(encoder: rf.EventEncoder, events: list[Any]) -> list[dict[str, Any]]:
    raw = b"".join(encoder.frames(e) for e in events) + encoder.terminal_frame()
    out = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        validate(event, "ResponseStreamEvent")
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


@pytest.mark.parametrize("summary", [False, True])
def test_stream_events_in_openai_order(summary: bool) -> None:
    body: dict[str, Any] = {"model": "m", "input": "hi", "stream": True}
    if summary:
        body["reasoning"] = {"summary": "auto"}
    encoder = rf.EventEncoder(rf.decode_request(body), id="resp_1", model="m", created_at=1)
    events = _frames(
        encoder,
        [
            MessageStart("x", "m", input_tokens=7),
            BlockStart(0, "thinking"),
            BlockDelta(0, "hm"),
            BlockStop(0),
            BlockStart(1, "text"),
            BlockDelta(1, "Hel"),
            BlockDelta(1, "lo"),
            BlockStop(1),
            BlockStart(2, "tool_use", id="call_1", name="f"),
            BlockDelta(2, '{"a":'),
            BlockDelta(2, "1}"),
            BlockStop(2),
            MessageEnd("tool_use", Usage(0, 9)),
        ],
    )
    reasoning = (
        [
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
        ]
        if summary
        else [
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
        ]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *reasoning,
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    validate(final, "Response")
    assert final["usage"]["input_tokens"] == 7 and final["usage"]["output_tokens"] == 9
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hello"
    assert final == encoder.final


def test_a_failed_stream_ends_with_error_and_response_failed() -> None:
    from orchestrator.errors import BadGateway

    encoder = rf.EventEncoder(
        rf.decode_request({"model": "m", "input": "hi"}), id="resp_1", model="m", created_at=1
    )
    encoder.frames(BlockStart(0, "text"))
    raw = encoder.error_frames(BadGateway("upstream broke"))
    types = [json.loads(f.split("\ndata: ")[1])["type"] for f in raw.decode().split("\n\n") if f]
    assert types == ["error", "response.failed"]
    assert encoder.final is not None and encoder.final["status"] == "failed"
    assert encoder.final["output"] == []  # the item cut short is not part of the output


def test_a_failure_after_the_end_is_the_last_word() -> None:
    """The endpoint sends `terminal_frame` after the stream's frames: a failure reported
    after MessageEnd (the upstream broke while closing) must not be followed by a
    response.completed contradicting the response.failed (and the stored failed answer)."""
    from orchestrator.errors import BadGateway

    encoder = rf.EventEncoder(
        rf.decode_request({"model": "m", "input": "hi"}), id="resp_1", model="m", created_at=1
    )
    for event in (BlockStart(0, "text"), BlockDelta(0, "ok"), BlockStop(0)):
        encoder.frames(event)
    encoder.frames(MessageEnd("end_turn", Usage(1, 1)))
    raw = encoder.error_frames(BadGateway("upstream broke")) + encoder.terminal_frame()
    types = [json.loads(f.split("\ndata: ")[1])["type"] for f in raw.decode().split("\n\n") if f]
    assert types == ["error", "response.failed"]
    assert encoder.final is not None and encoder.final["status"] == "failed"


PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}


def test_custom_tools_are_functions_of_one_text_argument_both_ways() -> None:
    req = rf.decode_request(
        {
            "model": "m",
            "tools": [PATCH_TOOL],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
            "input": [
                {"role": "user", "content": "fix it"},
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "P"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
            ],
        }
    )
    tool = req.chat.tools[0]
    assert tool.parameters["properties"] == {"input": {"type": "string"}}
    assert tool.description is not None and "start: /.+/" in tool.description
    assert req.chat.tool_choice == {"name": "apply_patch"}
    assert req.tools == [PATCH_TOOL]  # echoed as sent
    _, assistant, result = req.chat.messages
    assert assistant.content == (ToolUseBlock("c1", "apply_patch", {"input": "P"}),)
    assert result.content == (ToolResultBlock("c1", (TextBlock("done"),)),)

    answer = rf.encode_response(
        ChatResponse(
            "x", "m", (ToolUseBlock("c2", "apply_patch", {"input": "Q"}),), "tool_use", Usage()
        ),
        req,
        id="resp_1",
        model="m",
        created_at=1,
    )
    validate(answer, "Response")
    call = answer["output"][0]
    assert (call["type"], call["call_id"], call["input"]) == ("custom_tool_call", "c2", "Q")

    encoder = rf.EventEncoder(req, id="resp_2", model="m", created_at=1)
    events = _frames(
        encoder,
        [
            BlockStart(0, "tool_use", id="c3", name="apply_patch"),
            BlockDelta(0, '{"input": "*** Begin'),
            BlockDelta(0, ' Patch"}'),
            BlockStop(0),
            MessageEnd("tool_use", Usage(1, 1)),
        ],
    )
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1]["response"]["output"][0]["input"] == "*** Begin Patch"


def test_input_file_parts_become_document_blocks() -> None:
    """A PDF inline (data URL) or by URL reaches the internal model as a document block, as
    a chat-completions `file` part does; the provider's table decides where it may go."""
    req = rf.decode_request(
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "sum up"},
                        {**FILE, "filename": "a.pdf"},
                        {"type": "input_file", "file_url": "https://example.com/b.pdf"},
                    ],
                }
            ],
        }
    )
    (message,) = req.chat.messages
    text, inline, linked = message.content
    assert text == TextBlock("sum up")
    assert inline == DocumentBlock(media_type="application/pdf", data="JVBERi0=", title="a.pdf")
    assert linked == DocumentBlock(url="https://example.com/b.pdf")
    # Recorded for the provider tables, as the other decoders do: OpenAI takes the inline
    # PDF but not the URL one (a 400 naming `document`, never an empty file part), and a
    # provider without documents refuses both instead of losing them.
    chat = rf.conversation(req, [])
    assert chat.params["document"] == ("base64", "url")
    from orchestrator.providers import _params

    class _OpenAI:
        params = _params.OPENAI

    class _Ollama:
        params = _params.OLLAMA

    assert _params.unsupported(_OpenAI(), chat.params) == ["document"]
    inline_only = rf.conversation(
        rf.decode_request({"model": "m", "input": [{"role": "user", "content": [FILE]}]}), []
    )
    assert _params.unsupported(_OpenAI(), inline_only.params) == []
    assert _params.unsupported(_Ollama(), inline_only.params) == ["document"]
