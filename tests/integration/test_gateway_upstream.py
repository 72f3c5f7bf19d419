"""The gateway's upstream calls (the real app under uvicorn, a loopback OpenAI-format
upstream): they carry no state from one call to the next."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.integration.test_gateway import gateway_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[OpenAIFake, FakeAnthropic]]:
    async with OpenAIFake(api_key="sk-openai") as oai, FakeAnthropic(api_key="sk-ant") as ant:
        yield oai, ant


async def test_a_cookie_from_one_call_never_rides_on_the_next(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, ant = upstreams
    oai.script(
        [
            FakeReply(text="a", headers={"Set-Cookie": "sticky=tenant-a; Path=/"}),
            FakeReply(text="b"),
            FakeReply(text="c"),
        ]
    )
    async with (
        ServedApp(gateway_settings(make_settings, oai, ant)) as app,
        httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN, timeout=10) as http,
    ):
        for body in (CHAT, CHAT, {**CHAT, "stream": True}):
            r = await http.post("/chat/completions", json=body)
            assert r.status_code == 200, r.text
    first, *later = oai.chat_requests
    assert "cookie" not in first.headers
    assert [r.headers.get("cookie") for r in later] == [None, None]
    assert all(r.json["messages"] == CHAT["messages"] for r in oai.chat_requests)
