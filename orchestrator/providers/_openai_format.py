"""The OpenAI chat-completions wire format <-> the internal conversation model.

Pure functions and small state machines, no I/O.

Server side (our `POST /chat/completions`): `decode_request` + `wants_usage` read a caller's
body; `encode_response` writes a `chat.completion` object; `ChunkEncoder` turns stream events
into `chat.completion.chunk` objects, each written as `sse_data(chunk)`, the stream ending with
`SSE_DONE`; `encode_error` is OpenAI's error body.

Client side (adapters of OpenAI-compatible upstreams): `encode_request` is the inverse of
`decode_request`; `decode_response` reads a `chat.completion`; `ChunkDecoder` turns upstream
chunks into stream events.

Mapping notes: system/developer messages join into `ChatRequest.system`; `role: tool` messages
become `ToolResultBlock`s of a user message (consecutive ones, and a user message right after
them, merge into one user message, as the Messages format requires); `reasoning_content`
is a `ThinkingBlock`. OpenAI has no `is_error` on tool results: it is dropped on the way out.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal, NoReturn

from orchestrator._json import dumps
from orchestrator.errors import ValidationFailed
from orchestrator.providers._blocks import BlockWriter
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
    "FINISH_REASONS",
    "SSE_DONE",
    "ChunkDecoder",
    "ChunkEncoder",
    "ReasoningPolicy",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_request",
    "encode_response",
    "sse_data",
    "stop_reason_of",
    "wants_usage",
]

JSON = dict[str, Any]

# Which assistant `reasoning_content` goes back upstream: none, all, or only that of user
# turns in which the model called tools (DeepSeek's thinking mode requires exactly those).
ReasoningPolicy = Literal["drop", "keep", "tool_turns"]

FINISH_REASONS: dict[StopReason, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}

# Upstream finish_reason -> ours. `sensitive` is GLM's content filter; `function_call` the
# legacy name of `tool_calls`.
_UPSTREAM_STOP: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
    "sensitive": "refusal",
}
# finish_reasons that mean the generation broke (GLM's `network_error`, DeepSeek's
# `insufficient_system_resource`): the answer is unusable, and trying again may work.
_FAILED_FINISH = frozenset({"network_error", "insufficient_system_resource"})

SSE_DONE = b"data: [DONE]\n\n"


def sse_data(obj: Any) -> bytes:
    """One SSE frame holding `obj` as compact JSON, as OpenAI writes them."""
    return b"data: " + dumps(obj) + b"\n\n"


def encode_error(
    message: str, *, status: int = 400, code: str | None = None, param: str | None = None
) -> JSON:
    """OpenAI's error body `{error: {message, type, param, code}}`."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def stop_reason_of(finish_reason: Any, provider: str = "") -> StopReason:
    """Our stop reason for an upstream `finish_reason`; a broken generation raises."""
    if finish_reason in _FAILED_FINISH:
        raise ProviderError(
            f"{provider}: generation failed upstream (finish_reason {finish_reason})",
            provider=provider,
            retryable=True,
        )
    if isinstance(finish_reason, str):
        return _UPSTREAM_STOP.get(finish_reason, "end_turn")
    return "end_turn"


# --- decoding a caller's request ----------------------------------------------------------
def _invalid(field: str, message: str) -> NoReturn:
    raise ValidationFailed(
        f"invalid request: {field}: {message}",
        extra={"fields": [{"field": field, "message": message}]},
    )


