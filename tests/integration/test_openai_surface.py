"""OpenAI's surface of the API checked against OpenAI's published schemas: /models (list and
retrieve) through the official `openai` SDK and raw httpx, the real app under uvicorn with
real Postgres and Redis, loopback upstreams."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServedApp
from tests.fakes.anthropic_server import FakeAnthropic, text_reply, tool_reply
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake
from tests.integration.test_gateway import (
    ADMIN,
    WEATHER_TOOL_OPENAI,
    app,
    oai_client,
    upstreams,
)
from tests.openai_schema import validate

__all__ = ["app", "upstreams"]  # fixtures shared with the gateway tests


async def test_models_list_has_spec_and_openai_shapes(app: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        body = (await http.get("/models")).json()
    validate(body, "ListModelsResponse")
    for model in body["data"]:
        validate(model, "Model")
    assert {m["name"] for m in body["models"]} == {m["id"] for m in body["data"]}
    by_id = {m["id"]: m for m in body["data"]}
    assert by_id["gpt-4o-mini"]["owned_by"] == "openai"
    spec = {m["name"]: m for m in body["models"]}
    assert spec["gpt-4o-mini"]["ctx_size"] == 128_000  # the maintained table of hosted models


async def test_openai_sdk_lists_and_retrieves_models(app: ServedApp) -> None:
    client = oai_client(app)
    listed = [m.id for m in client.models.list()]
    assert {"gpt-4o-mini", "gpt-4o", "claude-sonnet-4-5"} <= set(listed)
    model = client.models.retrieve("claude-sonnet-4-5")
    assert (model.id, model.object, model.owned_by) == ("claude-sonnet-4-5", "model", "anthropic")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


async def test_unknown_model_is_a_design_404(app: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        answer = await http.get("/models/no-such-model")
        body: dict[str, Any] = answer.json()
        assert answer.status_code == 404
        assert body["ok"] is False and body["code"] == "model_not_found", body
        assert body["request_id"]
        one = (await http.get("/models/gpt-4o")).json()
        validate(one, "Model")
        assert (await http.get("/models/gpt-4o")).status_code == 200
        anonymous = await http.get("/models/gpt-4o", headers={"Authorization": ""})
        assert anonymous.status_code == 401


async def test_embeddings_local_through_the_openai_sdk(app: ServedApp) -> None:
    client = oai_client(app)
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=["a cat", "a dog"])
    validate(answer.model_dump(exclude_unset=True), "CreateEmbeddingResponse")
    assert [d.index for d in answer.data] == [0, 1]
    assert all(len(d.embedding) == 384 for d in answer.data)
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens
    # The SDK asks for base64 by default when none is given and decodes it: same vectors.
    default = client.embeddings.create(model="local", input="a cat")
    assert default.data[0].embedding == pytest.approx(answer.data[0].embedding, abs=1e-6)


async def test_embeddings_body_and_errors(app: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        body = (await http.post("/embeddings", json={"model": "local", "input": "hi"})).json()
        validate(body, "CreateEmbeddingResponse")
        for bad, field in (
            ({"model": "local", "input": [[1, 2, 3]]}, "token arrays"),
            ({"model": "local", "input": []}, "input"),
            ({"model": "local", "input": "x", "dimensions": 8}, "dimensions"),
            ({"model": "local", "input": "x", "encoding_format": "hex"}, "encoding_format"),
            ({"input": "x"}, "model"),
        ):
            answer = await http.post("/embeddings", json=bad)
            assert answer.status_code == 400, (bad, answer.text)
            error = answer.json()
            assert error["ok"] is False and field in error["error"] + str(error), error
        anonymous = await http.post(
            "/embeddings", json={"model": "local", "input": "x"}, headers={"Authorization": ""}
        )
        assert anonymous.status_code == 401


async def test_embeddings_through_the_openai_provider(
    app: ServedApp, upstreams: tuple[Any, Any]
) -> None:
    client = oai_client(app)
    answer = client.embeddings.create(
        model="gpt-4o-mini", input=["hello world", "world"], encoding_format="float"
    )
    validate(answer.model_dump(exclude_unset=True), "CreateEmbeddingResponse")
    assert len(answer.data) == 2 and answer.model == "gpt-4o-mini"
    assert answer.usage.prompt_tokens == 3  # the upstream's count (the fake counts words)


async def _chat_bodies(app: ServedApp, model: str) -> tuple[dict[str, Any], list[Any]]:
    """One non-streamed answer and every chunk of one streamed answer (with usage)."""
    request = {
        "model": model,
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [WEATHER_TOOL_OPENAI],
    }
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        whole = (await http.post("/chat/completions", json=request)).json()
        streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
        chunks = []
        async with http.stream("POST", "/chat/completions", json=streamed) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data: ") :]))
    return whole, chunks


@pytest.mark.parametrize("reply", ["text", "tool"])
async def test_chat_from_anthropic_upstream_matches_openai_schemas(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic], reply: str
) -> None:
    _, ant = upstreams
    for _ in range(2):
        ant.enqueue(
            text_reply("Bonjour!", input_tokens=2, output_tokens=3)
            if reply == "text"
            else tool_reply("get_weather", {"city": "Paris"}, id="toolu_1", text="Checking.")
        )
    whole, chunks = await _chat_bodies(app, "claude-sonnet-4-5")
    validate(whole, "CreateChatCompletionResponse")
    assert chunks
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")


@pytest.mark.parametrize("reply", ["text", "tool"])
async def test_chat_from_openai_upstream_matches_openai_schemas(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic], reply: str
) -> None:
    oai, _ = upstreams
    answer = (
        FakeReply(text="It is sunny.")
        if reply == "text"
        else FakeReply(tool_calls=[FakeToolCall("get_weather", {"city": "Rome"}, id="call_r")])
    )
    oai.script([answer, answer])
    whole, chunks = await _chat_bodies(app, "gpt-4o-mini")
    validate(whole, "CreateChatCompletionResponse")
    assert chunks
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
