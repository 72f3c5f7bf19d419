"""The client side of the OpenAI format, for the adapters of OpenAI-compatible upstreams:
`encode_request` (the inverse of decoding a caller's request), `decode_response` for a
`chat.completion`, `ChunkDecoder` for the stream, and what upstream finish reasons mean.

Separate from the server side because it reads what many providers write (GLM, DeepSeek,
Qwen, llama-server, each with its documented variations) leniently, where the server side
decodes a caller strictly and writes exactly what OpenAI writes.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from orchestrator.providers._blocks import BlockWriter
from orchestrator.providers._openai_format.answer import wire_call
from orchestrator.providers._types import (
    Block,
    BlockDelta,
    ChatRequest,
    ChatResponse,
    DocumentBlock,
    ImageBlock,
    Message,
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
    "ChunkDecoder",
    "ReasoningPolicy",
    "decode_response",
    "encode_request",
    "stop_reason_of",
]

JSON = dict[str, Any]

# Which assistant `reasoning_content` goes back upstream: none, all, or only that of user
# turns in which the model called tools (DeepSeek's thinking mode requires exactly those).
ReasoningPolicy = Literal["drop", "keep", "tool_turns"]

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


def _part(block: TextBlock | ImageBlock | DocumentBlock) -> JSON:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        return _image_part(block)
    if block.text is not None:  # a plain-text document is text to the model
        return {"type": "text", "text": block.text}
    # OpenAI's `file` part: a PDF inline as a data URL (the table refuses URL documents).
    return {
        "type": "file",
        "file": {
            "filename": block.title or "document.pdf",
            "file_data": f"data:application/pdf;base64,{block.data or ''}",
        },
    }


def _encode_user(m: Message) -> list[JSON]:
    out: list[JSON] = []
    rest: list[TextBlock | ImageBlock | DocumentBlock] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text})
            rest.extend(c for c in b.content if isinstance(c, ImageBlock))
        elif isinstance(b, (TextBlock, ImageBlock, DocumentBlock)):
            rest.append(b)
    if rest or not out:
        if len(rest) == 1 and isinstance(rest[0], TextBlock):
            content: str | list[JSON] = rest[0].text
        elif not rest:
            content = ""
        else:
            content = [_part(b) for b in rest]
        out.append({"role": "user", "content": content})
    return out


def _encode_assistant(m: Message, *, keep_reasoning: bool) -> JSON:
    text = m.text
    calls = [wire_call(b) for b in m.content if isinstance(b, ToolUseBlock)]
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
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        int(raw.get("prompt_tokens") or 0),
        int(raw.get("completion_tokens") or 0),
        # OpenAI caches prompts on its own: what it read is ours to report as cache_read.
        cache_read_input_tokens=cached if isinstance(cached, int) else 0,
    )


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
        logprobs=choice["logprobs"] if isinstance(choice.get("logprobs"), dict) else None,
    )


def _with_logprobs(
    events: list[StreamEvent], logprobs: tuple[dict[str, Any], ...]
) -> list[StreamEvent]:
    """The chunk's events with its logprobs on its text delta (a chunk carries the
    logprobs of the tokens it carries; a chunk without text keeps none)."""
    for i in range(len(events) - 1, -1, -1):
        event = events[i]
        if isinstance(event, BlockDelta):
            events[i] = dataclasses.replace(event, logprobs=logprobs)
            break
    return events


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
                events = self._delta(choice.get("delta") or {})
                logprobs = choice.get("logprobs")
                if isinstance(logprobs, dict) and logprobs.get("content"):
                    events = _with_logprobs(events, tuple(logprobs["content"]))
                out.extend(events)
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