def wants_usage(body: Any) -> bool:
    """True when a streaming caller asked for the final usage chunk."""
    if not isinstance(body, dict) or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def decode_request(body: Any) -> ChatRequest:
    """A `POST /chat/completions` body as a `ChatRequest`; `ValidationFailed` (400) naming
    the field for anything malformed or unsupported."""
    if not isinstance(body, dict):
        _invalid("body", "must be a JSON object")
    model = body.get("model")
    if model is None:
        _invalid("model", "is required")
    if not isinstance(model, str) or not model.strip():
        _invalid("model", "must be a non-empty string")
    raw = body.get("messages")
    if raw is None:
        _invalid("messages", "is required")
    if not isinstance(raw, list) or not raw:
        _invalid("messages", "must be a non-empty array")
    system, messages = _decode_messages(raw)
    if not messages:
        _invalid("messages", "must hold at least one user or assistant message")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        _invalid("stream", "must be a boolean")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        _invalid("user", "must be a string")
    return ChatRequest(
        model=model,
        messages=tuple(messages),
        system=system,
        tools=_decode_tools(body.get("tools")),
        tool_choice=_decode_tool_choice(body.get("tool_choice")),
        max_tokens=_max_tokens(body),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        stop=_stop(body.get("stop")),
        stream=bool(stream),
        user=user,
        params=_params_of(body),
    )


# Each optional field's accepted JSON type (shape beyond that is the provider's to judge).
_PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "seed": (int,),
    "frequency_penalty": (int, float),
    "presence_penalty": (int, float),
    "logit_bias": (dict,),
    "response_format": (dict,),
    "reasoning_effort": (str,),
    "parallel_tool_calls": (bool,),
    "metadata": (dict,),
    "n": (int,),
    "user": (str,),
    # Kept for the providers' tables to decide (see `_params.PARAM_FIELDS`).
    "top_k": (int,),
    "service_tier": (str,),
    "store": (bool,),
    "prediction": (dict,),
    "prompt_cache_key": (str,),
    "prompt_cache_retention": (str,),
    "prompt_cache_options": (dict,),
    "safety_identifier": (str,),
    "verbosity": (str,),
    "logprobs": (bool,),
    "top_logprobs": (int,),
    "audio": (dict,),
    "modalities": (list,),
    "functions": (list,),
    "function_call": (str, dict),
    "moderation": (dict, str, bool),
    "web_search_options": (dict,),
}
# Every field a caller may send: the ones decoded into ChatRequest, then the optional ones.
# Anything else is a 400 naming it, as OpenAI answers an unrecognized argument: a field is
# never ignored silently.
_FIELDS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "user",
        "tools",
        "tool_choice",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        *_PARAM_TYPES,
    }
)


def _params_of(body: JSON) -> dict[str, Any]:
    """The optional generation fields the caller set (null = unset), type-checked."""
    for name in body:
        if name not in _FIELDS:
            _invalid(name, "unrecognized request argument (not a chat completions field)")
    out: dict[str, Any] = {}
    for name, types in _PARAM_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types:
            _invalid(name, "has the wrong type")
        if not isinstance(value, types):
            _invalid(name, "has the wrong type")
        out[name] = value
    if out.get("n") == 1:
        del out["n"]  # one choice: what every answer carries
    elif "n" in out and out["n"] < 1:
        _invalid("n", "must be at least 1")
    response_format = out.get("response_format")
    if response_format is not None:
        kind = response_format.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            _invalid("response_format.type", "must be text, json_object or json_schema")
        if kind == "text":
            del out["response_format"]  # the default of every provider
        elif kind == "json_schema" and not isinstance(response_format.get("json_schema"), dict):
            _invalid("response_format.json_schema", "is required for type json_schema")
    return out


class _Turns:
    """Collects messages; tool results join one user message with what follows them."""

    def __init__(self) -> None:
        self.items: list[tuple[Literal["user", "assistant"], list[Block]]] = []
        self._tool_group = False

    def user(self, blocks: list[Block]) -> None:
        if self._tool_group:
            self.items[-1][1].extend(blocks)
        else:
            self.items.append(("user", blocks))
        self._tool_group = False

    def tool_result(self, block: ToolResultBlock) -> None:
        if self._tool_group:
            self.items[-1][1].append(block)
        else:
            self.items.append(("user", [block]))
            self._tool_group = True

    def assistant(self, blocks: list[Block]) -> None:
        self.items.append(("assistant", blocks))
        self._tool_group = False


