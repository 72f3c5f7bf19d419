"""Azure OpenAI: OpenAI's chat completions and embeddings behind a resource endpoint, one URL
per deployment and an `api-version` query parameter:

    POST {endpoint}/openai/deployments/{deployment}/chat/completions?api-version=2024-10-21

The body and the answers are OpenAI's (`_openai_format`), with Azure's content filtering
riding along: `prompt_filter_results` and per-choice `content_filter_results` (ignored by
the decoders), a first streamed chunk with no choices that carries only the prompt's filter
results (skipped here: it has no id or model), and finish_reason `content_filter` (a refusal).

Auth is the `api-key` header, or Microsoft Entra ID: a bearer token for the Cognitive
Services scope from the client-credentials grant, cached until EXPIRY_MARGIN_S before it
expires. The grant is one form POST, done here with our own HTTP client rather than
azure-identity: its ClientSecretCredential pulls in azure-core and MSAL, needs a transport of
azure-core's for async use, and refuses any authority that is not https (so no loopback test
could run it as configured).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from orchestrator._json import loads
from orchestrator.providers import _params
from orchestrator.providers._http import iter_sse, open_stream, post_json
from orchestrator.providers._openai import OpenAIAdapter
from orchestrator.providers._openai_format import ChunkDecoder, decode_response
from orchestrator.providers._params import Translate
from orchestrator.providers._registry import AZURE_API_VERSION, ENTRA_AUTHORITY
from orchestrator.providers._types import (
    ChatRequest,
    ChatResponse,
    Embeddings,
    EmbedRequest,
    ProviderConfig,
    ProviderError,
    StreamEvent,
)

__all__ = ["COGNITIVE_SCOPE", "AzureOpenAIAdapter", "EntraToken"]

COGNITIVE_SCOPE = "https://cognitiveservices.azure.com/.default"
EXPIRY_MARGIN_S = 300.0  # a token is renewed this long before it expires (Entra's are ~1 h)


class EntraToken:
    """An app-only access token from `POST {authority}/{tenant}/oauth2/v2.0/token`
    (grant_type=client_credentials), kept until near its expiry; one request at a time
    renews it. A refused grant is our credentials' fault: upstream status 401, so the caller
    sees a gateway error, never a 400 of theirs."""

    def __init__(
        self,
        provider: str,
        http: httpx.AsyncClient,
        *,
        authority: str,
        tenant_id: str,
        client_id: str,
        client_secret: str,
        timeout: httpx.Timeout,
        scope: str = COGNITIVE_SCOPE,
    ) -> None:
        self.provider = provider
        self._http = http
        self.url = f"{authority.rstrip('/')}/{quote(tenant_id, safe='')}/oauth2/v2.0/token"
        self._form = urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": client_id,
                "client_secret": client_secret,
                "scope": scope,
            }
        ).encode()
        self._timeout = timeout
        self._token: str | None = None
        self._renew_at = 0.0  # monotonic
        self._lock = asyncio.Lock()

    async def get(self) -> str:
        token = self._token
        if token is not None and time.monotonic() < self._renew_at:
            return token
        async with self._lock:
            if self._token is None or time.monotonic() >= self._renew_at:
                await self._renew()
            assert self._token is not None
            return self._token

    async def _renew(self) -> None:
        asked = time.monotonic()
        try:
            data = await post_json(
                self._http,
                self.provider,
                self.url,
                self._form,
                {
                    "Content-Type": "application/x-www-form-urlencoded",
                    "Accept": "application/json",
                },
                self._timeout,
            )
        except ProviderError as exc:
            status = exc.upstream_status
            if status and 400 <= status < 500 and status != 429:
                raise ProviderError(
                    f"{self.provider}: Entra ID refused the client credentials: {exc.message}",
                    provider=self.provider,
                    upstream_status=401,
                ) from exc
            raise
        token = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise ProviderError(
                f"{self.provider}: Entra ID answered without an access_token",
                provider=self.provider,
                upstream_status=401,
            )
        try:  # a number, or a numeric string (v1 endpoints sent strings)
            lifetime = float(data.get("expires_in", 3600.0))
        except (TypeError, ValueError):
            lifetime = 3600.0
        # A short-lived token is renewed at half its life rather than never cached.
        self._renew_at = asked + max(lifetime - EXPIRY_MARGIN_S, lifetime / 2)
        self._token = token


class AzureOpenAIAdapter(OpenAIAdapter):
    """`config.base_url` is the resource endpoint; `config.extra` holds `api_version`,
    `deployments` (model name -> deployment name; a model not listed is its own deployment)
    and, for Entra ID, `tenant_id`, `client_id`, `client_secret` and `authority`. Without
    Entra settings, `config.api_key` goes in the `api-key` header."""

    # Azure serves OpenAI's models with OpenAI's request fields (the same table, by reference,
    # so a field added to OpenAI's reaches Azure too).
    params: Mapping[str, Translate] = _params.OPENAI

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        extra = config.extra
        # Set before OpenAIAdapter.__init__, which builds the request headers once from
        # `headers()`: with Entra configured no `api-key` may be among them (a key left in
        # AZURE_OPENAI_API_KEY would otherwise ride along with the bearer token).
        self.entra: EntraToken | None = None
        if extra.get("tenant_id") and extra.get("client_id") and extra.get("client_secret"):
            self.entra = EntraToken(
                config.name,
                http,
                authority=str(extra.get("authority") or ENTRA_AUTHORITY),
                tenant_id=str(extra["tenant_id"]),
                client_id=str(extra["client_id"]),
                client_secret=str(extra["client_secret"]),
                timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            )
        super().__init__(config, http)
        self.api_version = str(extra.get("api_version") or AZURE_API_VERSION)
        self.deployments: dict[str, str] = dict(extra.get("deployments") or {})
        self._root = config.base_url.rstrip("/").removesuffix("/openai")
        self._urls: dict[tuple[str, str], httpx.URL] = {}

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.api_key and self.entra is None:
            headers["api-key"] = self.config.api_key
        return headers

    async def _with_auth(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        if self.entra is None:
            return headers
        return {**headers, "Authorization": f"Bearer {await self.entra.get()}"}

    def deployment_url(self, model: str, operation: str) -> httpx.URL:
        key = (model, operation)
        url = self._urls.get(key)
        if url is None:
            deployment = quote(self.deployments.get(model, model), safe="-._~")
            url = httpx.URL(
                f"{self._root}/openai/deployments/{deployment}/{operation}",
                params={"api-version": self.api_version},
            )
            if len(self._urls) < 1024:
                self._urls[key] = url
        return url

    async def complete(self, request: ChatRequest) -> ChatResponse:
        data = await post_json(
            self._http,
            self.name,
            self.deployment_url(request.model, "chat/completions"),
            self.build_body(request, stream=False),
            await self._with_auth(self._post_headers),
            self._timeout,
        )
        return decode_response(data, self.name)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        decoder = ChunkDecoder(self.name)
        started = False
        async with open_stream(
            self._http,
            self.name,
            "POST",
            self.deployment_url(request.model, "chat/completions"),
            json_body=self.build_body(request, stream=True),
            headers=await self._with_auth(self._stream_headers),
            request_timeout=self._timeout,
        ) as response:
            async for _event, data in iter_sse(response):
                if data.strip() == "[DONE]":
                    break
                try:
                    chunk = loads(data)
                except ValueError as exc:
                    raise ProviderError(
                        f"{self.name}: stream chunk is not JSON: {data[:200]!r}",
                        provider=self.name,
                        retryable=True,
                    ) from exc
                if not started and _prompt_filter_only(chunk):
                    continue  # Azure's opening chunk: the prompt's filter results only
                started = True
                for event in decoder.feed(chunk):
                    yield event
        for event in decoder.finish():
            yield event

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`POST .../deployments/{deployment}/embeddings` (OpenAI's body and answer)."""
        body: dict[str, Any] = {"input": list(request.texts), "encoding_format": "float"}
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        data = await post_json(
            self._http,
            self.name,
            self.deployment_url(request.model, "embeddings"),
            body,
            await self._with_auth(self._post_headers),
            self._timeout,
        )
        rows = sorted(data["data"], key=lambda d: d["index"])
        vectors = [[float(x) for x in d["embedding"]] for d in rows]
        return Embeddings(vectors, int((data.get("usage") or {}).get("prompt_tokens") or 0))

    def probe_url(self) -> str:
        return str(
            httpx.URL(f"{self._root}/openai/models", params={"api-version": self.api_version})
        )

    async def probe(self) -> None:
        """`GET /openai/models`: the endpoint, the api-version and the credentials at once."""
        async with open_stream(
            self._http,
            self.name,
            "GET",
            self.probe_url(),
            headers=await self._with_auth(self.headers()),
            request_timeout=httpx.Timeout(self.config.connect_timeout_s),
        ) as response:
            await response.aread()


def _prompt_filter_only(chunk: Any) -> bool:
    return (
        isinstance(chunk, dict)
        and chunk.get("choices") == []
        and "prompt_filter_results" in chunk
        and not chunk.get("usage")
        and not chunk.get("error")
    )
