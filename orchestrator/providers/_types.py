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
    "DocumentBlock",
    "EmbedRequest",
    "Embeddings",
    "ImageBlock",
    "Message",
    "MessageEnd",
    "MessageStart",
    "NativeRequest",
    "ProviderAdapter",
    "ProviderConfig",
    "ProviderError",
    "RedactedThinkingBlock",
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
    # Anthropic's prompt-caching breakpoint on this block ({"type": "ephemeral", "ttl"?}):
    # honoured by Anthropic and Bedrock, dropped and listed elsewhere (see `_params`).
    cache_control: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image: inline base64 `data` with its `media_type`, or a `url` (exactly one)."""

    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    type: Literal["image"] = "image"
    cache_control: dict[str, Any] | None = None

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
class RedactedThinkingBlock:
    """Anthropic's encrypted reasoning (`data`): only Anthropic can read it, so it goes back
    to an Anthropic-format upstream unchanged and to no other provider."""

    data: str
    type: Literal["redacted_thinking"] = "redacted_thinking"


@dataclass(frozen=True, slots=True)
class DocumentBlock:
    """A document in a user turn: a PDF as base64 `data` (`media_type` application/pdf),
    plain `text` (media type text/plain), a PDF by `url`, or an Anthropic `file_id`: exactly
    one. `title` and `context` are Anthropic's; `citations` its citations config (passed to
    Anthropic only)."""

    media_type: str | None = None
    data: str | None = None
    text: str | None = None
    url: str | None = None
    title: str | None = None
    context: str | None = None
    citations: dict[str, Any] | None = None
    type: Literal["document"] = "document"
    cache_control: dict[str, Any] | None = None
    file_id: str | None = None  # Anthropic's Files API (`source.type: file`): Anthropic only


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    """A tool call by the assistant. `input` is the parsed JSON arguments object."""

    id: str
    name: str
    input: dict[str, Any]
    type: Literal["tool_use"] = "tool_use"
    cache_control: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The result of a tool call, sent back by the user side."""

    tool_use_id: str
    content: tuple[TextBlock | ImageBlock | DocumentBlock, ...]
    is_error: bool = False
    type: Literal["tool_result"] = "tool_result"
    cache_control: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
)


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
    cache_control: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts. `input_tokens` is the whole prompt (OpenAI's prompt_tokens), the cached
    parts included: `cache_read_input_tokens` read from a prompt cache, and
    `cache_creation_input_tokens` written to one (Anthropic and Bedrock report both; OpenAI
    and Gemini, which cache on their own, report reads)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

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
    # Cache breakpoints of the system prompt, by its text blocks (Anthropic's `system` array);
    # `system` stays the joined text every adapter reads.
    system_blocks: tuple[TextBlock, ...] = ()
    # The caller's own Messages request, for an Anthropic-format upstream to receive verbatim.
    native: NativeRequest | None = field(default=None, compare=False)

    def with_model(self, model: str) -> ChatRequest:
        return _replace(self, model=model)


@dataclass(frozen=True, slots=True)
class NativeRequest:
    """A Messages API request as the caller sent it: the body, its `anthropic-beta` header
    and whether it came with `?beta=true`. An Anthropic-format upstream gets exactly this
    (model replaced by the route's), so every field and block Anthropic documents, beta ones
    included, reaches it unchanged; other providers get the decoded `ChatRequest`."""

    body: dict[str, Any]
    beta_header: str | None = None
    beta_query: bool = False


@dataclass(frozen=True, slots=True)
class ChatResponse:
    id: str
    model: str
    content: tuple[Block, ...]
    stop_reason: StopReason
    usage: Usage
    created: int = 0  # Unix seconds; 0 = now, filled by the encoder
    # OpenAI's `choices[0].logprobs` object ({content: [...], refusal}) when asked and given.
    logprobs: dict[str, Any] | None = None
    # An Anthropic-format upstream's Message as it came, for a caller that sent its own
    # Messages body (`ChatRequest.native`): answered verbatim, server-tool blocks, citations
    # and context_management included.
    native: dict[str, Any] | None = field(default=None, compare=False)

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
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


@dataclass(frozen=True, slots=True)
class BlockStart:
    """A content block opens at `index` (0, 1, 2... in order; one block open at a time).
    `block_type` text/thinking carry no extra; tool_use carries `id` and `name`;
    redacted_thinking (Anthropic's, whole at its start: no deltas) its encrypted `data`.
    Encoders of formats without redacted reasoning skip that block."""

    index: int
    block_type: Literal["text", "thinking", "tool_use", "redacted_thinking"]
    id: str | None = None
    name: str | None = None
    kind: Literal["block_start"] = "block_start"
    data: str | None = None


@dataclass(frozen=True, slots=True)
class BlockDelta:
    """More of the open block: `text` for text/thinking, a fragment of the JSON arguments
    string for tool_use (fragments concatenate to the full arguments object)."""

    index: int
    text: str
    kind: Literal["block_delta"] = "block_delta"
    # OpenAI's logprobs entries ({token, logprob, bytes, top_logprobs}) of this text, when
    # the caller asked for them and the provider gave them.
    logprobs: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True, slots=True)
class BlockStop:
    """The block at `index` is complete. `signature`: a thinking block's (Anthropic's
    signature_delta), which a caller must send back with the block."""

    index: int
    kind: Literal["block_stop"] = "block_stop"
    signature: str | None = None


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