def _decode_messages(raw: list[Any]) -> tuple[str | None, list[Message]]:
    system: list[str] = []
    turns = _Turns()
    for i, m in enumerate(raw):
        field = f"messages[{i}]"
        if not isinstance(m, dict):
            _invalid(field, "must be an object")
        role = m.get("role")
        content = m.get("content")
        if role in ("system", "developer"):
            system.append(_plain_text(content, f"{field}.content"))
        elif role == "user":
            turns.user(_user_blocks(content, f"{field}.content"))
        elif role == "assistant":
            turns.assistant(_assistant_blocks(m, field))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                _invalid(f"{field}.tool_call_id", "is required for role 'tool'")
            text = _plain_text(content, f"{field}.content")
            parts = (TextBlock(text),) if text else ()
            turns.tool_result(ToolResultBlock(call_id, parts))
        elif role is None:
            _invalid(f"{field}.role", "is required")
        else:
            _invalid(f"{field}.role", f"unsupported role {role!r}")
    messages = [Message(role, tuple(blocks)) for role, blocks in turns.items]
    return ("\n\n".join(system) if system else None), messages


def _plain_text(content: Any, field: str) -> str:
    """Content that may only be text: a string, null, or an array of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _invalid(field, "must be a string or an array of content parts")
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            _invalid(f"{field}[{k}]", "only text parts are allowed here")
        texts.append(_text_part(part, f"{field}[{k}]"))
    return "".join(texts)


def _text_part(part: JSON, field: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        _invalid(f"{field}.text", "must be a string")
    return text


def _user_blocks(content: Any, field: str) -> list[Block]:
    if isinstance(content, str):
        return [TextBlock(content)]
    if content is None:
        _invalid(field, "is required for role 'user'")
    if not isinstance(content, list):
        _invalid(field, "must be a string or an array of content parts")
    blocks: list[Block] = []
    for k, part in enumerate(content):
        where = f"{field}[{k}]"
        if not isinstance(part, dict):
            _invalid(where, "must be an object")
        kind = part.get("type")
        if kind == "text":
            blocks.append(TextBlock(_text_part(part, where)))
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url"), f"{where}.image_url"))
        else:
            _invalid(f"{where}.type", f"unsupported content part type {kind!r}")
    return blocks


def _image(value: Any, field: str) -> ImageBlock:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        _invalid(f"{field}.url", "is required")
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        media_type = header.removesuffix(";base64")
        if not sep or not header.endswith(";base64") or not media_type.startswith("image/"):
            _invalid(f"{field}.url", "a data URL must be data:image/<type>;base64,<data>")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            _invalid(f"{field}.url", "the data URL does not hold valid base64")
        return ImageBlock(media_type=media_type, data=data)
    if url.startswith(("http://", "https://")):
        return ImageBlock(url=url)
    _invalid(f"{field}.url", "must be an http(s) URL or a data: URL")


def _assistant_blocks(m: JSON, field: str) -> list[Block]:
    blocks: list[Block] = []
    reasoning = m.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        _invalid(f"{field}.reasoning_content", "must be a string")
    if reasoning:
        blocks.append(ThinkingBlock(reasoning))
    content = m.get("content")
    if isinstance(content, list):
        texts: list[str] = []
        for k, part in enumerate(content):
            where = f"{field}.content[{k}]"
            if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
                _invalid(where, "only text and refusal parts are allowed for role 'assistant'")
            key = "text" if part["type"] == "text" else "refusal"
            value = part.get(key)
            if not isinstance(value, str):
                _invalid(f"{where}.{key}", "must be a string")
            texts.append(value)
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        _invalid(f"{field}.content", "must be a string, an array of parts or null")
    if content:
        blocks.append(TextBlock(content))
    calls = m.get("tool_calls")
    if calls is None:
        return blocks
    if not isinstance(calls, list):
        _invalid(f"{field}.tool_calls", "must be an array")
    for k, call in enumerate(calls):
        blocks.append(_tool_call(call, f"{field}.tool_calls[{k}]"))
    return blocks


def _tool_call(call: Any, field: str) -> ToolUseBlock:
    if not isinstance(call, dict):
        _invalid(field, "must be an object")
    if call.get("type", "function") != "function":
        _invalid(f"{field}.type", "must be 'function'")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        _invalid(f"{field}.id", "is required")
    fn = call.get("function")
    if not isinstance(fn, dict):
        _invalid(f"{field}.function", "is required")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        _invalid(f"{field}.function.name", "is required")
    args = fn.get("arguments")
    if isinstance(args, dict):
        return ToolUseBlock(call_id, name, args)
    if args is None or args == "":
        return ToolUseBlock(call_id, name, {})
    if not isinstance(args, str):
        _invalid(f"{field}.function.arguments", "must be a JSON string")
    try:
        parsed = json.loads(args)
    except ValueError:
        _invalid(f"{field}.function.arguments", "is not valid JSON")
    if not isinstance(parsed, dict):
        _invalid(f"{field}.function.arguments", "must encode a JSON object")
    return ToolUseBlock(call_id, name, parsed)


def _decode_tools(raw: Any) -> tuple[ToolDef, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        _invalid("tools", "must be an array")
    tools: list[ToolDef] = []
    for k, tool in enumerate(raw):
        field = f"tools[{k}]"
        if not isinstance(tool, dict):
            _invalid(field, "must be an object")
        if tool.get("type", "function") != "function":
            _invalid(f"{field}.type", "only 'function' tools are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            _invalid(f"{field}.function", "is required")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            _invalid(f"{field}.function.name", "is required")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            _invalid(f"{field}.function.description", "must be a string")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        elif not isinstance(params, dict):
            _invalid(f"{field}.function.parameters", "must be a JSON Schema object")
        tools.append(ToolDef(name, description, params))
    return tuple(tools)


def _decode_tool_choice(raw: Any) -> str | dict[str, str] | None:
    if raw is None:
        return None
    if raw in ("auto", "none"):
        return str(raw)
    if raw == "required":
        return "any"
    if isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            return {"name": name}
        _invalid("tool_choice.function.name", "is required")
    _invalid("tool_choice", "must be 'auto', 'none', 'required' or a function choice")


def _max_tokens(body: JSON) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _invalid(key, "must be a positive integer")
        return value
    return None


def _number(body: JSON, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _invalid(key, "must be a number")
    if not low <= value <= high:
        _invalid(key, f"must be between {low:g} and {high:g}")
    return float(value)


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return tuple(raw)
    _invalid("stop", "must be a string or an array of strings")


# --- encoding our answers -----------------------------------------------------------------
def _completion_id(upstream_id: str) -> str:
    if upstream_id.startswith("chatcmpl-"):
        return upstream_id
    return f"chatcmpl-{upstream_id or uuid.uuid4().hex}"


def _usage(usage: Usage) -> JSON:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def _finish(stop: StopReason, called_tools: bool) -> str:
    reason = FINISH_REASONS[stop]
    # A caller's SDK loop acts on tool_calls: never hide calls behind a plain stop.
    return "tool_calls" if called_tools and reason == "stop" else reason


def _wire_call(b: ToolUseBlock) -> JSON:
    arguments = json.dumps(b.input, ensure_ascii=False)
    return {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": arguments}}


def encode_response(resp: ChatResponse, model: str) -> JSON:
    """A `ChatResponse` as OpenAI's `chat.completion` object."""
    calls = [_wire_call(b) for b in resp.tool_calls]
    text = resp.text
    message: JSON = {
        "role": "assistant",
        "content": text if text or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    reasoning = "".join(b.text for b in resp.content if isinstance(b, ThinkingBlock))
    if reasoning:
        message["reasoning_content"] = reasoning
    return {
        "id": _completion_id(resp.id),
        "object": "chat.completion",
        "created": resp.created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish(resp.stop_reason, bool(calls)),
            }
        ],
        "usage": _usage(resp.usage),
    }


