"""`AnthropicAdapter`: Anthropic's Messages API (and any endpoint that speaks it)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping

import httpx

from orchestrator.providers import _params
from orchestrator.providers._anthropic_format import (
    ANTHROPIC_VERSION,
    EventDecoder,
    count_body,
    decode_response,
    native_body,
)
from orchestrator.providers._http import (
    error_message,
    iter_sse,
    open_stream,
    post_json,
    retry_after_of,
)
from orchestrator.providers._params import Translate
from orchestrator.providers._types import (
    ChatRequest,
    ChatResponse,
    Embeddings,
    EmbedRequest,
    ProviderConfig,
    ProviderError,
    StreamEvent,
)

__all__ = ["AnthropicAdapter"]


class AnthropicAdapter:
    """POST {base}/v1/messages with `x-api-key` and `anthropic-version`; streams SSE."""

    params: Mapping[str, Translate] = _params.ANTHROPIC

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self._http = http
        # base_url is the API root (https://api.anthropic.com); one given with /v1 works too.
        self._base = config.base_url.rstrip("/").removesuffix("/v1")
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)

    def _headers(self, request: ChatRequest | None = None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        if self.config.api_key:
            headers["x-api-key"] = self.config.api_key
        if request is not None and request.native is not None and request.native.beta_header:
            headers["anthropic-beta"] = request.native.beta_header  # the caller's, verbatim
        return headers

    def _url(self, request: ChatRequest, path: str = "/v1/messages") -> str:
        beta = request.native is not None and request.native.beta_query
        return f"{self._base}{path}?beta=true" if beta else f"{self._base}{path}"

    def _body(self, request: ChatRequest, *, stream: bool) -> dict[str, object]:
        body = native_body(request, stream=stream)
        if request.native is not None:
            return body  # the caller's own fields, already in Anthropic's form
        return _params.apply(self, body, request.params)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        body = await post_json(
            self._http,
            self.config.name,
            self._url(request),
            self._body(request, stream=False),
            self._headers(request),
            self._timeout,
        )
        response = decode_response(body, self.config.name)
        if request.native is not None:
            response = dataclasses.replace(response, native=body)
        return response

    async def count_tokens(self, request: ChatRequest) -> int:
        """Anthropic's own count (POST /v1/messages/count_tokens) of `request`'s prompt."""
        body = await post_json(
            self._http,
            self.config.name,
            self._url(request, "/v1/messages/count_tokens"),
            count_body(request),
            self._headers(request),
            self._timeout,
        )
        count = body.get("input_tokens") if isinstance(body, dict) else None
        if not isinstance(count, int) or isinstance(count, bool):
            raise ProviderError(
                f"{self.config.name}: malformed count_tokens answer",
                provider=self.config.name,
                upstream_status=200,
            )
        return count

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        decoder = EventDecoder(self.config.name)
        async with open_stream(
            self._http,
            self.config.name,
            "POST",
            self._url(request),
            json_body=self._body(request, stream=True),
            headers={**self._headers(request), "accept": "text/event-stream"},
            request_timeout=self._timeout,
        ) as response:
            async for event, data in iter_sse(response):
                for item in decoder.feed(event, data):
                    yield item
        decoder.finish()

    async def embed(self, request: EmbedRequest) -> Embeddings:
        # Anthropic has no embeddings API (its docs point to Voyage AI).
        raise ProviderError.no_embeddings(self.config.name, request.model)

    async def probe(self) -> None:
        name = self.config.name
        timeout = httpx.Timeout(self.config.connect_timeout_s)
        headers = self._headers()
        del headers["content-type"]
        try:
            response = await self._http.get(
                f"{self._base}/v1/models", headers=headers, timeout=timeout
            )
        except httpx.TimeoutException as exc:
            raise ProviderError.timeout(name, f"probe timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise ProviderError.unreachable(name, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ProviderError.from_status(
                name,
                response.status_code,
                error_message(response.content),
                retry_after_of(response),
            )
