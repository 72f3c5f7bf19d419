"""Amazon Bedrock Runtime's Converse API: `POST /model/{modelId}/converse` and
`/converse-stream`, SigV4-signed (service `bedrock`), the stream in the binary
`application/vnd.amazon.eventstream` framing.

Signing and frame decoding are botocore's (`SigV4Auth`, `EventStreamBuffer`): both are easy
to get subtly wrong by hand (double-encoded paths, CRCs), and botocore is what AWS tests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, NoReturn, cast
from urllib.parse import quote

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.eventstream import EventStreamBuffer, EventStreamMessage, ParserError

from orchestrator.errors import BadRequest
from orchestrator.providers import _params
from orchestrator.providers._blocks import BlockWriter, new_message_id
from orchestrator.providers._client import UpstreamResponse
from orchestrator.providers._http import json_answer, json_object, open_stream
from orchestrator.providers._params import Translate
from orchestrator.providers._registry import DEFAULT_BASE_URLS
from orchestrator.providers._types import (
    Block,
    ChatRequest,
    ChatResponse,
    DocumentBlock,
    Embeddings,
    EmbedRequest,
    ImageBlock,
    Message,
    MessageStart,
    ProviderConfig,
    ProviderError,
    RedactedThinkingBlock,
    StopReason,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

__all__ = ["BedrockAdapter", "EventStreamDecoder"]

SERVICE = "bedrock"
TITAN_CONCURRENCY = 8  # Titan embeds one text per InvokeModel call: this many calls at once
COHERE_BATCH = 96  # Cohere Embed's limit of texts per call
CHAIN_RETRY_S = 30.0  # how soon a default chain that found nothing is asked again

_STOP: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
    "stop_sequence": "stop_sequence",
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
}

# Exception events of ConverseStream -> (HTTP status AWS documents for them, retryable).
# modelStreamErrorException is a 424 whose documentation says "retry your request".
_STREAM_EXCEPTIONS: dict[str, tuple[int, bool]] = {
    "throttlingException": (429, True),
    "validationException": (400, False),
    "internalServerException": (500, True),
    "modelStreamErrorException": (424, True),
    "serviceUnavailableException": (503, True),
}

_IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}


class EventStreamDecoder:
    """Bytes of an `application/vnd.amazon.eventstream` body, in chunks of any size, to
    `(event_type, payload)` pairs. An exception or error frame raises its ProviderError; a
    damaged frame (bad length or CRC) raises one too."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self._buffer = EventStreamBuffer()
        self._pending = 0

    def feed(self, data: bytes) -> list[tuple[str, dict[str, Any]]]:
        self._buffer.add_data(data)
        self._pending += len(data)
        out: list[tuple[str, dict[str, Any]]] = []
        try:
            for message in self._buffer:
                msg = cast(EventStreamMessage, message)
                self._pending -= int(msg.prelude.total_length)
                out.append(self._event(msg))
        except ParserError as exc:
            raise ProviderError(
                f"{self.provider}: corrupt event stream: {exc}",
                provider=self.provider,
                upstream_status=200,
            ) from exc
        return out

    def finish(self) -> None:
        """The body ended: a partial frame left over means the stream was cut."""
        if self._pending:
            raise ProviderError(
                f"{self.provider}: event stream ended inside a frame",
                provider=self.provider,
                retryable=True,
            )

    def _event(self, message: EventStreamMessage) -> tuple[str, dict[str, Any]]:
        headers = cast(dict[str, Any], message.headers)
        kind = headers.get(":message-type")
        payload = _payload(bytes(message.payload))
        if kind == "event":
            return str(headers.get(":event-type", "")), payload
        if kind == "exception":
            name = str(headers.get(":exception-type", "exception"))
            status, retryable = _STREAM_EXCEPTIONS.get(name, (500, True))
            text = str(payload.get("message") or payload.get("Message") or name)
            return self._raise(name, text, status, retryable)
        code = str(headers.get(":error-code", "error"))
        text = str(headers.get(":error-message") or payload.get("message") or code)
        return self._raise(code, text, 500, True)

    def _raise(self, name: str, text: str, status: int, retryable: bool) -> NoReturn:
        error = ProviderError.from_status(self.provider, status, f"{name}: {text}")
        error.retryable = retryable
        raise error


