"""OpenAI's Responses API wire format (our `POST /api/v1/responses`) <-> the internal
conversation model. Pure: no I/O (the stored responses are `orchestrator.responses`).

`decode_request` judges a caller's body into a `ResponsesRequest` and `conversation`
builds the internal `ChatRequest` from it and a stored chain (`request`); its input items
are normalised to the stored shape and read into messages by `items`, its tools by `tools`;
`encode_response` writes the Response object (`answer`); `EventEncoder` turns stream events
into the typed SSE events (`stream`).

Server side only: no provider speaks the Responses API to us as an upstream.
"""

from __future__ import annotations

from orchestrator.providers._responses_format.answer import (
    deleted_body,
    encode_response,
    response_object,
    usage_body,
)
from orchestrator.providers._responses_format.items import item_id, items_to_messages
from orchestrator.providers._responses_format.request import (
    ResponsesRequest,
    conversation,
    decode_request,
)
from orchestrator.providers._responses_format.stream import EventEncoder, sse_event

__all__ = [
    "EventEncoder",
    "ResponsesRequest",
    "conversation",
    "decode_request",
    "deleted_body",
    "encode_response",
    "item_id",
    "items_to_messages",
    "response_object",
    "sse_event",
    "usage_body",
]
