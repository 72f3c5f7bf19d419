"""What every adapter needs around httpx: error mapping, SSE/NDJSON framing, stream assembly."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import email.utils
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchestrator._json import dumps, loads
from orchestrator.providers import _client
from orchestrator.providers._client import UpstreamClient, UpstreamResponse, utf8_lines
from orchestrator.providers._types import (
    Block,
    BlockDelta,
    BlockStart,
    BlockStop,
    ChatResponse,
    MessageEnd,
    MessageStart,
    ProviderError,
    RedactedThinkingBlock,
    StopReason,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)

__all__ = [
    "StreamAssembler",
    "collect",
    "error_message",
    "iter_ndjson",
    "iter_sse",
    "json_answer",
    "json_object",
    "open_stream",
    "post_json",
    "response_events",
    "retry_after_of",
]


def retry_after_of(response: httpx.Response | UpstreamResponse) -> float | None:
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    # The other form RFC 9110 allows: an HTTP date.
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def error_message(body: bytes) -> str:
    """The human message inside a provider's error body, whatever its shape
    (`{error: {message}}`, `{error: "..."}`, `{message}`, `[{error: {...}}]` for Gemini)."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500] or "no body"
    if isinstance(data, list) and data:
        data = data[0]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("Message") or err.get("type")
            if msg:
                return str(msg)
        elif isinstance(err, str):
            # OAuth 2.0 token endpoints (Entra ID, Google): {error, error_description}
            description = data.get("error_description")
            return f"{err}: {description}" if description else err
        for key in ("message", "Message", "detail"):
            if data.get(key):
                return str(data[key])
    return json.dumps(data)[:500]


def _raise_for(provider: str, response: httpx.Response | UpstreamResponse, body: bytes) -> None:
    raise ProviderError.from_status(
        provider, response.status_code, error_message(body), retry_after_of(response)
    )


def _transport_error(provider: str, exc: httpx.HTTPError) -> ProviderError:
    # Under the aiohttp transport a refused connection arrives as httpx.ConnectTimeout whose
    # cause is an OSError (aiohttp's ClientConnectorError): the cause tells which it was.
    cause = exc.__cause__
    if isinstance(cause, TimeoutError) or (
        isinstance(exc, httpx.TimeoutException) and not isinstance(cause, OSError)
    ):
        return ProviderError.timeout(provider, f"timed out ({type(exc).__name__})")
    return ProviderError.unreachable(provider, f"{type(exc).__name__}: {exc}")


def _json_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """`headers` with `Content-Type: application/json` unless they set one (the body is
    encoded here, with orjson, rather than by httpx's `json=`)."""
    if any(name.lower() == "content-type" for name in headers):
        return headers
    return {**headers, "Content-Type": "application/json"}


async def post_json(
    http: httpx.AsyncClient,
    provider: str,
    url: str | httpx.URL,
    body: dict[str, Any] | bytes,
    headers: Mapping[str, str],
    request_timeout: httpx.Timeout | float | None = None,
) -> Any:
    """POST and return the decoded JSON answer; any failure is a `ProviderError`."""
    if isinstance(body, bytes):
        content = body
    else:
        content = dumps(body)
        headers = _json_headers(headers)
    session = http.session if isinstance(http, UpstreamClient) else None
    response: httpx.Response | UpstreamResponse
    if session is not None:
        timeout = _client.client_timeout(request_timeout, http.timeout)
        response = await _client.post(session(), provider, url, content, headers, timeout)
    else:
        kw: dict[str, Any] = {"headers": headers, "content": content}
        if request_timeout is not None:
            kw["timeout"] = request_timeout
        try:
            response = await http.post(url, **kw)
        except httpx.HTTPError as exc:
            raise _transport_error(provider, exc) from exc
    if response.status_code >= 400:
        _raise_for(provider, response, response.content)
    return json_answer(provider, response.content)


def json_answer(provider: str, raw: bytes) -> Any:
    """An upstream's successful answer decoded; a body that is not JSON is a `ProviderError`."""
    try:
        return loads(raw)
    except ValueError as exc:
        raise ProviderError(
            f"{provider}: answer is not JSON", provider=provider, upstream_status=200
        ) from exc


def json_object(provider: str, data: Any) -> dict[str, Any]:
    """`data` when it is a JSON object; any other answer is a `ProviderError`."""
    if not isinstance(data, dict):
        raise ProviderError(
            f"{provider}: answer is not an object", provider=provider, upstream_status=200
        )
    return data


