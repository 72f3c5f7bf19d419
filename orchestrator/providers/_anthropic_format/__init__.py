"""The Anthropic Messages wire format, both ways. Pure: no I/O.

Server side (our `POST /api/v1/messages`): `decode_request` turns a Messages request into a
`ChatRequest` (`request`); `encode_response` and `EventEncoder` turn our answer into a Message
object or the exact SSE event sequence (`message_start`, `content_block_start`,
`content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`), framed by
`sse_event`; `PING` and `error_event` are Anthropic's heartbeat and mid-stream error frames;
`error_body` is its error body (`answer`).

Client side (an Anthropic-format upstream, `upstream`): `encode_request`, `decode_response`
and `EventDecoder` (upstream SSE -> `StreamEvent`s, `event: error` -> `ProviderError`).
"""

from __future__ import annotations

from orchestrator.providers._anthropic_format.answer import (
    ERROR_STATUS,
    PING,
    EventEncoder,
    encode_response,
    error_body,
    error_event,
    error_type_for,
    sse_event,
)
from orchestrator.providers._anthropic_format.request import decode_request
from orchestrator.providers._anthropic_format.upstream import (
    ANTHROPIC_VERSION,
    DEFAULT_MAX_TOKENS,
    EventDecoder,
    count_body,
    decode_response,
    encode_request,
    native_body,
    stream_error,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "ERROR_STATUS",
    "PING",
    "EventDecoder",
    "EventEncoder",
    "count_body",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "error_body",
    "error_event",
    "error_type_for",
    "native_body",
    "sse_event",
    "stream_error",
]
