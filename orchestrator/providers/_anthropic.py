"""`AnthropicAdapter`: Anthropic's Messages API (and any endpoint that speaks it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx

from orchestrator.providers import _params
from orchestrator.providers._anthropic_format import (
    ANTHROPIC_VERSION,
    EventDecoder,
    decode_response,
    encode_request,
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

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        if self.config.api_key:
            headers["x-api-key"] = self.config.api_key
        return headers

    async def complete(self, request: ChatRequest) -> ChatResponse:
        body = await post_json(
            self._http,
            self.config.name,
            f"{self._base}/v1/messages",
            _params.apply(self, encode_request(request, stream=False), request.params),
            self._headers(),
            self._timeout,
        )
        return decode_response(body, self.config.name)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        decoder = EventDecoder(self.config.name)
        async with open_stream(
            self._http,
            self.config.name,
            "POST",
            f"{self._base}/v1/messages",
            json_body=_params.apply(self, encode_request(request, stream=True), request.params),
            headers={**self._headers(), "accept": "text/event-stream"},
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