@contextlib.asynccontextmanager
async def open_stream(
    http: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str | httpx.URL,
    *,
    json_body: dict[str, Any] | None = None,
    content: bytes | None = None,
    headers: Mapping[str, str],
    request_timeout: httpx.Timeout | float | None = None,
) -> AsyncIterator[httpx.Response | UpstreamResponse]:
    """A streaming request whose status is checked (error bodies read and raised as
    `ProviderError`) before the caller sees the response; transport errors while the
    caller reads are turned into `ProviderError` too."""
    if json_body is not None:
        content = dumps(json_body)
        headers = _json_headers(headers)
    session = http.session if isinstance(http, UpstreamClient) else None
    if session is not None:
        timeout = _client.client_timeout(request_timeout, http.timeout)
        async with _client.stream(
            session(), provider, method, url, content, headers, timeout
        ) as direct:
            if direct.status_code >= 400:
                _raise_for(provider, direct, await direct.aread())
            yield direct
        return
    kw: dict[str, Any] = {"headers": headers}
    if content is not None:
        kw["content"] = content
    if request_timeout is not None:
        kw["timeout"] = request_timeout
    try:
        async with http.stream(method, url, **kw) as response:
            if response.status_code >= 400:
                _raise_for(provider, response, await response.aread())
            yield response
    except httpx.HTTPError as exc:
        raise _transport_error(provider, exc) from exc


async def iter_sse(
    response: httpx.Response | UpstreamResponse,
) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a text/event-stream body, per the WHATWG framing: `data:`
    lines join with newlines, a blank line ends an event, comments are skipped. Decoded as
    UTF-8 from the bytes, also under httpx (Gemini), which would honour a wrong declared
    charset."""
    event, data = "", list[str]()
    async for line in utf8_lines(response.aiter_bytes()):
        if line == "":
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", list[str]()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:
        yield event or "message", "\n".join(data)


async def iter_ndjson(response: httpx.Response | UpstreamResponse) -> AsyncIterator[Any]:
    """The JSON values of an NDJSON body (Ollama's `application/x-ndjson`, no charset), one a
    line, decoded as UTF-8 from the bytes."""
    async for line in utf8_lines(response.aiter_bytes()):
        if line.strip():
            yield json.loads(line)


@dataclass
class StreamAssembler:
    """Builds a `ChatResponse` from stream events (for callers that stream internally but
    answer in one piece, and for tests)."""

    id: str = ""
    model: str = ""
    input_tokens: int = 0
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    end: MessageEnd | None = None

    def feed(self, event: StreamEvent) -> None:
        if isinstance(event, MessageStart):
            self.id, self.model, self.input_tokens = event.id, event.model, event.input_tokens
        elif isinstance(event, BlockStart):
            self.blocks[event.index] = {
                "type": event.block_type,
                "id": event.id,
                "name": event.name,
                "data": event.data,
                "signature": None,
                "parts": [],
            }
        elif isinstance(event, BlockDelta):
            self.blocks[event.index]["parts"].append(event.text)
        elif isinstance(event, MessageEnd):
            self.end = event
        elif isinstance(event, BlockStop):
            if event.signature is not None and event.index in self.blocks:
                self.blocks[event.index]["signature"] = event.signature

    def result(self) -> ChatResponse:
        if self.end is None:
            raise ProviderError("stream ended without a final message event")
        content: list[Block] = []
        for index in sorted(self.blocks):
            b = self.blocks[index]
            text = "".join(b["parts"])
            if b["type"] == "text":
                content.append(TextBlock(text))
            elif b["type"] == "thinking":
                content.append(ThinkingBlock(text, b["signature"]))
            elif b["type"] == "redacted_thinking":
                content.append(RedactedThinkingBlock(b["data"] or ""))
            else:
                content.append(ToolUseBlock(b["id"] or "", b["name"] or "", _args(text)))
        usage = self.end.usage
        if not usage.input_tokens and self.input_tokens:
            usage = dataclasses.replace(usage, input_tokens=self.input_tokens)
        return ChatResponse(self.id, self.model, tuple(content), self.end.stop_reason, usage)


def _args(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


async def collect(events: AsyncIterator[StreamEvent]) -> ChatResponse:
    assembler = StreamAssembler()
    async for event in events:
        assembler.feed(event)
    return assembler.result()


def response_events(response: ChatResponse) -> Iterable[StreamEvent]:
    """A complete response replayed as a stream (for a provider answered non-streaming)."""
    usage = response.usage
    yield MessageStart(
        response.id,
        response.model,
        usage.input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
    )
    for index, block in enumerate(response.content):
        if isinstance(block, TextBlock):
            yield BlockStart(index, "text")
            yield BlockDelta(index, block.text)
        elif isinstance(block, ThinkingBlock):
            yield BlockStart(index, "thinking")
            yield BlockDelta(index, block.text)
            yield BlockStop(index, signature=block.signature)
            continue
        elif isinstance(block, RedactedThinkingBlock):
            yield BlockStart(index, "redacted_thinking", data=block.data)
        elif isinstance(block, ToolUseBlock):
            yield BlockStart(index, "tool_use", block.id, block.name)
            yield BlockDelta(index, json.dumps(block.input))
        else:
            continue
        yield BlockStop(index)
    stop: StopReason = response.stop_reason
    yield MessageEnd(stop, response.usage)