class ChunkEncoder:
    """Stream events -> `chat.completion.chunk` dicts, exactly as OpenAI streams them: a first
    chunk `{role: assistant, content: ""}`, content / `reasoning_content` deltas, tool calls
    (a first chunk with index, id, type, name and empty arguments, then argument fragments),
    a final chunk with an empty delta and the finish_reason, and with `include_usage` a last
    chunk with `choices: []` and the usage (`usage: null` on every other chunk)."""

    def __init__(
        self,
        model: str,
        include_usage: bool = False,
        *,
        id: str | None = None,
        created: int | None = None,
    ) -> None:
        self.model = model
        self.include_usage = include_usage
        self.id = id or ""
        self.created = created or int(time.time())
        self._started = False
        self._kinds: dict[int, str] = {}  # block index -> text/thinking/tool_use
        self._tool_index: dict[int, int] = {}  # block index -> OpenAI tool_calls index
        self._input_tokens = 0

    def _chunk(self, delta: JSON, finish_reason: str | None = None) -> JSON:
        chunk: JSON = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _start(self, upstream_id: str = "") -> list[JSON]:
        self._started = True
        self.id = self.id or _completion_id(upstream_id)
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, event: StreamEvent) -> list[JSON]:
        if isinstance(event, MessageStart):
            self._input_tokens = event.input_tokens
            return [] if self._started else self._start(event.id)
        out = [] if self._started else self._start()
        if isinstance(event, BlockStart):
            self._kinds[event.index] = event.block_type
            if event.block_type == "tool_use":
                i = self._tool_index[event.index] = len(self._tool_index)
                call = {
                    "index": i,
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name, "arguments": ""},
                }
                out.append(self._chunk({"tool_calls": [call]}))
        elif isinstance(event, BlockDelta):
            kind = self._kinds.get(event.index, "text")
            if kind == "tool_use":
                fragment = {
                    "index": self._tool_index[event.index],
                    "function": {"arguments": event.text},
                }
                out.append(self._chunk({"tool_calls": [fragment]}))
            elif kind == "thinking":
                out.append(self._chunk({"reasoning_content": event.text}))
            else:
                out.append(self._chunk({"content": event.text}))
        elif isinstance(event, MessageEnd):
            out.append(self._chunk({}, _finish(event.stop_reason, bool(self._tool_index))))
            if self.include_usage:
                usage = event.usage
                if not usage.input_tokens and self._input_tokens:
                    usage = Usage(self._input_tokens, usage.output_tokens)
                out.append({**self._chunk({}), "choices": [], "usage": _usage(usage)})
        elif isinstance(event, BlockStop):
            pass
        return out