def _payload(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


class BedrockAdapter:
    """Bedrock Runtime. Region and keys come from `config.extra` (`region`,
    `access_key_id`, `secret_access_key`, optional `session_token`); without keys, botocore's
    default credential chain (environment with AWS_SESSION_TOKEN, profile, SSO, container or
    instance role) is asked, again every CHAIN_RETRY_S while it finds nothing. Credentials
    that expire are refreshed by botocore, in a thread: a refresh calls STS or the metadata
    service, which must not stall the event loop."""

    # Converse's inferenceConfig has maxTokens/temperature/topP/stopSequences only; the rest
    # is per-model `additionalModelRequestFields`, so nothing optional is honoured: 400.
    params: Mapping[str, Translate] = _params.BEDROCK

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http
        self.region = str(config.extra.get("region") or "us-east-1")
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        key = config.extra.get("access_key_id")
        secret = config.extra.get("secret_access_key")
        self._static: Credentials | None = (
            Credentials(key, secret, config.extra.get("session_token")) if key and secret else None
        )
        self._chain: Credentials | None = None
        self._chain_at: float | None = None  # monotonic time the chain was last asked
        self._chain_lock = asyncio.Lock()

    # --- signing ---------------------------------------------------------------------------
    async def _credentials(self) -> ReadOnlyCredentials:
        if self._static is not None:
            return self._static.get_frozen_credentials()
        chain = await self._default_chain()
        if isinstance(chain, RefreshableCredentials) and chain.refresh_needed():
            # The refresh (STS, the metadata service, a credential process) blocks.
            return await asyncio.to_thread(chain.get_frozen_credentials)
        return chain.get_frozen_credentials()

    async def _default_chain(self) -> Credentials:
        def due() -> bool:
            at = self._chain_at
            return self._chain is None and (at is None or time.monotonic() - at >= CHAIN_RETRY_S)

        if due():
            async with self._chain_lock:
                if due():
                    # File and metadata-service lookups block: off the event loop.
                    self._chain = await asyncio.to_thread(_default_credentials)
                    self._chain_at = time.monotonic()
        if self._chain is None:
            name = self.config.name
            raise ProviderError(f"{name}: no AWS credentials configured", provider=name)
        return self._chain

    async def signed_headers(
        self, method: str, url: str, body: bytes, headers: dict[str, str]
    ) -> dict[str, str]:
        """`headers` plus Host, X-Amz-Date, (X-Amz-Security-Token) and a SigV4
        Authorization for service `bedrock` in the configured region."""
        host = httpx.URL(url).netloc.decode()
        request = AWSRequest(method=method, url=url, data=body, headers={**headers, "Host": host})
        SigV4Auth(await self._credentials(), SERVICE, self.region).add_auth(request)
        return {str(k): str(v) for k, v in request.headers.items()}

    # --- requests --------------------------------------------------------------------------
    def model_id(self, request: ChatRequest | EmbedRequest) -> str:
        """The request's model, or the configured `model_id` when the request names one of
        the aliases this provider is configured with."""
        configured = self.config.extra.get("model_id")
        if configured and (not request.model or request.model in self.config.models):
            return str(configured)
        return request.model

    def _url(self, request: ChatRequest | EmbedRequest, operation: str) -> str:
        # Model ids can be ARNs (':' and '/'): one path segment, percent-encoded as the AWS
        # SDKs do; SigV4 then encodes the path once more, as AWS expects for non-S3 services.
        return f"{self.config.base_url}/model/{quote(self.model_id(request), safe='')}/{operation}"

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        """The Converse / ConverseStream body for `request`."""
        messages: list[dict[str, Any]] = []
        for message in request.messages:
            content = _content(message)
            if not content:
                continue
            # Bedrock requires alternating roles: consecutive turns of one role are merged.
            if messages and messages[-1]["role"] == message.role:
                messages[-1]["content"].extend(content)
            else:
                messages.append({"role": message.role, "content": content})
        body: dict[str, Any] = {"messages": messages}
        if request.system_blocks:
            system: list[dict[str, Any]] = []
            for block in request.system_blocks:
                if block.text:
                    system.append({"text": block.text})
                _cache_point(system, block.cache_control)
            body["system"] = system
        elif request.system:
            body["system"] = [{"text": request.system}]
        inference: dict[str, Any] = {}
        if request.max_tokens is not None:
            inference["maxTokens"] = request.max_tokens
        if request.temperature is not None:
            inference["temperature"] = request.temperature
        if request.top_p is not None:
            inference["topP"] = request.top_p
        if request.stop:
            inference["stopSequences"] = list(request.stop)
        if inference:
            body["inferenceConfig"] = inference
        tool_config = _tool_config(request)
        if tool_config:
            body["toolConfig"] = tool_config
        return _params.apply(self, body, request.params)

    # --- the adapter protocol --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _post(
        self, url: str, body: dict[str, Any], accept: str = "application/json"
    ) -> AsyncIterator[httpx.Response | UpstreamResponse]:
        """A signed POST of `body` as JSON, its response open for the block."""
        payload = _dumps(body)
        headers = await self.signed_headers(
            "POST", url, payload, {"Content-Type": "application/json", "Accept": accept}
        )
        async with open_stream(
            self.http,
            self.config.name,
            "POST",
            url,
            content=payload,
            headers=headers,
            request_timeout=self._timeout,
        ) as response:
            yield response

    async def count_tokens(self, request: ChatRequest) -> int:
        """Bedrock's own count (CountTokens, `POST /model/{id}/count-tokens`) of the Converse
        request's messages, system prompt and tools."""
        body = self.build_body(request)
        converse = {k: body[k] for k in ("messages", "system", "toolConfig") if k in body}
        async with self._post(
            self._url(request, "count-tokens"), {"input": {"converse": converse}}
        ) as response:
            raw = await response.aread()
        data = json_object(self.config.name, json_answer(self.config.name, raw))
        count = data.get("inputTokens")
        if not isinstance(count, int) or isinstance(count, bool):
            raise ProviderError(
                f"{self.config.name}: malformed CountTokens answer",
                provider=self.config.name,
                upstream_status=200,
            )
        return count

    async def complete(self, request: ChatRequest) -> ChatResponse:
        name = self.config.name
        async with self._post(self._url(request, "converse"), self.build_body(request)) as response:
            raw = await response.aread()
            request_id = response.headers.get("x-amzn-requestid")
        data = json_object(name, json_answer(name, raw))
        message = (data.get("output") or {}).get("message") or {}
        content: list[Block] = []
        for block in message.get("content") or []:
            if "text" in block:
                content.append(TextBlock(str(block["text"])))
            elif "toolUse" in block:
                tool = block["toolUse"]
                args = tool.get("input")
                content.append(
                    ToolUseBlock(
                        str(tool["toolUseId"]),
                        str(tool["name"]),
                        args if isinstance(args, dict) else {"_value": args},
                    )
                )
            elif "reasoningContent" in block:
                reasoning = block["reasoningContent"].get("reasoningText")
                redacted = block["reasoningContent"].get("redactedContent")
                if isinstance(reasoning, dict):
                    content.append(
                        ThinkingBlock(str(reasoning.get("text") or ""), reasoning.get("signature"))
                    )
                elif isinstance(redacted, str):
                    content.append(RedactedThinkingBlock(redacted))
        stop = _STOP.get(str(data.get("stopReason")), "end_turn")
        if stop == "end_turn" and any(isinstance(b, ToolUseBlock) for b in content):
            stop = "tool_use"
        return ChatResponse(
            id=request_id or new_message_id(name),
            model=self.model_id(request),
            content=tuple(content),
            stop_reason=stop,
            usage=_usage(data.get("usage")),
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        name = self.config.name
        async with self._post(
            self._url(request, "converse-stream"),
            self.build_body(request),
            accept="application/vnd.amazon.eventstream",
        ) as response:
            message_id = response.headers.get("x-amzn-requestid") or new_message_id(name)
            decoder = EventStreamDecoder(name)
            writer = BlockWriter()
            started = False
            stop: StopReason | None = None
            usage = Usage()
            async for data in response.aiter_bytes():
                for event_type, event in decoder.feed(data):
                    if not started:
                        started = True
                        yield MessageStart(message_id, self.model_id(request))
                    if event_type == "messageStop":
                        stop = _STOP.get(str(event.get("stopReason")), "end_turn")
                    elif event_type == "metadata":
                        usage = _usage(event.get("usage"))
                    else:
                        for out in _block_events(name, writer, event_type, event):
                            yield out
            decoder.finish()
        if not started or stop is None:
            raise ProviderError(
                f"{name}: stream ended before messageStop", provider=name, retryable=True
            )
        for out in writer.finish(stop, usage):
            yield out

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """InvokeModel (`POST /model/{id}/invoke`, signed like Converse) in the model's own
        body: Titan Text Embeddings `{inputText, dimensions?, normalize: true}`, one text a
        call (TITAN_CONCURRENCY at once; `dimensions` on v2 only); Cohere Embed `{texts,
        input_type: search_document}`, COHERE_BATCH texts a call, no `dimensions`."""
        model_id = self.model_id(request)
        url = self._url(request, "invoke")
        if "titan-embed-text" in model_id:
            if request.dimensions is not None and "-v1" in model_id:
                raise _no_dimensions(model_id)
            limit = asyncio.Semaphore(TITAN_CONCURRENCY)

            async def one(text: str) -> Any:
                body: dict[str, Any] = {"inputText": text}
                if request.dimensions is not None:
                    body["dimensions"] = request.dimensions
                if "-v1" not in model_id:
                    body["normalize"] = True  # as OpenAI's and Gemini's vectors are
                async with limit:
                    return await self._invoke(url, body)

            answers = await asyncio.gather(*(one(text) for text in request.texts))
            return Embeddings(
                [[float(x) for x in a["embedding"]] for a in answers],
                sum(int(a.get("inputTextTokenCount") or 0) for a in answers),
            )
        if "cohere.embed" in model_id:
            if request.dimensions is not None:
                raise _no_dimensions(model_id)
            vectors: list[list[float]] = []
            for start in range(0, len(request.texts), COHERE_BATCH):
                texts = list(request.texts[start : start + COHERE_BATCH])
                answer = await self._invoke(url, {"texts": texts, "input_type": "search_document"})
                vectors += [[float(x) for x in v] for v in answer["embeddings"]]
            return Embeddings(vectors)
        raise ProviderError.no_embeddings(self.config.name, model_id)

    async def _invoke(self, url: str, body: dict[str, Any]) -> Any:
        async with self._post(url, body) as response:
            return json_answer(self.config.name, await response.aread())

    async def probe(self) -> None:
        """A signed ListFoundationModels. The runtime endpoint has no cheap read, so with the
        default endpoint the control plane (`bedrock.{region}.amazonaws.com`) is asked: it
        checks the same credentials and region (it needs `bedrock:ListFoundationModels`). A
        custom `base_url` (a proxy, a VPC endpoint, a test server) is asked at
        `{base_url}/foundation-models`."""
        default = DEFAULT_BASE_URLS["bedrock"].format(region=self.region)
        if self.config.base_url.rstrip("/") == default:
            url = f"https://bedrock.{self.region}.amazonaws.com/foundation-models"
        else:
            url = f"{self.config.base_url}/foundation-models"
        headers = await self.signed_headers("GET", url, b"", {"Accept": "application/json"})
        async with open_stream(
            self.http,
            self.config.name,
            "GET",
            url,
            headers=headers,
            request_timeout=httpx.Timeout(self.config.connect_timeout_s),
        ) as response:
            await response.aread()


# --- conversions ---------------------------------------------------------------------------
def _default_credentials() -> Credentials | None:
    import botocore.session

    found: Credentials | None = botocore.session.get_session().get_credentials()
    return found


def _no_dimensions(model_id: str) -> BadRequest:
    return BadRequest(
        f"dimensions: {model_id} makes vectors of one size only (Titan Text Embeddings v2"
        " takes 256, 512 or 1024)",
        extra={"fields": [{"field": "dimensions", "message": "unsupported"}]},
    )


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    # inputTokens leaves out the cached parts, reported apart (as Anthropic does).
    read = int(usage.get("cacheReadInputTokens") or 0)
    written = int(usage.get("cacheWriteInputTokens") or 0)
    return Usage(
        int(usage.get("inputTokens") or 0) + read + written,
        int(usage.get("outputTokens") or 0),
        cache_creation_input_tokens=written,
        cache_read_input_tokens=read,
    )


def _cache_point(out: list[dict[str, Any]], control: dict[str, Any] | None) -> None:
    """Anthropic's `cache_control` on the entry just written, as Converse's `cachePoint`
    block after it (CachePointBlock: type default, ttl 5m|1h)."""
    if control is None:
        return
    point: dict[str, Any] = {"type": "default"}
    if control.get("ttl") in ("5m", "1h"):
        point["ttl"] = control["ttl"]
    out.append({"cachePoint": point})


def _document_name(title: str | None) -> str:
    """A DocumentBlock name as Converse takes it: alphanumerics, single whitespace,
    hyphens, parentheses and square brackets, 1 to 200 characters."""
    name = re.sub(r"[^0-9A-Za-z\s\-()\[\]]", "-", title or "")
    name = re.sub(r"\s+", " ", name).strip()[:200]
    return name or "document"


def _document(block: DocumentBlock) -> dict[str, Any]:
    if block.url or block.file_id:
        raise BadRequest("bedrock accepts inline documents only, not document URLs or file ids")
    if block.text is not None:
        data, fmt = base64.b64encode(block.text.encode()).decode(), "txt"
    else:
        data, fmt = block.data or "", "pdf"
    return {
        "document": {"format": fmt, "name": _document_name(block.title), "source": {"bytes": data}}
    }


def _block_events(
    provider: str, writer: BlockWriter, event_type: str, event: dict[str, Any]
) -> Iterable[StreamEvent]:
    index = event.get("contentBlockIndex")
    if event_type == "contentBlockStart":
        tool = (event.get("start") or {}).get("toolUse")
        if isinstance(tool, dict):
            return writer.tool_start(index, str(tool.get("toolUseId")), str(tool.get("name")))
    elif event_type == "contentBlockDelta":
        delta = event.get("delta") or {}
        if "text" in delta:
            return writer.text(str(delta["text"]))
        if "toolUse" in delta:
            try:
                return writer.tool_args(index, str((delta["toolUse"] or {}).get("input") or ""))
            except ValueError as exc:
                raise ProviderError(
                    f"{provider}: malformed stream: {exc}", provider=provider, upstream_status=200
                ) from exc
        if "reasoningContent" in delta:
            reasoning = delta["reasoningContent"] or {}
            if reasoning.get("signature"):
                writer.sign(str(reasoning["signature"]))  # comes with the block's stop
            # A redacted-content delta has no place in the stream model.
            return writer.thinking(str(reasoning.get("text") or ""))
    elif event_type == "contentBlockStop":
        return writer.close()
    return ()


def _content(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            if block.text:  # Bedrock rejects blank text blocks
                out.append({"text": block.text})
        elif isinstance(block, ImageBlock):
            out.append(_image(block))
        elif isinstance(block, DocumentBlock):
            out.append(_document(block))
        elif isinstance(block, RedactedThinkingBlock):
            if message.role == "assistant":
                out.append({"reasoningContent": {"redactedContent": block.data}})
        elif isinstance(block, ThinkingBlock):
            # Only signed reasoning can be replayed; the model ignores or rejects the rest.
            if block.signature and message.role == "assistant":
                out.append(
                    {
                        "reasoningContent": {
                            "reasoningText": {"text": block.text, "signature": block.signature}
                        }
                    }
                )
        elif isinstance(block, ToolUseBlock):
            out.append(
                {"toolUse": {"toolUseId": block.id, "name": block.name, "input": block.input}}
            )
        else:
            result: list[dict[str, Any]] = []
            for part in block.content:
                if isinstance(part, TextBlock):
                    if part.text:
                        result.append({"text": part.text})
                elif isinstance(part, DocumentBlock):
                    result.append(_document(part))
                else:
                    result.append(_image(part))
            out.append(
                {
                    "toolResult": {
                        "toolUseId": block.tool_use_id,
                        # An empty result is still a result: an empty JSON document.
                        "content": result or [{"json": {}}],
                        "status": "error" if block.is_error else "success",
                    }
                }
            )
        control = getattr(block, "cache_control", None)
        if control is not None and out:
            _cache_point(out, control)
    return out


def _image(block: ImageBlock) -> dict[str, Any]:
    inline = block.inline()
    if inline is None:
        raise BadRequest("bedrock accepts inline (base64) images only, not image URLs")
    media, data = inline
    fmt = _IMAGE_FORMATS.get((media or "").lower()) or _sniff(data)
    if fmt is None:
        raise BadRequest(f"bedrock accepts png, jpeg, gif and webp images, not {media!r}")
    return {"image": {"format": fmt, "source": {"bytes": data}}}


def _sniff(data: str) -> str | None:
    try:
        head = base64.b64decode(data[:24] + "=" * (-len(data[:24]) % 4))
    except ValueError:
        return None
    if head.startswith(b"\x89PNG"):
        return "png"
    if head.startswith(b"\xff\xd8"):
        return "jpeg"
    if head.startswith(b"GIF8"):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def _tool_config(request: ChatRequest) -> dict[str, Any] | None:
    if not request.tools:
        return None
    choice = request.tool_choice
    if choice == "none":
        # Converse has no "none": leave the tools out, unless the history holds tool blocks,
        # which Bedrock only accepts with a toolConfig (then no choice is forced).
        used = any(
            isinstance(b, (ToolUseBlock, ToolResultBlock))
            for m in request.messages
            for b in m.content
        )
        if not used:
            return None
    tools: list[dict[str, Any]] = []
    for tool in request.tools:
        spec = {
            "name": tool.name,
            **({"description": tool.description} if tool.description else {}),
            "inputSchema": {"json": tool.parameters},
        }
        tools.append({"toolSpec": spec})
        _cache_point(tools, tool.cache_control)
    config: dict[str, Any] = {"tools": tools}
    if choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice == "any":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and choice.get("name"):
        config["toolChoice"] = {"tool": {"name": choice["name"]}}
    return config
