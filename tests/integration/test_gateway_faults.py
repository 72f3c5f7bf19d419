"""Gateway failure paths: fallback when a stream fails right after its start, no waiting on
a long Retry-After, heartbeats before the first event, errors after the response started,
clients that leave, and the breaker's half-open trial that never reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator.providers import CircuitBreaker
from orchestrator.providers._http import retry_after_of
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import FakeAnthropic, text_reply
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.integration.test_gateway import ant_client, gateway_settings, oai_client

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STREAM = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "stream": True}


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[OpenAIFake, FakeAnthropic]]:
    async with OpenAIFake(api_key="sk-openai") as oai, FakeAnthropic(api_key="sk-ant") as ant:
        yield oai, ant


def _content(raw: str) -> str:
    return "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in raw.splitlines()
        if line.startswith("data: {")
    )


async def test_stream_falls_back_when_upstream_fails_right_after_start(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(
        make_settings,
        oai,
        ant,
        provider_retries=0,
        fallback_models={"gpt-4o": ["claude-sonnet-4-5"]},
    )
    # One chunk (the role chunk: message start, no content yet), then an error chunk.
    oai.script([FakeReply(text="never", fail_after=1, fail_with="error_chunk")])
    ant.enqueue(text_reply("from the fallback"))
    async with ServedApp(settings) as app:
        client = oai_client(app)

        def consume() -> str:
            stream = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        assert await asyncio.to_thread(consume) == "from the fallback"
    assert len(oai.chat_requests) == 1 and len(ant.requests) == 1


async def test_anthropic_error_right_after_message_start_falls_back(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(
        make_settings,
        oai,
        ant,
        provider_retries=0,
        fallback_models={"claude-sonnet-4-5": ["gpt-4o"]},
    )
    ant.enqueue(text_reply("never", error_after=1))  # message_start, then event: error
    oai.script([FakeReply(text="openai saves the day")])
    async with ServedApp(settings) as app:
        client = ant_client(app)

        def consume() -> str:
            with client.messages.stream(
                model="claude-sonnet-4-5",
                max_tokens=20,
                messages=[{"role": "user", "content": "x"}],
            ) as stream:
                return "".join(stream.text_stream)

        assert await asyncio.to_thread(consume) == "openai saves the day"


async def test_long_retry_after_falls_back_without_waiting(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(
        make_settings,
        oai,
        ant,
        provider_retries=3,
        fallback_models={"gpt-4o": ["claude-sonnet-4-5"]},
    )
    oai.script([FakeReply.rate_limited(retry_after=30)])
    ant.enqueue(text_reply("no waiting"))
    async with ServedApp(settings) as app:
        started = time.monotonic()
        r = await asyncio.to_thread(
            oai_client(app).chat.completions.create,
            model="gpt-4o",
            messages=[{"role": "user", "content": "x"}],
        )
        assert time.monotonic() - started < 5
    assert r.choices[0].message.content == "no waiting"
    assert len(oai.chat_requests) == 1


async def test_heartbeats_before_the_first_event_and_late_errors_are_frames(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant, stream_heartbeat_s=0.2, provider_retries=0)
    oai.script(
        [
            FakeReply(text="late but fine", delay_s=0.7),  # nothing at all for 0.7 s
            dataclasses.replace(FakeReply.server_error(503), delay_s=0.7),
        ]
    )
    async with (
        ServedApp(settings) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=10) as http,
    ):
        async with http.stream("POST", "/chat/completions", json=STREAM) as r:
            assert r.status_code == 200  # answered before the upstream said anything
            raw = (await r.aread()).decode()
        assert raw.startswith(": heartbeat\n\n")
        assert _content(raw) == "late but fine" and raw.endswith("data: [DONE]\n\n")
        async with http.stream("POST", "/chat/completions", json=STREAM) as r:
            assert r.status_code == 200
            raw = (await r.aread()).decode()
        assert raw.startswith(": heartbeat\n\n")
        frames = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        assert frames[-1]["error"]["code"] == "upstream_error", frames  # a frame, not a status
        assert "overloaded" in frames[-1]["error"]["message"]
        assert not raw.endswith("data: [DONE]\n\n")


async def test_client_leaving_mid_stream_closes_the_upstream(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant)
    oai.script([FakeReply(text="x" * 200, text_chunk=1, delay_s=0.05), FakeReply(text="next")])
    async with ServedApp(settings) as app:
        async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
            async with http.stream("POST", "/chat/completions", json=STREAM) as r:
                async for _ in r.aiter_bytes():
                    break  # leave after the first bytes
        # The upstream call ended (cancelled), and the provider still serves the next call.
        r2 = await asyncio.to_thread(
            oai_client(app).chat.completions.create,
            model="gpt-4o",
            messages=[{"role": "user", "content": "x"}],
        )
        assert r2.choices[0].message.content == "next"
        async with httpx.AsyncClient() as http:
            got = await http.get(f"{app.url}/api/v1/providers/health/openai", headers=ADMIN)
        assert got.json()["breaker"] == "closed"


def test_half_open_trial_that_never_reports_is_presumed_lost() -> None:
    now = [0.0]
    breaker = CircuitBreaker(1, 10.0, clock=lambda: now[0], trial_lease_s=30.0)
    breaker.failure("boom")
    now[0] = 11.0
    assert breaker.allow() is True  # the trial goes out... and its caller vanishes
    assert breaker.allow() is False
    now[0] = 42.0
    assert breaker.allow() is True  # lease over: a new trial
    breaker.success()
    assert breaker.allow() is True


def test_retry_after_as_http_date() -> None:
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 20))
    got = retry_after_of(httpx.Response(429, headers={"Retry-After": when}))
    assert got is not None and 15 < got <= 21
    assert retry_after_of(httpx.Response(429, headers={"Retry-After": "7"})) == 7.0
    assert retry_after_of(httpx.Response(429, headers={"Retry-After": "soon"})) is None
    past = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after_of(httpx.Response(429, headers={"Retry-After": past})) == 0.0