# --- the client side: requests to OpenAI-compatible upstreams -----------------------------
def encode_request(
    req: ChatRequest,
    *,
    stream: bool,
    include_usage: bool = True,
    model: str | None = None,
    reasoning: ReasoningPolicy = "drop",
    max_tokens_field: str = "max_tokens",
) -> JSON:
    """A `ChatRequest` as a chat-completions body (the inverse of `decode_request`).

    Tool results become `role: tool` messages placed before the rest of their user turn
    (OpenAI wants them right after the assistant's calls); images inside tool results, which
    a tool message cannot carry, follow in that user message. `reasoning` picks which
    assistant thinking goes back as `reasoning_content`. `include_usage` (streaming only)
    asks for the final usage chunk."""
    messages: list[JSON] = []
    if req.system:
        messages.append({"role": "system", "content": req.system})
    keep = _reasoning_kept(req.messages, reasoning)
    for i, m in enumerate(req.messages):
        if m.role == "user":
            messages.extend(_encode_user(m))
        else:
            messages.append(_encode_assistant(m, keep_reasoning=i in keep))
    body: JSON = {"model": model or req.model, "messages": messages}
    if req.tools:
        body["tools"] = [_encode_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _encode_tool_choice(req.tool_choice)
    if req.max_tokens is not None:
        body[max_tokens_field] = req.max_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.stop:
        body["stop"] = list(req.stop)
    if req.user is not None:
        body["user"] = req.user
    body["stream"] = stream
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


def _is_turn_start(m: Message) -> bool:
    """A user message that the user wrote (not only tool results) starts a new turn."""
    return m.role == "user" and any(not isinstance(b, ToolResultBlock) for b in m.content)


def _reasoning_kept(messages: Sequence[Message], policy: ReasoningPolicy) -> set[int]:
    assistants = {i for i, m in enumerate(messages) if m.role == "assistant"}
    if policy == "keep":
        return assistants
    if policy == "drop":
        return set()
    kept: set[int] = set()
    turn: list[int] = []
    called = False
    for i, m in enumerate([*messages, Message("user", (TextBlock(""),))]):
        if _is_turn_start(m):
            if called:
                kept.update(turn)
            turn, called = [], False
        elif m.role == "assistant":
            turn.append(i)
            called = called or any(isinstance(b, ToolUseBlock) for b in m.content)
    return kept


def _image_part(block: ImageBlock) -> JSON:
    url = block.url or f"data:{block.media_type or 'image/png'};base64,{block.data or ''}"
    return {"type": "image_url", "image_url": {"url": url}}


def _encode_user(m: Message) -> list[JSON]:
    out: list[JSON] = []
    rest: list[TextBlock | ImageBlock] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text})
            rest.extend(c for c in b.content if isinstance(c, ImageBlock))
        elif isinstance(b, (TextBlock, ImageBlock)):
            rest.append(b)
    if rest or not out:
        if len(rest) == 1 and isinstance(rest[0], TextBlock):
            content: str | list[JSON] = rest[0].text
        elif not rest:
            content = ""
        else:
            content = [
                {"type": "text", "text": b.text} if isinstance(b, TextBlock) else _image_part(b)
                for b in rest
            ]
        out.append({"role": "user", "content": content})
    return out


