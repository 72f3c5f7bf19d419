"""The client side of Anthropic's Messages format, for an Anthropic-format upstream:
`encode_request`, `decode_response`, and `EventDecoder` (upstream SSE -> `StreamEvent`s,
`event: error` -> `ProviderError`).

Separate from the server side because it reads leniently what an upstream sends (blocks with
no internal equivalent are skipped, unknown events ignored), where the server side decodes a
caller strictly and writes exactly what Anthropic writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.providers._anthropic_format.answer import ERROR_STATUS
from orchestrator.providers._types import (
    Block,
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatRequest,
    ChatResponse,
    DocumentBlock,
    ImageBlock,
    Message,
    MessageEnd,
    MessageStart,
    ProviderError,
    RedactedThinkingBlock,
    StopReason,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "EventDecoder",
    "count_body",
    "decode_response",
    "encode_request",
    "native_body",
    "stream_error",
]

ANTHROPIC_VERSION = "2023-06-01"
# Anthropic requires max_tokens; a request decoded from another format may have none.
DEFAULT_MAX_TOKENS = 4096

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "refusal",
    # A paused server-tool turn ended this answer; the caller may continue it.
    "pause_turn": "end_turn",
    "model_context_window_exceeded": "max_tokens",
}


# --- client side: a request to an Anthropic-format upstream ----------------------------------
def _image_source(block: ImageBlock) -> dict[str, Any]:
    # An OpenAI-style data URL goes inline too: Anthropic takes only http(s) URLs.
    inline = block.inline()
    if inline is not None:
        media, data = inline
        return {"type": "base64", "media_type": media or "image/png", "data": data}
    return {"type": "url", "url": block.url or ""}


def _document(block: DocumentBlock) -> dict[str, Any]:
    source: dict[str, Any]
    if block.file_id:
        source = {"type": "file", "file_id": block.file_id}
    elif block.url:
        source = {"type": "url", "url": block.url}
    elif block.text is not None:
        source = {"type": "text", "media_type": "text/plain", "data": block.text}
    else:
        source = {"type": "base64", "media_type": "application/pdf", "data": block.data or ""}
    out: dict[str, Any] = {"type": "document", "source": source}
    for name in ("title", "context", "citations"):
        if getattr(block, name) is not None:
            out[name] = getattr(block, name)
    return out


def _request_block(block: Block) -> dict[str, Any] | None:
    out: dict[str, Any]
    if isinstance(block, TextBlock):
        # Anthropic rejects empty text blocks.
        if not block.text:
            return None
        out = {"type": "text", "text": block.text}
    elif isinstance(block, ImageBlock):
        out = {"type": "image", "source": _image_source(block)}
    elif isinstance(block, DocumentBlock):
        out = _document(block)
    elif isinstance(block, ThinkingBlock):
        # Anthropic verifies the signature of every thinking block sent back; reasoning from
        # another provider (no signature) cannot be replayed and is dropped.
        if not block.signature:
            return None
        return {"type": "thinking", "thinking": block.text, "signature": block.signature}
    elif isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    elif isinstance(block, ToolUseBlock):
        out = {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    else:
        content = [b for b in map(_request_block, block.content) if b is not None]
        out = {"type": "tool_result", "tool_use_id": block.tool_use_id}
        if content:
            out["content"] = content
        if block.is_error:
            out["is_error"] = True
    if block.cache_control is not None:
        out["cache_control"] = block.cache_control
    return out


def _messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        blocks = [b for b in map(_request_block, message.content) if b is not None]
        if not blocks:
            continue  # Anthropic rejects messages with empty content
        if out and out[-1]["role"] == message.role:
            # Roles must alternate: consecutive turns of one role become one message.
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": message.role, "content": blocks})
    for msg in out:
        if msg["role"] == "user":
            # tool_result blocks must lead the user turn that answers the tool calls (merging
            # an OpenAI `tool` message with a following user message can put text first).
            results = [b for b in msg["content"] if b["type"] == "tool_result"]
            others = [b for b in msg["content"] if b["type"] != "tool_result"]
            msg["content"] = results + others
    return out


def _tool_choice_param(choice: str | dict[str, str]) -> dict[str, Any]:
    if isinstance(choice, dict):
        return {"type": "tool", "name": choice["name"]}
    return {"type": choice}


def _input_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    # Anthropic requires an object schema; tools without arguments often send {}.
    if parameters.get("type") == "object":
        return parameters
    return {"type": "object", "properties": {}, **parameters}


# Top-level fields of a caller's body that its `params` carry under the same name.
_NATIVE_PARAMS = (
    "top_k",
    "service_tier",
    "thinking",
    "output_config",
    "output_format",
    "context_management",
    "container",
    "mcp_servers",
    "inference_geo",
    "speed",
    "diagnostics",
    "fallbacks",
    "fallback_credit_token",
)


def native_body(req: ChatRequest, *, stream: bool, model: str | None = None) -> dict[str, Any]:
    """The caller's own Messages body (`req.native`), for `model` (the route's), verbatim
    otherwise; `encode_request` for a request that came in another format."""
    if req.native is None:
        return encode_request(req, stream=stream, model=model)
    body = dict(req.native.body)
    body["model"] = model or req.model
    for name in _NATIVE_PARAMS:
        if name in body and name not in req.params:
            del body[name]  # dropped for this provider (`drop_unsupported_params`)
    if stream:
        body["stream"] = True
    else:
        body.pop("stream", None)
    return body


# Fields of a Messages body that /v1/messages/count_tokens takes (MessageCountTokensParams).
_COUNT_FIELDS = (
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "cache_control",
    "context_management",
    "mcp_servers",
    "output_config",
    "output_format",
    "speed",
)


def count_body(req: ChatRequest) -> dict[str, Any]:
    """`req` as a /v1/messages/count_tokens body: the caller's own (count_tokens or Messages)
    body narrowed to the fields that endpoint takes, or the encoded request."""
    body = native_body(req, stream=False)
    return {k: body[k] for k in _COUNT_FIELDS if k in body}


def encode_request(req: ChatRequest, *, stream: bool, model: str | None = None) -> dict[str, Any]:
    """A `ChatRequest` as a Messages API request body (for `model`, default `req.model`)."""
    body: dict[str, Any] = {
        "model": model or req.model,
        "max_tokens": req.max_tokens or DEFAULT_MAX_TOKENS,
        "messages": _messages(req.messages),
    }
    if req.system_blocks:
        body["system"] = [b for b in map(_request_block, req.system_blocks) if b is not None]
    elif req.system:
        body["system"] = req.system
    if req.tools:
        tools: list[dict[str, Any]] = []
        for tool in req.tools:
            entry: dict[str, Any] = {"name": tool.name}
            if tool.description:
                entry["description"] = tool.description
            entry["input_schema"] = _input_schema(tool.parameters)
            if tool.cache_control is not None:
                entry["cache_control"] = tool.cache_control
            tools.append(entry)
        body["tools"] = tools
        # Anthropic rejects tool_choice without tools.
        if req.tool_choice is not None:
            body["tool_choice"] = _tool_choice_param(req.tool_choice)
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.stop:
        body["stop_sequences"] = list(req.stop)
    if req.user:
        body["metadata"] = {"user_id": req.user}
    if stream:
        body["stream"] = True
    return body


# --- client side: decoding the upstream's answer -----------------------------------------------
def _malformed(provider: str, what: str) -> ProviderError:
    return ProviderError(
        f"{provider}: malformed answer: {what}", provider=provider, upstream_status=200
    )


def _stop_reason(raw: Any, saw_tool: bool) -> StopReason:
    reason = _STOP_REASONS.get(raw, "end_turn") if isinstance(raw, str) else "end_turn"
    return "tool_use" if saw_tool and reason == "end_turn" else reason


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _sub(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _input_tokens(usage: dict[str, Any]) -> int:
    # Anthropic counts cached prompt tokens apart from input_tokens; the prompt's size (what
    # other providers report as input) is their sum.
    return (
        _int(usage.get("input_tokens"))
        + _int(usage.get("cache_creation_input_tokens"))
        + _int(usage.get("cache_read_input_tokens"))
    )


def _usage(usage: dict[str, Any], output_tokens: int) -> Usage:
    return Usage(
        _input_tokens(usage),
        output_tokens,
        _int(usage.get("cache_creation_input_tokens")),
        _int(usage.get("cache_read_input_tokens")),
    )


def decode_response(body: Any, provider: str) -> ChatResponse:
    """An Anthropic Message object -> `ChatResponse`; a malformed one is a `ProviderError`."""
    if not isinstance(body, dict) or not isinstance(body.get("content"), list):
        raise _malformed(provider, "no content array")
    content: list[Block] = []
    for item in body["content"]:
        if not isinstance(item, dict):
            raise _malformed(provider, "content block is not an object")
        kind = item.get("type")
        if kind == "text":
            content.append(TextBlock(str(item.get("text", ""))))
        elif kind == "thinking":
            content.append(
                ThinkingBlock(str(item.get("thinking", "")), item.get("signature") or None)
            )
        elif kind == "redacted_thinking":
            content.append(RedactedThinkingBlock(str(item.get("data", ""))))
        elif kind == "tool_use":
            tool_input = item.get("input")
            content.append(
                ToolUseBlock(
                    str(item.get("id", "")),
                    str(item.get("name", "")),
                    tool_input if isinstance(tool_input, dict) else {},
                )
            )
        # Server-tool blocks have no internal equivalent.
    usage = _sub(body, "usage")
    saw_tool = any(isinstance(b, ToolUseBlock) for b in content)
    return ChatResponse(
        id=str(body.get("id", "")),
        model=str(body.get("model", "")),
        content=tuple(content),
        stop_reason=_stop_reason(body.get("stop_reason"), saw_tool),
        usage=_usage(usage, _int(usage.get("output_tokens"))),
    )


def stream_error(provider: str, data: dict[str, Any]) -> ProviderError:
    """The `ProviderError` for an upstream `event: error` payload."""
    err = _sub(data, "error")
    kind = str(err.get("type") or "api_error")
    message = str(err.get("message") or kind)
    return ProviderError.from_status(provider, ERROR_STATUS.get(kind, 500), f"{kind}: {message}")


@dataclass
class EventDecoder:
    """An Anthropic SSE stream -> internal `StreamEvent`s. Feed every (event, data) pair;
    call `finish()` when the body ends (a stream cut before `message_stop` is an error).
    Blocks with no internal equivalent (server tools) are skipped and the remaining blocks
    renumbered 0, 1, 2...; a thinking block's signature comes with its BlockStop."""

    provider: str
    done: bool = False
    _index: dict[int, int | None] = field(default_factory=dict)
    _next: int = 0
    _input: dict[str, Any] = field(default_factory=dict)  # the input counts, latest values
    _output_tokens: int = 0
    _stop: Any = None
    _saw_tool: bool = False
    _signatures: dict[int, str] = field(default_factory=dict)

    def feed(self, event: str, data: str) -> list[StreamEvent]:
        if event == "ping" or self.done:
            return []
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise _malformed(self.provider, f"event data is not JSON: {data[:200]!r}") from exc
        if not isinstance(payload, dict):
            raise _malformed(self.provider, "event data is not an object")
        kind = payload.get("type", event)
        if kind == "error" or event == "error":
            raise stream_error(self.provider, payload)
        handlers = {
            "message_start": self._on_message_start,
            "content_block_start": self._on_content_block_start,
            "content_block_delta": self._on_content_block_delta,
            "content_block_stop": self._on_content_block_stop,
            "message_delta": self._on_message_delta,
            "message_stop": self._on_message_stop,
        }
        handler = handlers.get(str(kind))
        return [] if handler is None else handler(payload)  # unknown events: forward compatible

    def finish(self) -> None:
        if not self.done:
            raise ProviderError.unreachable(self.provider, "stream ended before message_stop")

    def _on_message_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        message = _sub(payload, "message")
        usage = _sub(message, "usage")
        self._input.update(usage)
        self._output_tokens = _int(usage.get("output_tokens"))
        msg_id, model = str(message.get("id", "")), str(message.get("model", ""))
        return [
            MessageStart(
                msg_id,
                model,
                _input_tokens(self._input),
                cache_creation_input_tokens=_int(usage.get("cache_creation_input_tokens")),
                cache_read_input_tokens=_int(usage.get("cache_read_input_tokens")),
            )
        ]

    def _on_content_block_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        upstream = _int(payload.get("index"))
        block = _sub(payload, "content_block")
        kind = block.get("type")
        if kind not in ("text", "thinking", "tool_use", "redacted_thinking"):
            self._index[upstream] = None
            return []
        index, self._next = self._next, self._next + 1
        if kind == "redacted_thinking":
            self._index[upstream] = index
            return [BlockStart(index, "redacted_thinking", data=str(block.get("data", "")))]
        self._index[upstream] = index
        out: list[StreamEvent] = []
        if kind == "tool_use":
            self._saw_tool = True
            name = str(block.get("name", ""))
            out.append(BlockStart(index, "tool_use", str(block.get("id", "")), name))
            if block.get("input"):
                out.append(BlockDelta(index, json.dumps(block["input"])))
        else:
            out.append(BlockStart(index, kind))
            initial = block.get(kind)
            if isinstance(initial, str) and initial:
                out.append(BlockDelta(index, initial))
        return out

    def _on_content_block_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        index = self._index.get(_int(payload.get("index")))
        delta = payload.get("delta")
        if index is None or not isinstance(delta, dict):
            return []
        if delta.get("type") == "signature_delta":
            self._signatures[index] = self._signatures.get(index, "") + str(
                delta.get("signature") or ""
            )
            return []
        text = {
            "text_delta": delta.get("text"),
            "thinking_delta": delta.get("thinking"),
            "input_json_delta": delta.get("partial_json"),
        }.get(str(delta.get("type")))
        # citations_delta has no place in the internal stream.
        if not isinstance(text, str) or not text:
            return []
        return [BlockDelta(index, text)]

    def _on_content_block_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        index = self._index.get(_int(payload.get("index")))
        if index is None:
            return []
        return [BlockStop(index, signature=self._signatures.pop(index, None))]

    def _on_message_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        delta = _sub(payload, "delta")
        usage = _sub(payload, "usage")
        if delta.get("stop_reason") is not None:
            self._stop = delta["stop_reason"]
        if "output_tokens" in usage:
            self._output_tokens = _int(usage["output_tokens"])
        # Counts here are cumulative totals; one that is absent keeps its message_start value.
        self._input.update({k: v for k, v in usage.items() if v is not None})
        return []

    def _on_message_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self.done = True
        usage = _usage(self._input, self._output_tokens)
        return [MessageEnd(_stop_reason(self._stop, self._saw_tool), usage)]
