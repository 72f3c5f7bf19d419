"""Adapters for upstreams that speak OpenAI chat completions: OpenAI itself, Zhipu GLM,
DeepSeek, Qwen (DashScope compatible mode), a local llama-server, and declarative custom
endpoints. One wire format (`_openai_format`), with each provider's documented differences
in a subclass."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from orchestrator._json import loads
from orchestrator.providers import _params
from orchestrator.providers._http import iter_sse, open_stream, post_json
from orchestrator.providers._openai_format import (
    ChunkDecoder,
    ReasoningPolicy,
    decode_response,
    encode_request,
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

__all__ = ["DeepSeekAdapter", "LocalAdapter", "OpenAIAdapter", "QwenAdapter", "ZhipuAdapter"]


class OpenAIAdapter:
    """`POST {base_url}/chat/completions` with `Authorization: Bearer <api_key>`; streams ask
    for `stream_options: {include_usage: true}` so the usage is exact; `probe` lists models
    (`GET {base_url}/models`). Also the adapter of declarative `custom` endpoints with
    `format: openai` (the key is optional there)."""

    # Whether a streaming request asks for the final usage chunk.
    stream_usage: bool = True
    # Which assistant reasoning goes back upstream in the history.
    reasoning: ReasoningPolicy = "drop"
    # Optional fields honoured and their wire form: the declared table (_params.py).
    params: Mapping[str, Translate] = _params.OPENAI

    def __init__(self, config: ProviderConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self._http = http
        self._timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        # Built (and parsed) once, not per call: the config is frozen, and httpx parsing
        # a URL string took half of its request building.
        self._chat_url = httpx.URL(self._url("/chat/completions"))
        post = {**self.headers(), "Content-Type": "application/json"}
        self._post_headers = post
        self._stream_headers = {**post, "Accept": "text/event-stream"}

    @property
    def name(self) -> str:
        return self.config.name

    def _url(self, path: str) -> str:
        return f"{self.config.base_url.rstrip('/')}{path}"

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        """The wire body for `request` (subclasses adjust it to their provider)."""
        # OpenAI deprecated `max_tokens` (its reasoning models reject it, on Azure too); every
        # other compatible server documents `max_tokens`.
        field = (
            "max_completion_tokens"
            if self.config.kind in ("openai", "azure_openai")
            else "max_tokens"
        )
        body = encode_request(
            request,
            stream=stream,
            include_usage=self.stream_usage,
            reasoning=self.reasoning,
            max_tokens_field=field,
        )
        if "user" not in self.params:
            body.pop("user", None)  # an end-user id goes only where the provider takes one
        return _params.apply(self, body, request.params)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        data = await post_json(
            self._http,
            self.name,
            self._chat_url,
            self.build_body(request, stream=False),
            self._post_headers,
            self._timeout,
        )
        return decode_response(data, self.name)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        decoder = ChunkDecoder(self.name)
        async with open_stream(
            self._http,
            self.name,
            "POST",
            self._chat_url,
            json_body=self.build_body(request, stream=True),
            headers=self._stream_headers,
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
                for event in decoder.feed(chunk):
                    yield event
        for event in decoder.finish():
            yield event

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`POST {base_url}/embeddings` (CreateEmbeddingRequest, floats); `dimensions` is
        passed on (OpenAI's text-embedding-3 models shorten; others answer 400)."""
        body: dict[str, Any] = {
            "model": request.model,
            "input": list(request.texts),
            "encoding_format": "float",
        }
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        try:
            data = await post_json(
                self._http,
                self.name,
                self._url("/embeddings"),
                body,
                self._post_headers,
                self._timeout,
            )
        except ProviderError as exc:
            if exc.upstream_status == 501:  # llama-server started without --embeddings
                raise ProviderError.no_embeddings(self.name, request.model) from exc
            raise
        rows = sorted(data["data"], key=lambda d: d["index"])
        vectors = [[float(x) for x in d["embedding"]] for d in rows]
        return Embeddings(vectors, int((data.get("usage") or {}).get("prompt_tokens") or 0))

    def probe_url(self) -> str:
        return self._url("/models")

    async def probe(self) -> None:
        async with open_stream(
            self._http,
            self.name,
            "GET",
            self.probe_url(),
            headers=self.headers(),
            request_timeout=httpx.Timeout(self.config.connect_timeout_s),
        ) as response:
            await response.aread()


