"""Our answers in the Responses API's shape: the Response object, its output items (from
the internal answer's blocks), its usage, and the deleted and list bodies.

Separate from decoding (it never judges input) and from the stream encoder, which builds
the same items piece by piece and ends with this module's Response object, so a streamed
answer's `response.completed` carries exactly what `GET /responses/{id}` returns.

Block -> item: text -> a `message` item with one `output_text` part; thinking -> a
`reasoning` item (its text as `summary_text` when the caller asked for summaries, else as
`reasoning_text` content; a signature, Anthropic's, rides in `encrypted_content` so a
stateless caller can send the item back); tool use -> a `function_call` item, or a
`custom_tool_call` (its `input` text) when it calls one of the request's custom tools.
"""

from __future__ import annotations

import json
import time
from typing import Any

from orchestrator.providers._responses_format.items import item_id
from orchestrator.providers._responses_format.request import ResponsesRequest
from orchestrator.providers._types import (
    Block,
    ChatResponse,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

__all__ = [
    "Status",
    "caller_name",
    "custom_call_item",
    "custom_input",
    "deleted_body",
    "encode_response",
    "function_call_item",
    "message_item",
    "output_items",
    "reasoning_item",
    "response_object",
    "status_of",
    "usage_body",
]

JSON = dict[str, Any]
Status = str  # completed | incomplete | failed | in_progress


def status_of(stop: StopReason) -> tuple[Status, JSON | None]:
    """The Response's status and `incomplete_details` for the answer's stop reason."""
    if stop == "max_tokens":
        return "incomplete", {"reason": "max_output_tokens"}
    if stop == "refusal":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def usage_body(usage: Usage) -> JSON:
    """OpenAI's ResponseUsage. Cache counts come from the internal usage where it carries
    them (fields added by the Anthropic-fidelity work), else 0."""
    cached = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
    written = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def message_item(id: str, text: str, status: Status = "completed") -> JSON:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else []
    )
    return {"id": id, "type": "message", "role": "assistant", "content": content, "status": status}


def reasoning_item(
    id: str, text: str | None, signature: str | None, summary: bool, status: Status = "completed"
) -> JSON:
    item: JSON = {"id": id, "type": "reasoning", "summary": []}
    if text is not None:
        if summary:
            item["summary"] = [{"type": "summary_text", "text": text}]
        else:
            item["content"] = [{"type": "reasoning_text", "text": text}]
    if signature:
        item["encrypted_content"] = signature
    item["status"] = status
    return item


def function_call_item(
    id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: Status = "completed",
    namespace: str | None = None,
) -> JSON:
    item: JSON = {"id": id, "type": "function_call", "call_id": call_id, "name": name}
    if namespace is not None:
        item["namespace"] = namespace
    item["arguments"] = arguments
    item["status"] = status
    return item


def caller_name(request: ResponsesRequest, provider_name: str) -> tuple[str | None, str]:
    """(namespace, name) of a tool as the caller declared it, from its provider name."""
    namespace, name = request.namespaced.get(provider_name, (None, provider_name))
    return namespace, name


def custom_call_item(
    id: str, call_id: str, name: str, text: str, status: Status, namespace: str | None = None
) -> JSON:
    item: JSON = {"id": id, "type": "custom_tool_call", "call_id": call_id, "name": name}
    if namespace is not None:
        item["namespace"] = namespace
    item["input"] = text
    item["status"] = status
    return item


def custom_input(arguments: dict[str, Any]) -> str:
    """A custom tool's text from the function arguments it was called with (`{input}`)."""
    value = arguments.get("input")
    if isinstance(value, str):
        return value
    return json.dumps(arguments, ensure_ascii=False) if arguments else ""


def _item(block: Block, request: ResponsesRequest) -> JSON | None:
    if isinstance(block, TextBlock):
        return message_item(item_id("msg"), block.text)
    if isinstance(block, ThinkingBlock):
        return reasoning_item(item_id("rs"), block.text, block.signature, request.summary)
    if isinstance(block, ToolUseBlock):
        namespace, name = caller_name(request, block.name)
        if block.name in request.custom_tools:
            text = custom_input(block.input)
            return custom_call_item(item_id("ctc"), block.id, name, text, "completed", namespace)
        arguments = json.dumps(block.input, ensure_ascii=False)
        return function_call_item(item_id("fc"), block.id, name, arguments, "completed", namespace)
    return None  # images and tool results are never part of an answer


def output_items(content: tuple[Block, ...], request: ResponsesRequest) -> list[JSON]:
    return [item for block in content if (item := _item(block, request)) is not None]


def response_object(
    request: ResponsesRequest,
    *,
    id: str,
    model: str,
    created_at: int,
    status: Status,
    output: list[JSON],
    usage: Usage | None,
    error: JSON | None = None,
    incomplete: JSON | None = None,
) -> JSON:
    """OpenAI's Response object for `request` (its options echoed)."""
    text: JSON = {"format": request.text_format}
    if request.verbosity is not None:
        text["verbosity"] = request.verbosity
    body: JSON = {
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": request.reasoning,
        "store": request.store,
        "temperature": request.temperature,
        "text": text,
        "tool_choice": request.tool_choice,
        "tools": request.tools,
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": usage_body(usage) if usage is not None else None,
        "user": request.user,
        "metadata": request.metadata,
        **request.extra,
    }
    for key in ("user", "usage"):  # each an object or string when present: never null
        if body[key] is None:
            del body[key]
    return body


def encode_response(
    resp: ChatResponse, request: ResponsesRequest, *, id: str, model: str, created_at: int
) -> JSON:
    """A non-streamed answer as a Response object."""
    status, incomplete = status_of(resp.stop_reason)
    return response_object(
        request,
        id=id,
        model=model,
        created_at=created_at,
        status=status,
        output=output_items(resp.content, request),
        usage=resp.usage,
        incomplete=incomplete,
    )


def deleted_body(response_id: str) -> JSON:
    return {"id": response_id, "object": "response", "deleted": True}
