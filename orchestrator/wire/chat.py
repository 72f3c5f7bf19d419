"""Chat as the gateway answers it: OpenAI's chat completions (whole and streamed), its
Responses API (issue 34) and Anthropic's messages. The gateway writes these bodies itself
(they are the providers' formats, orchestrator/providers); the models are what a client
reads, checked against OpenAI's published schemas (tests/unit/test_sdk_openapi.py)."""

from __future__ import annotations

from typing import Any

from orchestrator.wire._base import ApiModel

__all__ = [
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "ChunkChoice",
    "Message",
    "MessageStreamEvent",
    "MessageTokenCount",
    "ModelResponse",
    "ResponseDeleted",
    "ResponseItemList",
    "Usage",
]


class ChatMessage(ApiModel):
    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(ApiModel):
    index: int
    message: ChatMessage
    finish_reason: str | None = None


class Usage(ApiModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatCompletion(ApiModel):
    """OpenAI's CreateChatCompletionResponse (the fields this service fills)."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChunkChoice(ApiModel):
    index: int
    delta: dict[str, Any]
    finish_reason: str | None = None


class ChatCompletionChunk(ApiModel):
    """One `data:` chunk of a streamed chat completion (the last may carry only usage)."""

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Message(ApiModel):
    """Anthropic's Messages response: `content` is a list of blocks (text, tool_use)."""

    id: str
    type: str = "message"
    role: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None = None
    usage: dict[str, Any]

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")


class MessageTokenCount(ApiModel):
    """Anthropic's count_tokens answer: the prompt's tokens (the header
    X-Orchestrator-Token-Count says whether the provider counted or the gateway estimated)."""

    input_tokens: int


class MessageStreamEvent(ApiModel):
    """One event of a streamed message (message_start, content_block_delta, ...); the rest of
    the event's fields are kept as extra attributes (`.delta`, `.message`, `.index`)."""

    type: str


class ModelResponse(ApiModel):
    """OpenAI's Response object (`POST /responses`, `GET /responses/{id}`): `output` items
    (message, reasoning, function_call...) as dicts; every other field kept as an extra
    attribute (`.instructions`, `.tools`, `.metadata`...)."""

    id: str
    object: str = "response"
    created_at: float
    status: str | None = None
    model: str
    output: list[dict[str, Any]]
    previous_response_id: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def output_text(self) -> str:
        return "".join(
            part.get("text", "")
            for item in self.output
            if item.get("type") == "message"
            for part in item.get("content", [])
            if part.get("type") == "output_text"
        )


class ResponseDeleted(ApiModel):
    """`DELETE /responses/{id}`: `{id, object: "response", deleted: true}`."""

    id: str
    object: str = "response"
    deleted: bool


class ResponseItemList(ApiModel):
    """`GET /responses/{id}/input_items`: a page of the response's input items."""

    object: str = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool
