"""Vertex AI: Gemini and Anthropic's Claude models served from a Google Cloud project.

    {base}/projects/{project}/locations/{location}/publishers/google/models/{m}:generateContent
                                                                          :streamGenerateContent?alt=sse
                                                                          :predict (embeddings)
    {base}/projects/{project}/locations/{location}/publishers/anthropic/models/{m}:rawPredict
                                                                             :streamRawPredict

`base` is `https://{location}-aiplatform.googleapis.com/v1` (`https://aiplatform.googleapis.com/v1`
for the `global` location). Gemini's body and answers are the Generative Language API's
(Vertex's GenerateContentRequest is the same message), so the Gemini adapter does them; a
Claude model (a name starting `claude`) gets Anthropic's Messages body without `model` (the
URL names it) and with `anthropic_version: vertex-2023-10-16`, and answers in Anthropic's
format, so the Anthropic encoders do those. The declared field table follows the model.

Credentials come from google-auth's default chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
application-default credentials, the metadata server), scoped to cloud-platform, and go out
as `Authorization: Bearer`. Finding and refreshing them blocks (files, an OAuth token
endpoint, the metadata server): both run in a thread, never on the event loop, one refresh
at a time; google-auth's `valid` renews a token a few minutes before it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from orchestrator.providers import _params
from orchestrator.providers._anthropic_format import (
    EventDecoder,
    decode_response,
    encode_request,
)
from orchestrator.providers._gemini import GeminiAdapter
from orchestrator.providers._http import iter_sse, json_answer, open_stream, post_json
from orchestrator.providers._params import Translate
from orchestrator.providers._registry import VERTEX_LOCATION
from orchestrator.providers._types import (
    ChatRequest,
    ChatResponse,
    Embeddings,
    EmbedRequest,
    ProviderConfig,
    ProviderError,
    StreamEvent,
)

__all__ = ["CLOUD_PLATFORM_SCOPE", "VERTEX_ANTHROPIC_VERSION", "GoogleToken", "VertexAdapter"]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
# :predict instances per call: text-embedding-00x take 250; gemini-embedding-001 takes one.
EMBED_BATCH = 250


def is_claude(model: str) -> bool:
    return model.startswith("claude")


class GoogleToken:
    """Google credentials from the default chain and their current request headers."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self._credentials: Any = None
        self.project: str | None = None
        self._lock = asyncio.Lock()

    async def headers(self) -> dict[str, str]:
        """`authorization` (and `x-goog-user-project` for user credentials with a quota
        project), refreshed first when the token is missing or about to expire."""
        creds = self._credentials
        if creds is None or not creds.valid:
            async with self._lock:
                if self._credentials is None or not self._credentials.valid:
                    await asyncio.to_thread(self._load_and_refresh)
            creds = self._credentials
        out: dict[str, str] = {}
        creds.apply(out)
        return out

    def _load_and_refresh(self) -> None:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests

        try:
            if self._credentials is None:
                creds, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
                self._credentials, self.project = creds, project
            self._credentials.refresh(google.auth.transport.requests.Request())
        except google.auth.exceptions.TransportError as exc:
            raise ProviderError.unreachable(self.provider, f"Google token endpoint: {exc}") from exc
        except google.auth.exceptions.GoogleAuthError as exc:
            # No credentials, or refused ones: our configuration's fault, never the caller's.
            raise ProviderError(
                f"{self.provider}: Google credentials: {exc}",
                provider=self.provider,
                upstream_status=401,
            ) from exc


class _VertexGemini(GeminiAdapter):
    """The Gemini adapter with Vertex's URLs and bearer credentials."""

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient, vertex: VertexAdapter):
        super().__init__(config, http)
        self.vertex = vertex
        self._auth: dict[str, str] = {}

    def _headers(self) -> dict[str, str]:
        return {"Accept": "application/json", **self._auth}

    def _url(self, request: ChatRequest, method: str) -> str:
        return self.vertex.model_url("google", request.model, method)

    @contextlib.asynccontextmanager
    async def _request(
        self, method: str, url: str, body: dict[str, Any] | None, limits: httpx.Timeout
    ) -> AsyncIterator[httpx.Response]:
        self._auth = await self.vertex.token.headers()
        async with super()._request(method, url, body, limits) as response:
            yield response

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`:predict` with `{instances: [{content}], parameters: {outputDimensionality}}`;
        the answer's `statistics.token_count` per text make up `input_tokens`."""
        batch = 1 if request.model.startswith("gemini-embedding") else EMBED_BATCH
        url = self.vertex.model_url("google", request.model, "predict")
        vectors: list[list[float]] = []
        tokens = 0
        for start in range(0, len(request.texts), batch):
            body: dict[str, Any] = {
                "instances": [{"content": t} for t in request.texts[start : start + batch]]
            }
            if request.dimensions is not None:
                body["parameters"] = {"outputDimensionality": request.dimensions}
            async with self._request("POST", url, body, self._timeout) as response:
                data = json_answer(self.config.name, await response.aread())
            for prediction in data["predictions"]:
                embedding = prediction["embeddings"]
                vectors.append([float(x) for x in embedding["values"]])
                tokens += int((embedding.get("statistics") or {}).get("token_count") or 0)
        return Embeddings(vectors, tokens)