def _encode_assistant(m: Message, *, keep_reasoning: bool) -> JSON:
    text = m.text
    calls = [_wire_call(b) for b in m.content if isinstance(b, ToolUseBlock)]
    msg: JSON = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    thinking = "".join(b.text for b in m.content if isinstance(b, ThinkingBlock))
    if keep_reasoning and thinking:
        msg["reasoning_content"] = thinking
    return msg


def _encode_tool(t: ToolDef) -> JSON:
    fn: JSON = {"name": t.name}
    if t.description is not None:
        fn["description"] = t.description
    fn["parameters"] = t.parameters
    return {"type": "function", "function": fn}


def _encode_tool_choice(choice: str | dict[str, str]) -> str | JSON:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return "required" if choice == "any" else choice


# --- the client side: answers of OpenAI-compatible upstreams ------------------------------
def _decode_usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0))


def _args(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if not isinstance(value, str) or not value.strip():
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        return {"_raw": value}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def _upstream_error(err: Any, provider: str) -> ProviderError:
    """An `error` object inside a 200 answer or a stream chunk."""
    if isinstance(err, dict):
        message = str(err.get("message") or err.get("type") or json.dumps(err))
        code, kind = err.get("code"), err.get("type")
    else:
        message, code, kind = str(err), None, None
    status = int(code) if isinstance(code, (int, str)) and str(code).isdigit() else 0
    if 400 <= status < 600:
        return ProviderError.from_status(provider, status, message)
    return ProviderError(
        f"{provider}: {message}",
        provider=provider,
        retryable=kind != "invalid_request_error",
    )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def decode_response(body: Any, provider: str) -> ChatResponse:
    """An upstream `chat.completion` object as a `ChatResponse`."""
    if not isinstance(body, dict):
        raise ProviderError(
            f"{provider}: answer is not a JSON object", provider=provider, upstream_status=200
        )
    if body.get("error"):
        raise _upstream_error(body["error"], provider)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError(
            f"{provider}: answer has no choices", provider=provider, upstream_status=200
        )
    choice = choices[0]
    message = choice.get("message") or {}
    content: list[Block] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append(ThinkingBlock(reasoning))
    text = _text_of(message.get("content"))
    if text:
        content.append(TextBlock(text))
    for k, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        content.append(
            ToolUseBlock(
                str(call.get("id") or f"call_{k}"),
                str(fn.get("name") or ""),
                _args(fn.get("arguments")),
            )
        )
    stop = stop_reason_of(choice.get("finish_reason"), provider)
    if stop == "end_turn" and any(isinstance(b, ToolUseBlock) for b in content):
        stop = "tool_use"
    return ChatResponse(
        id=str(body.get("id") or ""),
        model=str(body.get("model") or ""),
        content=tuple(content),
        stop_reason=stop,
        usage=_decode_usage(body.get("usage")),
        created=int(body.get("created") or 0),
    )


class ChunkDecoder:
    """Upstream `chat.completion.chunk` dicts -> stream events. `feed` each chunk, then
    `finish()` at `[DONE]` or the end of the body. Usage may come in a usage-only final chunk
    (`choices: []`, OpenAI's include_usage) or on the last choice chunk (GLM, llama-server);
    either is kept, so MessageEnd waits for the end of the stream. An `error` object in a
    chunk, a broken generation, or a stream that ends before a finish_reason raise
    `ProviderError`."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self._writer = BlockWriter()
        self._started = False
        self._stop: StopReason | None = None
        self._usage = Usage()
        self._tools: set[object] = set()

    def feed(self, chunk: Any) -> list[StreamEvent]:
        if not isinstance(chunk, dict):
            raise ProviderError(
                f"{self.provider}: stream chunk is not a JSON object",
                provider=self.provider,
                retryable=True,
            )
        if chunk.get("error"):
            raise _upstream_error(chunk["error"], self.provider)
        out: list[StreamEvent] = []
        if not self._started:
            self._started = True
            out.append(MessageStart(str(chunk.get("id") or ""), str(chunk.get("model") or "")))
        if isinstance(chunk.get("usage"), dict):
            self._usage = _decode_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            try:
                out.extend(self._delta(choice.get("delta") or {}))
            except ValueError as exc:
                raise ProviderError(
                    f"{self.provider}: malformed stream: {exc}", provider=self.provider
                ) from exc
            if isinstance(choice.get("usage"), dict):
                self._usage = _decode_usage(choice["usage"])
            if choice.get("finish_reason"):
                self._stop = stop_reason_of(choice["finish_reason"], self.provider)
        return out

    def _delta(self, delta: JSON) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            out.extend(self._writer.thinking(reasoning))
        content = delta.get("content")
        if isinstance(content, str):
            out.extend(self._writer.text(content))
        for k, call in enumerate(delta.get("tool_calls") or []):
            key = call.get("index", k)
            fn = call.get("function") or {}
            if key not in self._tools:
                self._tools.add(key)
                call_id = call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
                out.extend(self._writer.tool_start(key, str(call_id), str(fn.get("name") or "")))
            args = fn.get("arguments")
            if isinstance(args, dict):  # GLM may send the arguments as an object
                args = json.dumps(args, ensure_ascii=False)
            if isinstance(args, str):
                out.extend(self._writer.tool_args(key, args))
        return out

    def finish(self) -> list[StreamEvent]:
        if not self._started:
            raise ProviderError(
                f"{self.provider}: stream ended before any chunk",
                provider=self.provider,
                retryable=True,
            )
        if self._stop is None:
            raise ProviderError(
                f"{self.provider}: stream ended before its finish_reason",
                provider=self.provider,
                retryable=True,
            )
        return self._writer.finish(self._stop, self._usage)
