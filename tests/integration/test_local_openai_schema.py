"""A local model's OpenAI surface against OpenAI's published schemas (tests/openai_schema.py):
the bundled cyllama launcher serving SmolLM2 (the real 98 MB model, no fake), both on its own
port and through our gateway; `/chat/completions` bodies and every stream chunk, with
`stream_options.include_usage`, `seed`, `stop` and `max_tokens`; `n` > 1 and tools, which
the launcher cannot honour, are a clear 400; `GET /models` and `GET /models/{id}`.

One app and one instance for the whole module: starting them is most of the cost."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.inference import ready_endpoints
from tests.conftest import ADMIN_TOKEN, empty_redis, with_database
from tests.integration.test_inference_instances import SMOL, InferenceApp, wait_state
from tests.openai_schema import validate
from tests.sse import sse_frames

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CTX = 2048  # the instance's window; the GGUF's own (n_ctx_train) is larger
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class Local:
    app_url: str
    user: dict[str, str]  # a user's token for the app
    base_url: str  # the instance's OpenAI root, http://127.0.0.1:<port>/v1
    keyed: dict[str, str]  # the instance's own key
    idle: dict[str, Any]  # GET /models and GET /models/{SMOL} before the instance started


@pytest.fixture(scope="module")
async def local(
    pg_uri: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Local]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    await empty_redis(redis_url)
    tmp = tmp_path_factory.mktemp("local-openai")
    settings = Settings.load(
        environ={},
        database_url=with_database(pg_uri, name),
        redis_url=redis_url,
        data_dir=tmp / "data",
        admin_token=ADMIN_TOKEN,
        models_dir=tmp / "models",
        inference_poll_interval_s=0.2,
        inference_health_timeout_s=5.0,
        inference_start_timeout_s=60.0,
        inference_threads=2,
        inference_ctx_size=CTX,
    )
    try:
        async with InferenceApp(settings) as app:
            async with httpx.AsyncClient(base_url=app.url, timeout=60) as c:
                made = await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": "lou"})
                assert made.status_code == 200, made.text
                user = {"Authorization": f"Bearer {made.json()['token']}"}
                assert (await c.post("/api/v1/discover", headers=ADMIN)).status_code == 200
                idle = {
                    "list": (await c.get("/api/v1/models", headers=user)).json(),
                    "one": (await c.get(f"/api/v1/models/{SMOL}", headers=user)).json(),
                }
                r = await c.post("/api/v1/inference", headers=user, json={"model": SMOL})
                assert r.status_code == 200, r.text
                ready = await wait_state(c, r.json()["id"], {"ready"})
                db = await connect(settings.database_url)
                try:
                    key = (await ready_endpoints(db.pool))[0].api_key
                finally:
                    await db.close()
                keyed = {"Authorization": f"Bearer {key}"}
                yield Local(app.url, user, ready["base_url"], keyed, idle)
                await c.post("/api/v1/stop-all", headers=ADMIN)
    finally:
        conn = await asyncpg.connect(pg_uri)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


# The two ways to reach the model: the launcher on its own port (with its key), and our
# gateway (a user's token, the model by name).
@pytest.fixture(params=["launcher", "gateway"])
async def chat(request: pytest.FixtureRequest, local: Local) -> AsyncIterator[httpx.AsyncClient]:
    if request.param == "launcher":
        base, headers = local.base_url, local.keyed
    else:
        base, headers = f"{local.app_url}/api/v1", local.user
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
        yield client


def _body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": SMOL, "messages": [{"role": "user", "content": prompt}], **extra}


async def _complete(c: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    validate(answer, "CreateChatCompletionResponse")
    return answer


async def _stream(c: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with c.stream("POST", "/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = [f async for f in sse_frames(r) if "data" in f]  # heartbeats are comments
    assert frames[-1] == {"data": "[DONE]"}
    chunks = [json.loads(f["data"]) for f in frames[:-1]]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    assert len({ch["id"] for ch in chunks}) == 1 and len({ch["created"] for ch in chunks}) == 1
    return chunks


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])


def _finish_reasons(chunks: list[dict[str, Any]]) -> list[str]:
    return [
        ch["choices"][0]["finish_reason"]
        for ch in chunks
        if ch["choices"] and ch["choices"][0]["finish_reason"]
    ]


async def test_completion_max_tokens_seed_and_stop(chat: httpx.AsyncClient) -> None:
    # max_tokens: cut at the limit, finish_reason length, usage counted.
    greedy = _body("Count from one to twenty, separated by commas.", temperature=0)
    cut = await _complete(chat, {**greedy, "max_tokens": 12})
    choice = cut["choices"][0]
    assert cut["object"] == "chat.completion" and cut["model"] == SMOL
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    usage = cut["usage"]
    assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    # stop: greedy decoding repeats itself, so a piece of the first answer stops the second
    # just before it, with finish_reason stop.
    text = choice["message"]["content"]
    word = next(w for w in text.split()[1:] if w.strip(",."))
    stopped = await _complete(chat, {**greedy, "max_tokens": 12, "stop": [word, "\n\n\n"]})
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == text[: text.index(word)]

    # seed: sampled (temperature 1) answers with one seed are the same.
    sampled = _body("Name a colour.", temperature=1.0, max_tokens=8, seed=1234)
    first, second = [await _complete(chat, sampled) for _ in range(2)]
    assert first["choices"][0]["message"] == second["choices"][0]["message"]


async def test_stream_chunks(chat: httpx.AsyncClient) -> None:
    body = _body("Count from one to ten.", temperature=0, max_tokens=10)
    plain = await _stream(chat, body)
    assert plain[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(ch["object"] == "chat.completion.chunk" for ch in plain)
    assert _finish_reasons(plain) == ["length"] and plain[-1]["choices"][0]["finish_reason"]
    assert _text(plain)
    # Greedy: the stream says what the plain completion says.
    whole = await _complete(chat, body)
    assert _text(plain) == whole["choices"][0]["message"]["content"]
    # One backend configuration: one fingerprint on the answer and every chunk (or none).
    assert len({ch.get("system_fingerprint") for ch in [*plain, whole]}) == 1

    # include_usage: usage null on every chunk but the last, which has no choices.
    counted = await _stream(chat, {**body, "stream_options": {"include_usage": True}})
    assert _text(counted) == _text(plain) and _finish_reasons(counted) == ["length"]
    assert all(ch["usage"] is None for ch in counted[:-1])
    last = counted[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 10
    assert last["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 10

    # A stop string in a stream: the text before it, finish_reason stop.
    text = _text(plain)
    word = next(w for w in text.split()[1:] if w.strip(",."))
    stopped = await _stream(chat, {**body, "stop": word})
    assert _text(stopped) == text[: text.index(word)]
    assert _finish_reasons(stopped) == ["stop"]


def _names(error: dict[str, Any], field: str) -> bool:
    """Whether a 400 names `field`: llama-server's OpenAI-shaped body in its message; our
    DESIGN body in `fields` (the gateway refused it) or in the message (the upstream's 400,
    passed on: a real llama-server with --jinja may take tools, so only it can say)."""
    if isinstance(error.get("error"), dict):  # the launcher's
        assert error["error"]["type"] == "invalid_request_error", error
        message = str(error["error"]["message"])
    else:
        assert error["ok"] is False and error["request_id"], error
        message = str(error["error"])
        if field in [f["field"] for f in error.get("fields", [])]:
            return True
    return re.search(rf"\b{field}\b", message) is not None


async def test_n_above_one_is_a_clear_400(chat: httpx.AsyncClient) -> None:
    for stream in (False, True):
        r = await chat.post("/chat/completions", json=_body("Hi", n=2, max_tokens=4, stream=stream))
        assert r.status_code == 400, r.text
        assert _names(r.json(), "n")
    r = await chat.post("/chat/completions", json=_body("Hi", n=1, max_tokens=4))
    assert r.status_code == 200
    validate(r.json(), "CreateChatCompletionResponse")


async def test_tools_are_a_clear_400(chat: httpx.AsyncClient) -> None:
    body = _body("What is the weather in Paris?", tools=[TOOL], max_tokens=16)
    for stream in (False, True):
        r = await chat.post("/chat/completions", json={**body, "stream": stream})
        assert r.status_code == 400, r.text
        assert _names(r.json(), "tools") and "not supported" in r.text


async def test_launcher_models(local: Local) -> None:
    async with httpx.AsyncClient(base_url=local.base_url, headers=local.keyed) as c:
        listed = (await c.get("/models")).json()
    validate(listed, "ListModelsResponse")
    [model] = listed["data"]
    validate(model, "Model")
    assert model["id"] == SMOL and model["object"] == "model"
    # llama-server's meta: the GGUF's trained window; SmolLM2 was trained on 8192 tokens.
    assert model["meta"]["n_ctx_train"] == 8192


async def test_gateway_models(local: Local) -> None:
    # No instance yet: the GGUF's own window, as llama.cpp reads it from the file.
    validate(local.idle["list"], "ListModelsResponse")
    validate(local.idle["one"], "Model")
    [entry] = [m for m in local.idle["list"]["data"] if m["id"] == SMOL]
    assert entry == local.idle["one"] and entry["ctx_size"] == 8192
    assert {"name": SMOL, "status": "available", "provider": "local", "ctx_size": 8192} in (
        local.idle["list"]["models"]
    )

    async with httpx.AsyncClient(base_url=f"{local.app_url}/api/v1", headers=local.user) as c:
        listed = (await c.get("/models")).json()
        one = (await c.get(f"/models/{SMOL}")).json()
    validate(listed, "ListModelsResponse")
    [entry] = [m for m in listed["data"] if m["id"] == SMOL]
    validate(entry, "Model")
    validate(one, "Model")
    assert entry == one
    assert entry["owned_by"] == "local" and entry["created"] > 0
    # The window a caller can use: the running instance's; SPEC's list says the same.
    assert entry["ctx_size"] == CTX
    assert {"name": SMOL, "status": "loaded", "provider": "local", "ctx_size": CTX} in listed[
        "models"
    ]


CITY = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "population": {"type": "integer"},
            },
            "required": ["name", "population"],
            "additionalProperties": False,
        },
    },
}


async def test_response_format_is_grammar_constrained(chat: httpx.AsyncClient) -> None:
    # The 135M model would not answer JSON unprompted: the grammar makes it (as llama-server's
    # json_schema_to_grammar does); the gateway passes response_format to the local server.
    ask = _body("Tell me about Paris.", temperature=0, max_tokens=60)
    answer = await _complete(chat, {**ask, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(answer["choices"][0]["message"]["content"]), dict)
    # Closed, the object ends the answer (no whitespace padding up to max_tokens).
    assert answer["choices"][0]["finish_reason"] == "stop"

    answer = await _complete(chat, {**ask, "response_format": CITY})
    assert answer["choices"][0]["finish_reason"] == "stop"
    city = json.loads(answer["choices"][0]["message"]["content"])
    assert set(city) == {"name", "population"} and isinstance(city["population"], int)
    chunks = await _stream(chat, {**ask, "response_format": CITY})
    assert json.loads(_text(chunks)) == city

    r = await chat.post("/chat/completions", json={**ask, "response_format": {"type": "yaml"}})
    assert r.status_code == 400 and _names(r.json(), "response_format"), r.text
