"""Our answers in the OpenAI format: a `chat.completion` object, the `chat.completion.chunk`
stream and its SSE framing, and OpenAI's error body.

Separate from decoding (it never judges input) and from the upstream side (it writes what
OpenAI's own API writes, field for field, so the official SDKs read it). The wire shape of a
tool call (`wire_call`) is shared with the upstream side, which sends the same shape back in
an assistant message.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from orchestrator._json import dumps
from orchestrator.providers._types import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatResponse,
    MessageEnd,
    MessageStart,
    StopReason,
    StreamEvent,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

__all__ = [
    "FINISH_REASONS",
    "SSE_DONE",
    "ChunkEncoder",
    "encode_error",
    "encode_response",
    "sse_data",
    "wire_call",
]

JSON = dict[str, Any]

FINISH_REASONS: dict[StopReason, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}

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


def _completion_id(upstream_id: str) -> str:
    if upstream_id.startswith("chatcmpl-"):
        return upstream_id
    return f"chatcmpl-{upstream_id or uuid.uuid4().hex}"


def _usage(usage: Usage) -> JSON:
    out: JSON = {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cache_read_input_tokens:
        # OpenAI's count of prompt tokens read from its cache (part of prompt_tokens).
        out["prompt_tokens_details"] = {"cached_tokens": usage.cache_read_input_tokens}
    return out


def _finish(stop: StopReason, called_tools: bool) -> str:
    reason = FINISH_REASONS[stop]
    # A caller's SDK loop acts on tool_calls: never hide calls behind a plain stop.
    return "tool_calls" if called_tools and reason == "stop" else reason


def wire_call(b: ToolUseBlock) -> JSON:
    """A tool call as an assistant message carries it (arguments as a JSON string)."""
    arguments = json.dumps(b.input, ensure_ascii=False)
    return {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": arguments}}


def encode_response(resp: ChatResponse, model: str) -> JSON:
    """A `ChatResponse` as OpenAI's `chat.completion` object."""
    calls = [wire_call(b) for b in resp.tool_calls]
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
                "logprobs": resp.logprobs,
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

    def _chunk(
        self,
        delta: JSON,
        finish_reason: str | None = None,
        logprobs: tuple[JSON, ...] | None = None,
    ) -> JSON:
        lp = None if logprobs is None else {"content": list(logprobs), "refusal": None}
        chunk: JSON = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
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
                out.append(self._chunk({"content": event.text}, logprobs=event.logprobs))
        elif isinstance(event, MessageEnd):
            out.append(self._chunk({}, _finish(event.stop_reason, bool(self._tool_index))))
            if self.include_usage:
                usage = event.usage
                if not usage.input_tokens and self._input_tokens:
                    usage = dataclasses.replace(usage, input_tokens=self._input_tokens)
                out.append({**self._chunk({}), "choices": [], "usage": _usage(usage)})
        elif isinstance(event, BlockStop):
            pass
        return out
