"""The OpenAI chat-completions wire format <-> the internal conversation model.

Pure functions and small state machines, no I/O.

Server side (our `POST /chat/completions`): `decode_request` + `wants_usage` read a caller's
body (`request`); `encode_response` writes a `chat.completion` object; `ChunkEncoder` turns
stream events into `chat.completion.chunk` objects, each written as `sse_data(chunk)`, the
stream ending with `SSE_DONE`; `encode_error` is OpenAI's error body (`answer`).

Client side (adapters of OpenAI-compatible upstreams, `upstream`): `encode_request` is the
inverse of `decode_request`; `decode_response` reads a `chat.completion`; `ChunkDecoder`
turns upstream chunks into stream events.

Mapping notes: system/developer messages join into `ChatRequest.system`; `role: tool` messages
become `ToolResultBlock`s of a user message (consecutive ones, and a user message right after
them, merge into one user message, as the Messages format requires); `reasoning_content`
is a `ThinkingBlock`. OpenAI has no `is_error` on tool results: it is dropped on the way out.
"""

from __future__ import annotations

from orchestrator.providers._openai_format.answer import (
    FINISH_REASONS,
    SSE_DONE,
    ChunkEncoder,
    encode_error,
    encode_response,
    sse_data,
)
from orchestrator.providers._openai_format.request import decode_request, wants_usage
from orchestrator.providers._openai_format.upstream import (
    ChunkDecoder,
    ReasoningPolicy,
    decode_response,
    encode_request,
    stop_reason_of,
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
