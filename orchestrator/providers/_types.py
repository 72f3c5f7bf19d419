"""The one internal representation of a conversation that every adapter speaks.

Requests arrive in OpenAI chat-completions or Anthropic Messages format and are decoded into a
`ChatRequest`; an adapter turns that into its provider's wire format, and its answer back into
a `ChatResponse` (non-streaming) or a sequence of `StreamEvent`s (streaming). The endpoint then
encodes either into the caller's format. The stream model mirrors content blocks (text,
thinking, tool use) with explicit start/delta/stop, the most structured of the formats, so
every other format can be produced from it without guessing.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import unquote_to_bytes

from orchestrator.errors import (
    BadGateway,
    BadRequest,
    ErrorCode,
    Forbidden,
    GatewayTimeout,
    NotFound,
    OrchestratorError,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    Unprocessable,
)

__all__ = [
    "Block",
    "BlockDelta",
    "BlockStart",
    "BlockStop",
    "ChatRequest",
    "ChatResponse",
    "EmbedRequest",
    "Embeddings",
    "ImageBlock",
    "Message",
    "MessageEnd",
    "MessageStart",
    "ProviderAdapter",
    "ProviderConfig",
    "ProviderError",
    "StopReason",
    "StreamEvent",
    "TextBlock",
    "ThinkingBlock",
    "ToolDef",
    "ToolResultBlock",
    "ToolUseBlock",
    "Usage",
]

# Anthropic's vocabulary: the richest. OpenAI's finish_reason maps as
# end_turn/stop_sequence <-> stop, tool_use <-> tool_calls, max_tokens <-> length,
# refusal <-> content_filter.
StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal"]


# --- content blocks ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image: inline base64 `data` with its `media_type`, or a `url` (exactly one)."""

    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    type: Literal["image"] = "image"

    def inline(self) -> tuple[str | None, str] | None:
        """(media type, base64 bytes) of an image sent inline, a `data:` URL included (its
        percent-encoded bytes encoded to base64); None for an image by http(s) URL."""
        if self.data:
            return self.media_type, self.data
        url = self.url or ""
        if not url.startswith("data:"):
            return None
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            payload = base64.b64encode(unquote_to_bytes(payload)).decode()
        return header[5:].split(";")[0] or None, payload


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    """Reasoning text (DeepSeek `reasoning_content`, Anthropic `thinking`)."""

    text: str
    signature: str | None = None
    type: Literal["thinking"] = "thinking"


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    """A tool call by the assistant. `input` is the parsed JSON arguments object."""

    id: str
    name: str
    input: dict[str, Any]
    type: Literal["tool_use"] = "tool_use"


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The result of a tool call, sent back by the user side."""

    tool_use_id: str
    content: tuple[TextBlock | ImageBlock, ...]
    is_error: bool = False
    type: Literal["tool_result"] = "tool_result"

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


Block = TextBlock | ImageBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


@dataclass(frozen=True, slots=True)
class Message:
    """One turn. System text is not a message: it is `ChatRequest.system`. Tool results are
    blocks of a `user` message (OpenAI's `role: tool` messages decode to that)."""

    role: Literal["user", "assistant"]
    content: tuple[Block, ...]

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    description: str | None
    parameters: dict[str, Any]  # JSON Schema of the arguments object


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What the caller asked for, in no provider's format.

    `tool_choice`: None (provider default), "auto", "none", "any" (must call some tool) or
    {"name": <tool>} (must call that one).
    """

    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    tools: tuple[ToolDef, ...] = ()
    tool_choice: str | dict[str, str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    user: str | None = None  # end-user id forwarded to providers that take one
    # Generation options beyond the above, keyed by their OpenAI name (`thinking`: Anthropic's);
    # each provider's declared table (`_params.py`) says which it honours and how.
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def with_model(self, model: str) -> ChatRequest:
        return _replace(self, model=model)


@dataclass(frozen=True, slots=True)
class ChatResponse:
    id: str
    model: str
    content: tuple[Block, ...]
    stop_reason: StopReason
    usage: Usage
    created: int = 0  # Unix seconds; 0 = now, filled by the encoder

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_calls(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]


# --- embeddings ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Texts to embed with `model`. `dimensions` asks for vectors of that size: an adapter
    passes it on where its provider can shorten vectors, else raises BadRequest."""

    model: str
    texts: tuple[str, ...]
    dimensions: int | None = None


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One vector per input text, in order; `input_tokens` as the provider counted them (0
    when it does not say)."""

    vectors: list[list[float]]
    input_tokens: int = 0


# --- streaming -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MessageStart:
    """First event of every stream. `input_tokens` when the provider tells it up front."""

    id: str
    model: str
    input_tokens: int = 0
    kind: Literal["message_start"] = "message_start"


@dataclass(frozen=True, slots=True)
class BlockStart:
    """A content block opens at `index` (0, 1, 2... in order; one block open at a time).
    `block_type` text/thinking carry no extra; tool_use carries `id` and `name`."""

    index: int
    block_type: Literal["text", "thinking", "tool_use"]
    id: str | None = None
    name: str | None = None
    kind: Literal["block_start"] = "block_start"


@dataclass(frozen=True, slots=True)
class BlockDelta:
    """More of the open block: `text` for text/thinking, a fragment of the JSON arguments
    string for tool_use (fragments concatenate to the full arguments object)."""

    index: int
    text: str
    kind: Literal["block_delta"] = "block_delta"


@dataclass(frozen=True, slots=True)
class BlockStop:
    index: int
    kind: Literal["block_stop"] = "block_stop"


@dataclass(frozen=True, slots=True)
class MessageEnd:
    """Last event of every successful stream, with the final usage (exact, from the
    provider) and stop reason."""

    stop_reason: StopReason
    usage: Usage
    kind: Literal["message_end"] = "message_end"


StreamEvent = MessageStart | BlockStart | BlockDelta | BlockStop | MessageEnd


# --- providers -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """One configured provider: a kind (`openai`, `anthropic`, ..., `custom`) and its
    connection. `name` is what metrics, health and errors call it: the kind, or a custom
    adapter's id. `extra` holds kind-specific settings (Bedrock's region and keys, a custom
    adapter's `format`). The key and `extra` (Bedrock's keys, Entra's client secret) are
    left out of the repr, so a logged config or a traceback never shows a secret."""

    name: str
    kind: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    models: tuple[str, ...] = ()
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict, repr=False)


class ProviderError(OrchestratorError):
    """An upstream call failed. `upstream_status` is the provider's HTTP status (0: no
    answer: connect error, timeout, broken stream); `retryable` says whether trying again
    (before any byte reached the caller) may succeed; `retry_after` from the provider."""

    status_code = 502
    default_code = ErrorCode.UPSTREAM_ERROR

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        upstream_status: int = 0,
        retryable: bool = False,
        retry_after: float | None = None,
        code: ErrorCode | str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        info = {"provider": provider, "upstream_status": upstream_status, **(extra or {})}
        super().__init__(message, code=code, extra=info, headers=headers)
        self.provider = provider
        self.upstream_status = upstream_status
        self.retryable = retryable
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_provider_error,
            (
                self.message,
                self.provider,
                self.upstream_status,
                self.retryable,
                self.retry_after,
                self.code,
            ),
        )

    @classmethod
    def from_status(
        cls,
        provider: str,
        status: int,
        message: str,
        retry_after: float | None = None,
    ) -> ProviderError:
        """The error for an upstream HTTP error status: retryable on 408/409/429/5xx."""
        retryable = status in (408, 409, 429) or status >= 500
        return cls(
            f"{provider}: {message}" if provider and not message.startswith(provider) else message,
            provider=provider,
            upstream_status=status,
            retryable=retryable,
            retry_after=retry_after,
        )

    @classmethod
    def no_embeddings(cls, provider: str, model: str) -> ProviderError:
        """The provider (or this model of it) has no embeddings endpoint: a 404, so the
        gateway tries the model's next route and the breaker is not charged."""
        return cls(
            f"{provider}: model {model!r} has no embeddings here (this provider serves no"
            " embeddings API for it)",
            provider=provider,
            upstream_status=404,
        )

    @classmethod
    def unreachable(cls, provider: str, detail: str) -> ProviderError:
        return cls(
            f"{provider}: unreachable: {detail}",
            provider=provider,
            retryable=True,
            code=ErrorCode.UPSTREAM_UNAVAILABLE,
        )

    @classmethod
    def timeout(cls, provider: str, detail: str = "timed out") -> ProviderError:
        return cls(
            f"{provider}: {detail}",
            provider=provider,
            retryable=True,
            code=ErrorCode.UPSTREAM_TIMEOUT,
        )

    def to_http(self) -> OrchestratorError:
        """The error the caller sees: a client error of the upstream keeps its status
        (400, 404, 413, 422, 429 with Retry-After); auth failures of *our* key and 5xx are
        502; no answer is 503 (unreachable) or 504 (timeout)."""
        s = self.upstream_status
        info = {"provider": self.provider, "upstream_status": s}
        if s == 429:
            return RateLimited(self.message, retry_after=int(self.retry_after or 1), extra=info)
        mapped: dict[int, type[OrchestratorError]] = {
            400: BadRequest,
            404: NotFound,
            413: PayloadTooLarge,
            422: Unprocessable,
        }
        if s in mapped:
            code = ErrorCode.MODEL_NOT_FOUND if s == 404 else None
            return mapped[s](self.message, code=code, extra=info)
        if s == 403 and "permission" in self.message.lower():
            return Forbidden(self.message, extra=info)
        if self.code == ErrorCode.UPSTREAM_TIMEOUT:
            return GatewayTimeout(self.message, extra=info)
        if self.code in (ErrorCode.UPSTREAM_UNAVAILABLE, ErrorCode.CIRCUIT_OPEN):
            return ServiceUnavailable(self.message, code=self.code, extra=info)
        return BadGateway(self.message, code=self.code, extra=info)