class ZhipuAdapter(OpenAIAdapter):
    """Zhipu GLM (`https://open.bigmodel.cn/api/paas/v4`), per its chat-completion reference:
    no `stream_options` (not a documented parameter: the usage comes on the final chunk
    anyway); `tool_choice` only `auto` (so `none` drops the tools, and a forced choice sends
    `auto` with only the forced tool, `any` `auto` with all of them); at most one `stop`
    word; `temperature` in [0, 1] (clamped); the end-user id is `user_id` (6-128 chars).
    Images go as `image_url` parts (GLM-4V); `reasoning_content` (GLM-4.5+) is thinking."""

    stream_usage = False
    params: Mapping[str, Translate] = _params.ZHIPU

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        body = super().build_body(request, stream=stream)
        choice = request.tool_choice
        if choice == "none":
            body.pop("tools", None)
            body.pop("tool_choice", None)
        elif isinstance(choice, dict):
            body["tools"] = [
                t for t in body.get("tools", []) if t["function"]["name"] == choice["name"]
            ]
            body["tool_choice"] = "auto"
        elif choice is not None:
            body["tool_choice"] = "auto"
        if len(request.stop) > 1:
            raise ProviderError.from_status(self.name, 400, "GLM accepts at most one stop sequence")
        if request.temperature is not None:
            body["temperature"] = min(request.temperature, 1.0)
        user = body.pop("user", None)
        if user is not None and 6 <= len(user) <= 128:
            body["user_id"] = user
        return body


class DeepSeekAdapter(OpenAIAdapter):
    """DeepSeek (`https://api.deepseek.com`). Reasoning streams as `reasoning_content` and
    comes back as a ThinkingBlock. In the history, DeepSeek's thinking-mode guide requires
    the `reasoning_content` of turns in which the model called tools (a 400 without it) and
    ignores it elsewhere, while the legacy reasoner rejected it in plain multi-turn chats:
    so it is sent back only for tool-calling turns."""

    reasoning: ReasoningPolicy = "tool_turns"
    params: Mapping[str, Translate] = _params.DEEPSEEK

    async def embed(self, request: EmbedRequest) -> Embeddings:
        # DeepSeek's API has chat and FIM completions only.
        raise ProviderError.no_embeddings(self.name, request.model)


class QwenAdapter(OpenAIAdapter):
    """Qwen through DashScope's compatible mode
    (`https://dashscope.aliyuncs.com/compatible-mode/v1`): the OpenAI wire, including
    `stream_options.include_usage` (a final usage-only chunk) and `image_url` parts for the
    VL models; Qwen3's thinking streams as `reasoning_content`."""

    params: Mapping[str, Translate] = _params.QWEN


class LocalAdapter(OpenAIAdapter):
    """A llama-server instance started by the inference manager. `base_url` is its
    OpenAI-compatible root, `http://127.0.0.1:<port>/v1` (chat at `/v1/chat/completions`);
    `api_key` is the instance's own key, which its server requires on every route but
    /health; the model name is sent as given (the server has one model and does not check
    it). `probe` is llama-server's own `GET /health` on the server root (200 when the model
    is loaded, 503 while it loads)."""

    params: Mapping[str, Translate] = _params.LOCAL

    async def count_tokens(self, request: ChatRequest) -> int:
        """llama-server's own count: `POST /apply-template` (the chat template applied to the
        request's messages and tools, no inference) then `POST /tokenize` of that prompt.
        A server without those routes (the bundled launcher) answers 404: estimated then."""
        root = self.config.base_url.rstrip("/").removesuffix("/v1")
        body = self.build_body(request, stream=False)
        template: dict[str, Any] = {k: body[k] for k in ("messages", "tools") if k in body}
        applied = await post_json(
            self._http,
            self.name,
            f"{root}/apply-template",
            template,
            self._post_headers,
            self._timeout,
        )
        prompt = applied.get("prompt") if isinstance(applied, dict) else None
        tokens = await post_json(
            self._http,
            self.name,
            f"{root}/tokenize",
            {"content": prompt if isinstance(prompt, str) else "", "add_special": True},
            self._post_headers,
            self._timeout,
        )
        found = tokens.get("tokens") if isinstance(tokens, dict) else None
        if not isinstance(found, list):
            raise ProviderError(
                f"{self.name}: malformed /tokenize answer", provider=self.name, upstream_status=200
            )
        return len(found)

    def probe_url(self) -> str:
        root = self.config.base_url.rstrip("/").removesuffix("/v1")
        return f"{root}/health"
