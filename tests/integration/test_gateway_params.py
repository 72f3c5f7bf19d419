"""Optional request fields over HTTP (the real app, Postgres and Redis, loopback upstreams):
an unsupported one is a DESIGN error body (400) naming field and provider on both
/chat/completions and /messages; with `drop_unsupported_params` it is dropped and listed in
`X-Orchestrator-Dropped-Params`, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ServedApp
from tests.fakes.anthropic_server import FakeAnthropic, text_reply
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.integration.test_gateway import ADMIN, gateway_settings

DROPPED = "x-orchestrator-dropped-params"


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[OpenAIFake, FakeAnthropic]]:
    async with OpenAIFake(api_key="sk-openai") as oai, FakeAnthropic(api_key="sk-ant") as ant:
        yield oai, ant


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_unsupported_field_is_a_400_naming_field_and_provider(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    async with (
        ServedApp(gateway_settings(make_settings, oai, ant)) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=30) as client,
    ):
        r = await client.post("/chat/completions", json=chat("claude-sonnet-4-5", seed=7))
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["ok"] is False and body["request_id"]
        assert "seed" in body["error"] and "anthropic" in body["error"]
        # n > 1: one choice is all an answer carries, whichever the provider.
        for model, provider in (("claude-sonnet-4-5", "anthropic"), ("gpt-4o-mini", "openai")):
            r = await client.post("/chat/completions", json=chat(model, n=2))
            assert r.status_code == 400, r.text
            assert "n:" in r.json()["error"] and provider in r.json()["error"]
        assert ant.requests == []
        # The Anthropic-shaped route: `thinking` to an OpenAI model.
        r = await client.post(
            "/messages",
            json={
                **chat("gpt-4o-mini"),
                "max_tokens": 64,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            },
        )
        assert r.status_code == 400, r.text
        assert "thinking" in r.json()["error"] and "openai" in r.json()["error"]
        assert oai.chat_requests == []


async def test_dropped_fields_are_listed_in_a_header(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant, drop_unsupported_params=True)
    async with (
        ServedApp(settings) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=30) as client,
    ):
        ant.enqueue(text_reply("ok"))
        r = await client.post(
            "/chat/completions",
            json=chat("claude-sonnet-4-5", seed=7, logit_bias={"1": 2}, max_tokens=16),
        )
        assert r.status_code == 200, r.text
        assert r.headers[DROPPED] == "seed,logit_bias"
        # Structured output is no longer dropped for Anthropic: it is translated.
        ant.enqueue(text_reply('{"city": "Paris"}'))
        r = await client.post(
            "/chat/completions",
            json=chat("claude-sonnet-4-5", response_format={"type": "json_object"}, n=2),
        )
        assert r.status_code == 200, r.text
        assert r.headers[DROPPED] == "n"
        assert ant.requests[-1].json["output_config"]["format"]["type"] == "json_schema"
        assert r.json()["choices"][0]["message"]["content"] == '{"city": "Paris"}'
        assert "seed" not in ant.requests[-1].json and "logit_bias" not in ant.requests[-1].json
        # Streamed, the header is there too; nothing dropped: no header.
        ant.enqueue(text_reply("ok"))
        async with client.stream(
            "POST", "/chat/completions", json=chat("claude-sonnet-4-5", seed=7, stream=True)
        ) as s:
            assert s.status_code == 200
            assert s.headers[DROPPED] == "seed"
            assert "[DONE]" in "".join([line async for line in s.aiter_lines()])
        oai.script([FakeReply(text="ok")])
        r = await client.post("/chat/completions", json=chat("gpt-4o-mini", seed=7))
        assert r.status_code == 200 and DROPPED not in r.headers
        assert oai.chat_requests[-1].json["seed"] == 7


async def test_no_field_is_ignored_silently(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """Every field of OpenAI's request is handled, passed on where the provider documents
    it, or a 400 naming field and provider; a field of neither API is a 400 naming it."""
    oai, ant = upstreams
    async with (
        ServedApp(gateway_settings(make_settings, oai, ant)) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=30) as client,
    ):
        # logprobs: OpenAI returns them (test_gateway_fidelity.py); Anthropic has none.
        r = await client.post("/chat/completions", json=chat("claude-sonnet-4-5", logprobs=True))
        assert r.status_code == 400, r.text
        assert "logprobs" in r.json()["error"] and "anthropic" in r.json()["error"]
        # Request-side fields reach OpenAI as they are.
        oai.script([FakeReply(text="ok")])
        r = await client.post(
            "/chat/completions",
            json=chat("gpt-4o-mini", service_tier="flex", store=False, verbosity="low"),
        )
        assert r.status_code == 200, r.text
        sent = oai.chat_requests[-1].json
        assert (sent["service_tier"], sent["store"], sent["verbosity"]) == ("flex", False, "low")
        # ...and are refused where the provider has no such field.
        r = await client.post(
            "/chat/completions", json=chat("claude-sonnet-4-5", service_tier="flex")
        )
        assert r.status_code == 400 and "anthropic" in r.json()["error"], r.text
        # Not a field of either API.
        for route, body in (
            ("/chat/completions", chat("gpt-4o-mini", temprature=0.2)),
            ("/messages", {**chat("claude-sonnet-4-5"), "max_tokens": 8, "temprature": 0.2}),
        ):
            r = await client.post(route, json=body)
            assert r.status_code == 400, r.text
            assert "temprature" in r.json()["error"]
        # Anthropic's top_k reaches Anthropic.
        ant.enqueue(text_reply("ok"))
        r = await client.post(
            "/messages", json={**chat("claude-sonnet-4-5"), "max_tokens": 8, "top_k": 5}
        )
        assert r.status_code == 200, r.text
        assert ant.requests[-1].json["top_k"] == 5