def _rebuild_provider_error(
    message: str,
    provider: str,
    status: int,
    retryable: bool,
    retry_after: float | None,
    code: str,
) -> ProviderError:
    return ProviderError(
        message,
        provider=provider,
        upstream_status=status,
        retryable=retryable,
        retry_after=retry_after,
        code=code,
    )


class ProviderAdapter(Protocol):
    """One provider's wire format. Built as `Adapter(config, http)` with a shared
    `httpx.AsyncClient`; raises `ProviderError` for every upstream failure (never a raw
    httpx exception). `stream` yields MessageStart, blocks, then MessageEnd; an upstream
    error mid-stream raises `ProviderError` from the iterator."""

    config: ProviderConfig

    async def complete(self, request: ChatRequest) -> ChatResponse: ...

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]: ...

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """The provider's embeddings, in its own wire format. A provider without embeddings
        raises `ProviderError.no_embeddings` (a 404 for the gateway: the next route is
        tried); `dimensions` it cannot honour raises BadRequest before any call."""
        ...

    async def probe(self) -> None:
        """A cheap reachability check (e.g. list models) with a short timeout; raises
        ProviderError when the provider cannot be reached or rejects our credentials."""
        ...


def _replace(req: ChatRequest, **changes: Any) -> ChatRequest:
    return dataclasses.replace(req, **changes)
