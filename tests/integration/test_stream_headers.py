"""Streamed `/chat/completions` and `/messages` through the real app (under uvicorn, real
Postgres and Redis) from each upstream as it answers on the wire: OpenAI's and Anthropic's
`text/event-stream; charset=utf-8`, llama.cpp's bare `text/event-stream`, vLLM's (uvicorn),
Ollama's `application/x-ndjson`, Gemini's SSE, Bedrock's binary event stream, and a stream
that names a wrong charset. Every upstream here ends its lines with CRLF (where it has lines)
and cuts its body every few bytes, inside multi-byte characters; the text must arrive whole."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import asyncpg
import httpx
import openai
import pytest

from orchestrator.config import Settings
from tests.conftest import ADMIN_TOKEN, ServedApp, empty_redis, with_database
from tests.fakes.anthropic_server import FakeAnthropic, text_reply
from tests.fakes.bedrock_server import ACCESS_KEY, SECRET_KEY, BedrockFake, BedrockTurn
from tests.fakes.gemini_server import GeminiFake, GeminiTurn
from tests.fakes.ollama_server import OllamaFake, OllamaTurn
from tests.fakes.openai_server import FakeReply, OpenAIFake

# 1-, 2-, 3- and 4-byte UTF-8 characters, each several times so a 3-byte cut lands inside
# every kind.
TEXT = "Grüße aus Köln, 你好世界, naïve café € 😀🎉 — ok ✓. Ünïcödé ends here: 𝄞"
CRLF = "\r\n"
CUT = 3  # bytes per chunk on the wire
MISLABELLED = "text/event-stream; charset=iso-8859-1"


@dataclass
class Peers:
    openai: OpenAIFake
    llamacpp: OpenAIFake
    vllm: OpenAIFake
    mislabelled: OpenAIFake
    anthropic: FakeAnthropic
    ollama: OllamaFake
    gemini: GeminiFake
    bedrock: BedrockFake
    app: ServedApp


# variant -> (model routed to it, how to script its next streamed answer of TEXT)
VARIANTS: dict[str, tuple[str, Callable[[Peers], None]]] = {
    "openai": (
        "gpt-4o-mini",
        lambda p: p.openai.script([FakeReply(text=TEXT, line_end=CRLF, byte_chunk=CUT)]),
    ),
    "llamacpp": (
        "local-llama",
        lambda p: p.llamacpp.script([FakeReply(text=TEXT, line_end=CRLF, byte_chunk=CUT)]),
    ),
    "vllm": (
        "vllm-model",
        lambda p: p.vllm.script([FakeReply(text=TEXT, line_end=CRLF, byte_chunk=CUT)]),
    ),
    "mislabelled": (
        "mislabelled-model",
        lambda p: p.mislabelled.script(
            [
                FakeReply(
                    text=TEXT,
                    line_end=CRLF,
                    byte_chunk=CUT,
                    headers={"content-type": MISLABELLED},
                )
            ]
        ),
    ),
    "anthropic": (
        "claude-sonnet-4-5",
        lambda p: p.anthropic.enqueue(text_reply(TEXT, line_end=CRLF, byte_chunk=CUT)),
    ),
    "ollama": (
        "llama3.2",
        lambda p: p.ollama.script(OllamaTurn(content=TEXT, line_end=CRLF, byte_chunk=CUT)),
    ),
    "gemini": (
        "gemini-2.0-flash",
        lambda p: p.gemini.script(
            GeminiTurn(parts=[{"text": TEXT[:20]}, {"text": TEXT[20:]}], byte_chunk=CUT)
        ),
    ),
    "bedrock": ("nova", lambda p: p.bedrock.script(BedrockTurn(text=TEXT, byte_chunk=CUT))),
}


def _settings(peers: dict[str, Any], database_url: str, redis_url: str, data: Path) -> Settings:
    def custom(name: str, fake: OpenAIFake, model: str) -> dict[str, Any]:
        return {"id": name, "format": "openai", "base_url": fake.base_url, "models": [model]}

    return Settings.load(
        environ={},
        database_url=database_url,
        redis_url=redis_url,
        data_dir=data,
        admin_token=ADMIN_TOKEN,
        rate_limit_per_minute=0,
        provider_retry_backoff_s=0.01,
        providers={
            "openai": {
                "base_url": peers["openai"].base_url,
                "api_key": "sk-o",
                "models": ["gpt-4o-mini"],
            },
            "anthropic": {
                "base_url": peers["anthropic"].url,
                "api_key": "sk-a",
                "models": ["claude-sonnet-4-5"],
            },
            "ollama": {"base_url": peers["ollama"].url, "models": ["llama3.2"]},
            "gemini": {
                "base_url": peers["gemini"].base_url,
                "api_key": "g-key",
                "models": ["gemini-2.0-flash"],
            },
            "bedrock": {
                "base_url": peers["bedrock"].url,
                "region": "us-east-1",
                "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY,
                "models": ["nova"],
                "model_id": "amazon.nova-lite-v1:0",
            },
        },
        custom_providers=[
            custom("llamacpp", peers["llamacpp"], "local-llama"),
            custom("vllm", peers["vllm"], "vllm-model"),
            custom("mislabelled", peers["mislabelled"], "mislabelled-model"),
        ],
    )


@pytest.fixture(scope="module")
async def peers(
    pg_uri: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Peers]:
    # Module-scoped (make_settings is per test): every upstream and one app in front of them,
    # on a database of this module's own.
    await empty_redis(redis_url)
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    async with AsyncExitStack() as stack:
        fakes: dict[str, Any] = {
            "openai": OpenAIFake(api_key="sk-o"),
            "llamacpp": OpenAIFake(profile="llamacpp", models=["local-llama"]),
            "vllm": OpenAIFake(profile="vllm", models=["vllm-model"]),
            "mislabelled": OpenAIFake(profile="vllm", models=["mislabelled-model"]),
            "anthropic": FakeAnthropic(api_key="sk-a"),
            "ollama": OllamaFake(),
            "gemini": GeminiFake(api_key="g-key"),
            "bedrock": BedrockFake(),
        }
        for fake in fakes.values():
            await stack.enter_async_context(fake)
        settings = _settings(
            fakes,
            with_database(pg_uri, name),
            redis_url,
            tmp_path_factory.mktemp("stream-headers") / "data",
        )
        app = await stack.enter_async_context(ServedApp(settings))
        yield Peers(**fakes, app=app)
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_chat_completions_stream_arrives_whole(peers: Peers, variant: str) -> None:
    model, script = VARIANTS[variant]
    script(peers)
    async with openai.AsyncOpenAI(
        base_url=f"{peers.app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "grüß dich"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == TEXT


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_messages_stream_arrives_whole(peers: Peers, variant: str) -> None:
    model, script = VARIANTS[variant]
    script(peers)
    async with (
        anthropic.AsyncAnthropic(
            base_url=f"{peers.app.url}/api", api_key=ADMIN_TOKEN, max_retries=0
        ) as client,
        client.messages.stream(
            model=model, max_tokens=256, messages=[{"role": "user", "content": "grüß dich"}]
        ) as stream,
    ):
        text = "".join([t async for t in stream.text_stream])
    assert text == TEXT


# What each fake must send, checked on its own: a fake more polite than its peer (a charset
# the peer leaves out, say) is how issue 28 went unseen.
STREAM_TYPES = {
    "openai": "text/event-stream; charset=utf-8",
    "llamacpp": "text/event-stream",
    "vllm": "text/event-stream; charset=utf-8",
    "anthropic": "text/event-stream; charset=utf-8",
    "ollama": "application/x-ndjson",
    "gemini": "text/event-stream",
}


async def _stream_head(peers: Peers, variant: str) -> httpx.Headers:
    fake: Any = getattr(peers, variant)
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    if isinstance(fake, OpenAIFake):
        url, body, headers = (
            f"{fake.base_url}/chat/completions",
            chat,
            {"authorization": "Bearer sk-o"},
        )
    elif isinstance(fake, FakeAnthropic):
        url, body = f"{fake.url}/v1/messages", {**chat, "max_tokens": 8}
        headers = {"x-api-key": "sk-a", "anthropic-version": "2023-06-01"}
    elif isinstance(fake, OllamaFake):
        url, body, headers = f"{fake.url}/api/chat", chat, {}
    else:
        url = f"{fake.base_url}/models/m:streamGenerateContent?alt=sse"
        body, headers = (
            {"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
            {"x-goog-api-key": "g-key"},
        )
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("POST", url, json=body, headers=headers) as response,
    ):
        await response.aread()
        assert response.status_code == 200
        return response.headers


@pytest.mark.parametrize("variant", list(STREAM_TYPES))
async def test_each_fake_streams_with_its_peers_content_type(peers: Peers, variant: str) -> None:
    headers = await _stream_head(peers, variant)
    assert headers["content-type"] == STREAM_TYPES[variant]
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    if variant == "llamacpp":
        assert (headers["server"], headers["x-accel-buffering"]) == ("llama.cpp", "no")
        assert headers["keep-alive"] == "timeout=5, max=100" and "date" not in headers
    if variant == "vllm":
        assert headers["server"] == "uvicorn"
    if variant in ("openai", "anthropic"):
        assert headers["server"] == "cloudflare"
