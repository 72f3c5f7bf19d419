"""The Anthropic Messages wire format, both ways. Pure: no I/O.

Server side (our `POST /api/v1/messages`): `decode_request` turns a Messages request into a
`ChatRequest`; `encode_response` and `EventEncoder` turn our answer into a Message object or the
exact SSE event sequence (`message_start`, `content_block_start`, `content_block_delta`,
`content_block_stop`, `message_delta`, `message_stop`), framed by `sse_event`; `PING` and
`error_event` are Anthropic's heartbeat and mid-stream error frames; `error_body` is its error
body.

Client side (an Anthropic-format upstream): `encode_request`, `decode_response` and
`EventDecoder` (upstream SSE -> `StreamEvent`s, `event: error` -> `ProviderError`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, NoReturn

from orchestrator._json import dumps
from orchestrator.errors import OrchestratorError, ValidationFailed
from orchestrator.providers._types import (
    Block,
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

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "ERROR_STATUS",
    "PING",
    "EventDecoder",
    "EventEncoder",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "error_body",
    "error_event",
    "error_type_for",
    "sse_event",
    "stream_error",
]

ANTHROPIC_VERSION = "2023-06-01"
# Anthropic requires max_tokens; a request decoded from another format may have none.
DEFAULT_MAX_TOKENS = 4096

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

PING = b'event: ping\ndata: {"type": "ping"}\n\n'


# --- server side: decoding a request -----------------------------------------------------------
def _invalid(path: str, message: str) -> NoReturn:
    raise ValidationFailed(
        f"invalid request: {path}: {message}",
        extra={"fields": [{"field": path, "message": message}]},
    )


def _obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _invalid(path, "must be an object")
    return value


def _str(value: Any, path: str, *, required: bool = True) -> str:
    if not isinstance(value, str) or (required and not value):
        _invalid(path, "must be a non-empty string" if required else "must be a string")
    return value


def _number(value: Any, path: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _invalid(path, "must be a number")
    if not low <= value <= high:
        _invalid(path, f"must be between {low:g} and {high:g}")
    return float(value)


def _image(block: dict[str, Any], path: str) -> ImageBlock:
    source = _obj(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        return ImageBlock(
            media_type=_str(source.get("media_type"), f"{path}.source.media_type"),
            data=_str(source.get("data"), f"{path}.source.data"),
        )
    if kind == "url":
        return ImageBlock(url=_str(source.get("url"), f"{path}.source.url"))
    _invalid(f"{path}.source.type", "must be 'base64' or 'url'")


def _tool_result_content(value: Any, path: str) -> tuple[TextBlock | ImageBlock, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (TextBlock(value),)
    if not isinstance(value, list):
        _invalid(path, "must be a string or an array of content blocks")
    out: list[TextBlock | ImageBlock] = []
    for i, item in enumerate(value):
        block = _obj(item, f"{path}.{i}")
        kind = block.get("type")
        if kind == "text":
            out.append(TextBlock(_str(block.get("text"), f"{path}.{i}.text", required=False)))
        elif kind == "image":
            out.append(_image(block, f"{path}.{i}"))
        else:
            _invalid(f"{path}.{i}.type", "must be 'text' or 'image'")
    return tuple(out)


def _block(item: Any, path: str) -> Block | None:
    """One request content block; None for blocks that carry nothing we can forward."""
    block = _obj(item, path)
    kind = block.get("type")
    if kind == "text":
        return TextBlock(_str(block.get("text"), f"{path}.text", required=False))
    if kind == "image":
        return _image(block, path)
    if kind == "tool_use":
        tool_input = block.get("input", {})
        return ToolUseBlock(
            id=_str(block.get("id"), f"{path}.id"),
            name=_str(block.get("name"), f"{path}.name"),
            input=_obj(tool_input, f"{path}.input"),
        )
    if kind == "tool_result":
        is_error = block.get("is_error", False)
        if not isinstance(is_error, bool):
            _invalid(f"{path}.is_error", "must be a boolean")
        return ToolResultBlock(
            tool_use_id=_str(block.get("tool_use_id"), f"{path}.tool_use_id"),
            content=_tool_result_content(block.get("content"), f"{path}.content"),
            is_error=is_error,
        )
    if kind == "thinking":
        signature = block.get("signature")
        if signature is not None:
            signature = _str(signature, f"{path}.signature", required=False)
        return ThinkingBlock(
            _str(block.get("thinking"), f"{path}.thinking", required=False), signature or None
        )
    if kind == "redacted_thinking":
        # Encrypted reasoning only Anthropic can read; no other provider can take it.
        return None
    _invalid(f"{path}.type", f"unsupported content block type {kind!r}")


def _message(item: Any, path: str) -> Message:
    msg = _obj(item, path)
    role = msg.get("role")
    if role not in ("user", "assistant"):
        _invalid(f"{path}.role", "must be 'user' or 'assistant'")
    content = msg.get("content")
    if isinstance(content, str):
        return Message(role, (TextBlock(content),))
    if not isinstance(content, list):
        _invalid(f"{path}.content", "must be a string or an array of content blocks")
    blocks = [_block(b, f"{path}.content.{j}") for j, b in enumerate(content)]
    return Message(role, tuple(b for b in blocks if b is not None))


def _system(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if not isinstance(value, list):
        _invalid("system", "must be a string or an array of text blocks")
    parts: list[str] = []
    for i, item in enumerate(value):
        block = _obj(item, f"system.{i}")
        if block.get("type") != "text":
            _invalid(f"system.{i}.type", "must be 'text'")
        parts.append(_str(block.get("text"), f"system.{i}.text", required=False))
    return "\n\n".join(parts) or None


def _tools(value: Any) -> tuple[ToolDef, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        _invalid("tools", "must be an array")
    out: list[ToolDef] = []
    for i, item in enumerate(value):
        tool = _obj(item, f"tools.{i}")
        if tool.get("type", "custom") != "custom":
            _invalid(f"tools.{i}.type", f"server tool {tool.get('type')!r} is not supported")
        description = tool.get("description")
        if description is not None:
            description = _str(description, f"tools.{i}.description", required=False)
        out.append(
            ToolDef(
                name=_str(tool.get("name"), f"tools.{i}.name"),
                description=description,
                parameters=_obj(tool.get("input_schema"), f"tools.{i}.input_schema"),
            )
        )
    return tuple(out)


def _tool_choice(value: Any) -> str | dict[str, str] | None:
    if value is None:
        return None
    choice = _obj(value, "tool_choice")
    kind = choice.get("type")
    if kind in ("auto", "any", "none"):
        return str(kind)
    if kind == "tool":
        return {"name": _str(choice.get("name"), "tool_choice.name")}
    _invalid("tool_choice.type", "must be 'auto', 'any', 'none' or 'tool'")


def decode_request(body: Any) -> ChatRequest:
    """A Messages API request body -> `ChatRequest`; `ValidationFailed` names the bad field.
    A missing `model` decodes to "" (the endpoint applies its default model)."""
    data = _obj(body, "body")
    # An absent model is left empty for the caller's default model; a given one must be valid.
    model = "" if data.get("model") is None else _str(data.get("model"), "model")
    max_tokens = data.get("max_tokens")
    if max_tokens is None:
        _invalid("max_tokens", "field required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        _invalid("max_tokens", "must be a positive integer")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        _invalid("messages", "must be a non-empty array")
    temperature = data.get("temperature")
    top_p = data.get("top_p")
    stop = data.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        _invalid("stop_sequences", "must be an array of strings")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        _invalid("stream", "must be a boolean")
    user = None
    if data.get("metadata") is not None:
        metadata = _obj(data["metadata"], "metadata")
        if metadata.get("user_id") is not None:
            user = _str(metadata["user_id"], "metadata.user_id", required=False) or None
    return ChatRequest(
        model=model,
        messages=tuple(_message(m, f"messages.{i}") for i, m in enumerate(messages)),
        system=_system(data.get("system")),
        tools=_tools(data.get("tools")),
        tool_choice=_tool_choice(data.get("tool_choice")),
        max_tokens=max_tokens,
        temperature=None if temperature is None else _number(temperature, "temperature", 0, 1),
        top_p=None if top_p is None else _number(top_p, "top_p", 0, 1),
        stop=tuple(stop),
        stream=stream,
        user=user,
        params=_params_of(data) | ({"user": user} if user is not None else {}),
    )


# Every Messages API field a caller may send; anything else is a 400 naming it (Anthropic's
# own "extra inputs are not permitted"): a field is never ignored silently.
_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
    }
)


def _params_of(data: dict[str, Any]) -> dict[str, Any]:
    """Optional fields kept for the provider's declared table (`_params.py`): `thinking`,
    `top_k`, `service_tier`, and `tool_choice.disable_parallel_tool_use` as OpenAI's
    `parallel_tool_calls: false` (`metadata.user_id` joins them as `user` in
    `decode_request`)."""
    for name in data:
        if name not in _FIELDS:
            _invalid(name, "extra inputs are not permitted (not a Messages API field)")
    out: dict[str, Any] = {}
    top_k = data.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            _invalid("top_k", "must be a positive integer")
        out["top_k"] = top_k
    tier = data.get("service_tier")
    if tier is not None:
        out["service_tier"] = _str(tier, "service_tier")
    thinking = data.get("thinking")
    if thinking is not None:
        thinking = _obj(thinking, "thinking")
        if thinking.get("type") not in ("enabled", "disabled"):
            _invalid("thinking.type", "must be enabled or disabled")
        out["thinking"] = thinking
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


# --- server side: encoding an answer -----------------------------------------------------------
def _message_id(raw: str) -> str:
    if raw.startswith("msg_"):
        return raw
    return f"msg_{raw}" if raw else f"msg_{uuid.uuid4().hex[:24]}"


def _response_block(block: Block) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.text, "signature": block.signature or ""}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return None  # images and tool results are never part of an assistant answer


def encode_response(resp: ChatResponse, model: str) -> dict[str, Any]:
    """A `ChatResponse` as Anthropic's Message object, naming `model` (what the caller asked)."""
    content = [b for b in map(_response_block, resp.content) if b is not None]
    return {
        "id": _message_id(resp.id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": resp.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": resp.usage.input_tokens,
            "output_tokens": resp.usage.output_tokens,
        },
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
                "usage": {"input_tokens": event.input_tokens, "output_tokens": 0},
            }
            return [("message_start", {"type": "message_start", "message": message})]
        if isinstance(event, BlockStart):
            self._kinds[event.index] = event.block_type
            block: dict[str, Any]
            if event.block_type == "text":
                block = {"type": "text", "text": ""}
            elif event.block_type == "thinking":
                block = {"type": "thinking", "thinking": "", "signature": ""}
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
            return [("content_block_stop", {"type": "content_block_stop", "index": event.index})]
        # MessageEnd. Usage counts on message_delta are cumulative; input_tokens is repeated
        # there because providers other than Anthropic only know it at the end.
        usage = {
            "input_tokens": event.usage.input_tokens,
            "output_tokens": event.usage.output_tokens,
        }
        delta_event = {
            "type": "message_delta",
            "delta": {"stop_reason": event.stop_reason, "stop_sequence": None},
            "usage": usage,
        }
        return [("message_delta", delta_event), ("message_stop", {"type": "message_stop"})]

    def encode(self, event: StreamEvent) -> bytes:
        """`feed`, framed as SSE bytes."""
        return b"".join(sse_event(name, data) for name, data in self.feed(event))