class _VertexAnthropic:
    """Claude on Vertex: Anthropic's Messages body and answers at `:rawPredict` /
    `:streamRawPredict`."""

    params: Mapping[str, Translate] = _params.VERTEX_ANTHROPIC

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient, vertex: VertexAdapter):
        self.config = config
        self._http = http
        self.vertex = vertex
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)

    def _body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        body = _params.apply(self, encode_request(request, stream=stream), request.params)
        body.pop("model", None)
        body["anthropic_version"] = VERTEX_ANTHROPIC_VERSION
        return body

    async def _headers(self) -> dict[str, str]:
        return {"content-type": "application/json", **await self.vertex.token.headers()}

    async def complete(self, request: ChatRequest) -> ChatResponse:
        data = await post_json(
            self._http,
            self.config.name,
            self.vertex.model_url("anthropic", request.model, "rawPredict"),
            self._body(request, stream=False),
            await self._headers(),
            self._timeout,
        )
        return decode_response(data, self.config.name)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        decoder = EventDecoder(self.config.name)
        async with open_stream(
            self._http,
            self.config.name,
            "POST",
            self.vertex.model_url("anthropic", request.model, "streamRawPredict"),
            json_body=self._body(request, stream=True),
            headers={**await self._headers(), "accept": "text/event-stream"},
            request_timeout=self._timeout,
        ) as response:
            async for event, data in iter_sse(response):
                for item in decoder.feed(event, data):
                    yield item
        decoder.finish()


class VertexAdapter:
    """`config.extra`: `project` (else the default chain's project) and `location`."""

    # The table of a model not yet known; `params_for` is what the gateway asks.
    params: Mapping[str, Translate] = _params.GEMINI

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http
        self.location = str(config.extra.get("location") or VERTEX_LOCATION)
        self._project: str | None = config.extra.get("project") or None
        self.token = GoogleToken(config.name)
        self.gemini = _VertexGemini(config, http, self)
        self.anthropic = _VertexAnthropic(config, http, self)

    @property
    def name(self) -> str:
        return self.config.name

    def params_for(self, model: str) -> Mapping[str, Translate]:
        return self.anthropic.params if is_claude(model) else self.gemini.params

    @property
    def root(self) -> str:
        """`{base}/projects/{project}/locations/{location}` (after `ready()`)."""
        project = self._project or self.token.project
        if not project:
            raise ProviderError(
                f"{self.name}: no Google Cloud project: set providers.vertex.project "
                "(the credentials name none)",
                provider=self.name,
                upstream_status=401,
            )
        return (
            f"{self.config.base_url.rstrip('/')}/projects/{quote(project, safe='')}"
            f"/locations/{quote(self.location, safe='')}"
        )

    def model_url(self, publisher: str, model: str, method: str) -> str:
        name = quote(model.removeprefix("models/"), safe="-._~@")
        return f"{self.root}/publishers/{publisher}/models/{name}:{method}"

    async def ready(self) -> None:
        """Credentials loaded (and with them the default project)."""
        await self.token.headers()

    async def complete(self, request: ChatRequest) -> ChatResponse:
        await self.ready()
        if is_claude(request.model):
            return await self.anthropic.complete(request)
        return await self.gemini.complete(request)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        await self.ready()
        inner = self.anthropic if is_claude(request.model) else self.gemini
        async for event in inner.stream(request):
            yield event

    async def embed(self, request: EmbedRequest) -> Embeddings:
        if is_claude(request.model):
            raise ProviderError.no_embeddings(self.name, request.model)
        await self.ready()
        return await self.gemini.embed(request)

    async def probe(self) -> None:
        """`GET {base}/projects/{p}/locations/{l}`: credentials, project and location."""
        headers = await self.token.headers()
        async with open_stream(
            self.http,
            self.name,
            "GET",
            self.root,
            headers={"Accept": "application/json", **headers},
            request_timeout=httpx.Timeout(self.config.connect_timeout_s),
        ) as response:
            await response.aread()
