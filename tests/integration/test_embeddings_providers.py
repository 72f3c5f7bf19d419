"""POST /embeddings served by the Gemini, Bedrock (Titan, Cohere) and Ollama adapters in their
own wire formats, through the official `openai` SDK against the real app (uvicorn, real
Postgres and Redis) and loopback fakes that check every request we send; every answer
validated against CreateEmbeddingResponse. A provider's 4xx is our 400/404 with its message;
memory's vector search works with `embedder: provider:<gemini model>`."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from orchestrator.config import Settings
from orchestrator.memory._embed import parse_embedder
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.bedrock_server import ACCESS_KEY, SECRET_KEY, BedrockFake
from tests.fakes.gemini_server import GeminiFake, GeminiTurn
from tests.fakes.ollama_server import OllamaFake
from tests.integration.test_memory_embeddings import _search, _until_embedded, _user
from tests.openai_schema import validate

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GEMINI = "gemini-embedding-001"
TITAN = "amazon.titan-embed-text-v2:0"
COHERE = "cohere.embed-english-v3"
OLLAMA = "nomic-embed-text"


class Upstreams:
    def __init__(self) -> None:
        self.gemini = GeminiFake(api_key="g-key")
        self.bedrock = BedrockFake()
        self.ollama = OllamaFake()

    def providers(self) -> dict[str, Any]:
        return {
            "gemini": {
                "base_url": self.gemini.base_url,
                "api_key": "g-key",
                "models": [GEMINI, "gemini-no-such-embedder"],
            },
            "bedrock": {
                "base_url": self.bedrock.url,
                "region": "us-east-1",
                "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY,
                "models": [TITAN, COHERE],
            },
            "ollama": {"base_url": self.ollama.url, "models": [OLLAMA, "not-pulled"]},
        }

    def violations(self) -> list[str]:
        return [*self.gemini.violations, *self.bedrock.violations, *self.ollama.violations]


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    ups = Upstreams()
    async with ups.gemini, ups.bedrock, ups.ollama:
        yield ups
    assert ups.violations() == []  # every request we sent was well formed


@pytest.fixture
async def app(make_settings: Any, upstreams: Upstreams) -> AsyncIterator[ServedApp]:
    settings = make_settings(
        providers=upstreams.providers(),
        provider_retries=0,
        rate_limit_per_minute=0,
    )
    async with ServedApp(settings) as served:
        yield served


@pytest.fixture
def sdk(app: ServedApp) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0) as client:
        yield client


def _checked(answer: Any, n: int, dim: int) -> list[list[float]]:
    validate(answer.model_dump(exclude_unset=True), "CreateEmbeddingResponse")
    assert [d.index for d in answer.data] == list(range(n))
    assert all(len(d.embedding) == dim for d in answer.data), [
        len(d.embedding) for d in answer.data
    ]
    return [list(d.embedding) for d in answer.data]


async def _raw(app: ServedApp, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=30) as c:
        return await c.post("/embeddings", json=body)


async def test_gemini_embeddings(app: ServedApp, sdk: openai.OpenAI, upstreams: Upstreams) -> None:
    texts = ["red apples grow", "blue ocean waves"]
    floats = _checked(
        sdk.embeddings.create(model=GEMINI, input=texts, encoding_format="float"), 2, 768
    )
    # The SDK asks for base64 when no encoding is given and decodes it: the same vectors.
    decoded = _checked(sdk.embeddings.create(model=GEMINI, input=texts), 2, 768)
    assert decoded[0] == pytest.approx(floats[0], abs=1e-6)
    short = _checked(
        sdk.embeddings.create(model=GEMINI, input="red apples", dimensions=256), 1, 256
    )
    assert short
    sent = upstreams.gemini.embed_requests[-1].json
    assert sent == {
        "requests": [
            {
                "model": f"models/{GEMINI}",
                "content": {"parts": [{"text": "red apples"}]},
                "outputDimensionality": 256,
            }
        ]
    }
    assert upstreams.gemini.embed_requests[0].headers["x-goog-api-key"] == "g-key"
    # The raw body, base64: little-endian float32 bytes.
    answer = await _raw(
        app, {"model": GEMINI, "input": "red apples grow", "encoding_format": "base64"}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    # OpenAI's schema types `embedding` as an array only: checked with the float one.
    validate({**body, "data": [{**body["data"][0], "embedding": [0.0]}]}, "CreateEmbeddingResponse")
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats[0], abs=1e-6)
    assert body["model"] == GEMINI


async def test_bedrock_titan_and_cohere_embeddings(
    app: ServedApp, sdk: openai.OpenAI, upstreams: Upstreams
) -> None:
    texts = ["red apples grow", "blue ocean waves", "green grass"]
    answer = sdk.embeddings.create(model=TITAN, input=texts, encoding_format="float")
    floats = _checked(answer, 3, 1024)
    assert answer.usage.prompt_tokens == 8  # the sum of Titan's inputTextTokenCount
    # Titan takes one input per InvokeModel call, signed like Converse (the fake checks SigV4).
    titan = [r for r in upstreams.bedrock.invoke_requests if "titan" in r.path]
    assert sorted(r.json["inputText"] for r in titan) == sorted(texts)
    assert all(r.json == {"inputText": r.json["inputText"], "normalize": True} for r in titan)
    assert upstreams.bedrock.rejected == []
    decoded = _checked(sdk.embeddings.create(model=TITAN, input=texts), 3, 1024)
    assert decoded[2] == pytest.approx(floats[2], abs=1e-6)
    _checked(sdk.embeddings.create(model=TITAN, input="red", dimensions=256), 1, 256)
    assert upstreams.bedrock.invoke_requests[-1].json["dimensions"] == 256
    # Titan's own 400 (a size it does not make) is our 400 with Bedrock's message.
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=TITAN, input="red", dimensions=300)
    assert "dimensions: 300 is not a valid enum value" in refused.value.response.json()["error"]
    # Cohere: every text in one call, input_type search_document; no dimensions: 400.
    before = len(upstreams.bedrock.invoke_requests)
    _checked(sdk.embeddings.create(model=COHERE, input=texts, encoding_format="float"), 3, 1024)
    cohere = upstreams.bedrock.invoke_requests[before:]
    assert [r.json for r in cohere] == [{"texts": texts, "input_type": "search_document"}]
    with pytest.raises(openai.BadRequestError) as no_dims:
        sdk.embeddings.create(model=COHERE, input="red", dimensions=256)
    assert "dimensions" in no_dims.value.response.json()["error"]
    assert len(upstreams.bedrock.invoke_requests) == before + 1  # refused before any call


async def test_ollama_embeddings(app: ServedApp, sdk: openai.OpenAI, upstreams: Upstreams) -> None:
    texts = ["red apples grow", "blue ocean waves"]
    answer = sdk.embeddings.create(model=OLLAMA, input=texts, encoding_format="float")
    floats = _checked(answer, 2, 768)
    assert answer.usage.prompt_tokens == 6  # Ollama's prompt_eval_count
    assert upstreams.ollama.embed_requests[-1].json == {"model": OLLAMA, "input": texts}
    decoded = _checked(sdk.embeddings.create(model=OLLAMA, input=texts), 2, 768)
    assert decoded[1] == pytest.approx(floats[1], abs=1e-6)
    _checked(sdk.embeddings.create(model=OLLAMA, input="red", dimensions=64), 1, 64)
    assert upstreams.ollama.embed_requests[-1].json["dimensions"] == 64
    # A model Ollama does not have: its 404 is our 404 with its message.
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.embeddings.create(model="not-pulled", input="red")
    assert "try pulling it first" in missing.value.response.json()["error"]


async def test_provider_errors_keep_their_meaning(
    app: ServedApp, sdk: openai.OpenAI, upstreams: Upstreams
) -> None:
    # A provider's 400: our 400 in the DESIGN body, with the provider's message.
    upstreams.gemini.script(GeminiTurn.failing(400, "* BatchEmbedContentsRequest.requests: bad"))
    answer = await _raw(app, {"model": GEMINI, "input": "x"})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["ok"] is False and body["request_id"], body
    assert "BatchEmbedContentsRequest.requests: bad" in body["error"]
    # A model the provider does not know: 404 model_not_found with its message.
    answer = await _raw(app, {"model": "gemini-no-such-embedder", "input": "x"})
    assert answer.status_code == 404, answer.text
    assert answer.json()["code"] == "model_not_found"
    assert "is not found for API version v1beta" in answer.json()["error"]
    # The provider failing (5xx) is not the caller's fault: a gateway error, as for chat, and
    # it counts in the provider's breaker.
    upstreams.gemini.script(GeminiTurn.failing(503, "The model is overloaded."))
    answer = await _raw(app, {"model": GEMINI, "input": "x"})
    assert answer.status_code == 502, answer.text
    assert answer.json()["code"] == "upstream_error", answer.text
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as c:
        health = (await c.get("/providers/health")).json()["providers"]["gemini"]
    assert "overloaded" in (health["last_error"] or ""), health


async def test_memory_vector_search_with_a_gemini_embedder(
    make_settings: Any, upstreams: Upstreams
) -> None:
    upstreams.gemini.embedding_dim = 384  # memory_embedding_dim
    settings = make_settings(
        providers=upstreams.providers(),
        rate_limit_per_minute=0,
        embedder=f"provider:{GEMINI}",
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            facts = {"a": "red apples grow", "b": "blue ocean waves"}
            for key, value in facts.items():
                r = await c.post("/memory/g/store", headers=ann, json={"key": key, "value": value})
                assert r.json() == {"status": "ok"}
            await _until_embedded(c, ann, "g", facts)
            found = await _search(c, ann, "g", text="apples red", threshold=0.5)
            assert [x["key"] for x in found] == ["a"]
    sent = [
        t["content"]["parts"][0]["text"]
        for r in upstreams.gemini.embed_requests
        for t in r.json["requests"]
    ]
    assert {"red apples grow", "blue ocean waves", "apples red"} <= set(sent)


def test_embedder_setting_takes_the_local_model_names() -> None:
    for name in ("local", "all-MiniLM-L6-v2", "local:all-MiniLM-L6-v2-int8"):
        settings = Settings.load(environ={}, embedder=name, admin_token="x" * 32)
        assert parse_embedder(settings.embedder) == ("local", None), name
    assert parse_embedder("provider:gemini-embedding-001") == ("provider", "gemini-embedding-001")
    with pytest.raises(ValueError):
        parse_embedder("provider:")
