"""Our answers in Anthropic's Messages format: the Message object, the exact SSE event
sequence (`message_start`, `content_block_start`, `content_block_delta`,
`content_block_stop`, `message_delta`, `message_stop`) framed by `sse_event`, the `PING`
heartbeat, and Anthropic's errors (its error types, the error body, the mid-stream
`event: error` frame).

Separate from decoding (it never judges input) and from the upstream side (it writes what
Anthropic's own API writes, so the official SDK reads it). The error types' table
(`ERROR_STATUS`) is shared with the upstream side, which reads the same types back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from orchestrator._json import dumps
from orchestrator.errors import OrchestratorError
from orchestrator.providers._types import (
    Block,
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatResponse,
    MessageStart,
    ProviderError,
    RedactedThinkingBlock,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

__all__ = [
    "ERROR_STATUS",
    "PING",
    "EventEncoder",
    "encode_response",
    "error_body",
    "error_event",
    "error_type_for",
    "sse_event",
]

# Anthropic's error types and the HTTP status each comes with.
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_TYPE_BY_STATUS: dict[int, str] = {status: kind for kind, status in ERROR_STATUS.items()}
_TYPE_BY_STATUS[422] = "invalid_request_error"

PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def _message_id(raw: str) -> str:
    if raw.startswith("msg_"):
        return raw
    return f"msg_{raw}" if raw else f"msg_{uuid.uuid4().hex[:24]}"


def _response_block(block: Block) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.text, "signature": block.signature or ""}
    if isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return None  # images and tool results are never part of an assistant answer


def _usage(usage: Usage) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` without the cached parts, which it counts apart."""
    created, read = usage.cache_creation_input_tokens, usage.cache_read_input_tokens
    return {
        "input_tokens": max(0, usage.input_tokens - created - read),
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": usage.output_tokens,
    }


def encode_response(resp: ChatResponse, model: str) -> dict[str, Any]:
    """A `ChatResponse` as Anthropic's Message object, naming `model` (what the caller asked);
    an Anthropic upstream's own Message as it came (`resp.native`)."""
    if resp.native is not None:
        return {**resp.native, "model": model}
    content = [b for b in map(_response_block, resp.content) if b is not None]
    return {
        "id": _message_id(resp.id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": resp.stop_reason,
        "stop_sequence": None,
        "usage": _usage(resp.usage),
    }


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE frame as Anthropic writes it: `event: <name>` then one `data:` line."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def error_type_for(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, request_id: str | None = None) -> dict[str, Any]:
    """An error in Anthropic's format: `{type: "error", error: {type, message}}`."""
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": error_type_for(status), "message": message},
    }
    if request_id:
        body["request_id"] = request_id
    return body


def error_event(err: OrchestratorError) -> bytes:
    """The `event: error` frame Anthropic sends when a stream fails after it started."""
    if isinstance(err, ProviderError):
        # An overloaded upstream stays "overloaded" (clients back off on it); other upstream
        # failures are reported as the caller sees them (our key's 401 is not theirs).
        status = 529 if err.upstream_status == 529 else err.to_http().status_code
    else:
        status = err.status_code
    return sse_event("error", error_body(status, err.message))


@dataclass
class EventEncoder:
    """Internal stream events -> Anthropic's SSE events, as (event name, data) pairs."""

    model: str
    _kinds: dict[int, str] = field(default_factory=dict)

    def feed(self, event: StreamEvent) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(event, MessageStart):
            message: dict[str, Any] = {
                "id": _message_id(event.id),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": _usage(
                    Usage(
                        event.input_tokens,
                        0,
                        event.cache_creation_input_tokens,
                        event.cache_read_input_tokens,
                    )
                ),
            }
            return [("message_start", {"type": "message_start", "message": message})]
        if isinstance(event, BlockStart):
            self._kinds[event.index] = event.block_type
            block: dict[str, Any]
            if event.block_type == "text":
                block = {"type": "text", "text": ""}
            elif event.block_type == "thinking":
                block = {"type": "thinking", "thinking": "", "signature": ""}
            elif event.block_type == "redacted_thinking":
                block = {"type": "redacted_thinking", "data": event.data or ""}
            else:
                block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            start = {"type": "content_block_start", "index": event.index, "content_block": block}
            return [("content_block_start", start)]
        if isinstance(event, BlockDelta):
            if not event.text:
                return []
            kind = self._kinds.get(event.index, "text")
            if kind == "tool_use":
                delta = {"type": "input_json_delta", "partial_json": event.text}
            elif kind == "thinking":
                delta = {"type": "thinking_delta", "thinking": event.text}
            else:
                delta = {"type": "text_delta", "text": event.text}
            data = {"type": "content_block_delta", "index": event.index, "delta": delta}
            return [("content_block_delta", data)]
        if isinstance(event, BlockStop):
            stop = ("content_block_stop", {"type": "content_block_stop", "index": event.index})
            if event.signature is None:
                return [stop]
            # A thinking block's signature, as Anthropic sends it: one delta before the stop.
            signature = {"type": "signature_delta", "signature": event.signature}
            data = {"type": "content_block_delta", "index": event.index, "delta": signature}
            return [("content_block_delta", data), stop]
        # MessageEnd. Usage counts on message_delta are cumulative; input_tokens is repeated
        # there because providers other than Anthropic only know it at the end.
        usage = _usage(event.usage)
        delta_event = {
            "type": "message_delta",
            "delta": {"stop_reason": event.stop_reason, "stop_sequence": None},
            "usage": usage,
        }
        return [("message_delta", delta_event), ("message_stop", {"type": "message_stop"})]

    def encode(self, event: StreamEvent) -> bytes:
        """`feed`, framed as SSE bytes."""
        return b"".join(sse_event(name, data) for name, data in self.feed(event))