# --- client side: a request to an Anthropic-format upstream ----------------------------------
def _image_source(block: ImageBlock) -> dict[str, Any]:
    if block.data is not None:
        return {"type": "base64", "media_type": block.media_type or "image/png", "data": block.data}
    url = block.url or ""
    if url.startswith("data:"):
        # OpenAI-style data URL: Anthropic takes only http(s) URLs, so send it inline.
        header, _, data = url.partition(",")
        media_type = header.removeprefix("data:").split(";")[0] or "image/png"
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _request_block(block: Block) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        # Anthropic rejects empty text blocks.
        return {"type": "text", "text": block.text} if block.text else None
    if isinstance(block, ImageBlock):
        return {"type": "image", "source": _image_source(block)}
    if isinstance(block, ThinkingBlock):
        # Anthropic verifies the signature of every thinking block sent back; reasoning from
        # another provider (no signature) cannot be replayed and is dropped.
        if not block.signature:
            return None
        return {"type": "thinking", "thinking": block.text, "signature": block.signature}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    content = [b for b in map(_request_block, block.content) if b is not None]
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.tool_use_id}
    if content:
        result["content"] = content
    if block.is_error:
        result["is_error"] = True
    return result


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


def encode_request(req: ChatRequest, *, stream: bool, model: str | None = None) -> dict[str, Any]:
    """A `ChatRequest` as a Messages API request body (for `model`, default `req.model`)."""
    body: dict[str, Any] = {
        "model": model or req.model,
        "max_tokens": req.max_tokens or DEFAULT_MAX_TOKENS,
        "messages": _messages(req.messages),
    }
    if req.system:
        body["system"] = req.system
    if req.tools:
        tools: list[dict[str, Any]] = []
        for tool in req.tools:
            entry: dict[str, Any] = {"name": tool.name}
            if tool.description:
                entry["description"] = tool.description
            entry["input_schema"] = _input_schema(tool.parameters)
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
        elif kind == "tool_use":
            tool_input = item.get("input")
            content.append(
                ToolUseBlock(
                    str(item.get("id", "")),
                    str(item.get("name", "")),
                    tool_input if isinstance(tool_input, dict) else {},
                )
            )
        # redacted_thinking and server-tool blocks have no internal equivalent.
    usage = _sub(body, "usage")
    saw_tool = any(isinstance(b, ToolUseBlock) for b in content)
    return ChatResponse(
        id=str(body.get("id", "")),
        model=str(body.get("model", "")),
        content=tuple(content),
        stop_reason=_stop_reason(body.get("stop_reason"), saw_tool),
        usage=Usage(_input_tokens(usage), _int(usage.get("output_tokens"))),
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
    Blocks with no internal equivalent (redacted thinking, server tools) are skipped and the
    remaining blocks renumbered 0, 1, 2..."""

    provider: str
    done: bool = False
    _index: dict[int, int | None] = field(default_factory=dict)
    _next: int = 0
    _input: dict[str, Any] = field(default_factory=dict)  # the input counts, latest values
    _output_tokens: int = 0
    _stop: Any = None
    _saw_tool: bool = False

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
        return [MessageStart(msg_id, model, _input_tokens(self._input))]

    def _on_content_block_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        upstream = _int(payload.get("index"))
        block = _sub(payload, "content_block")
        kind = block.get("type")
        if kind not in ("text", "thinking", "tool_use"):
            self._index[upstream] = None
            return []
        index, self._next = self._next, self._next + 1
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
        text = {
            "text_delta": delta.get("text"),
            "thinking_delta": delta.get("thinking"),
            "input_json_delta": delta.get("partial_json"),
        }.get(str(delta.get("type")))
        # signature_delta and citations_delta have no place in the internal stream.
        if not isinstance(text, str) or not text:
            return []
        return [BlockDelta(index, text)]

    def _on_content_block_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        index = self._index.get(_int(payload.get("index")))
        return [] if index is None else [BlockStop(index)]

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
        usage = Usage(_input_tokens(self._input), self._output_tokens)
        return [MessageEnd(_stop_reason(self._stop, self._saw_tool), usage)]
