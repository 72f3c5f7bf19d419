"""Anthropic Messages fidelity and OpenAI logprobs through the gateway (issue 34): the real
app under uvicorn in front of loopback upstreams (tests/fakes), driven by the official
`anthropic` and `openai` SDKs and by the exact requests Claude Code 2.1 sent
(/tmp/agents/captures, copied into tests/reference/claude_code_requests.json)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import FakeAnthropic, Reply, text_reply, thinking_reply
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.openai_schema import validate

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CAPTURES = Path(__file__).resolve().parents[1] / "reference" / "claude_code_requests.json"
DROPPED = "X-Orchestrator-Dropped-Params"
PDF = base64.b64encode(b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<<>>\n%%EOF").decode()


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[OpenAIFake, FakeAnthropic]]:
    async with OpenAIFake(api_key="sk-openai") as oai, FakeAnthropic(api_key="sk-ant") as ant:
        yield oai, ant


def settings_for(make_settings: Any, oai: OpenAIFake, ant: FakeAnthropic, **kw: Any) -> Any:
    return make_settings(
        providers={
            "openai": {"base_url": oai.base_url, "api_key": "sk-openai", "models": ["gpt-4o-mini"]},
            "anthropic": {
                "base_url": ant.url,
                "api_key": "sk-ant",
                "models": ["claude-sonnet-4-5", "claude-opus-4-8"],
            },
        },
        provider_retry_backoff_s=0.01,
        rate_limit_per_minute=0,
        **kw,
    )


@pytest.fixture
async def app(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> AsyncIterator[ServedApp]:
    async with ServedApp(settings_for(make_settings, *upstreams)) as served:
        yield served


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in text.split("\n\n"):
        lines = frame.strip().splitlines()
        if len(lines) == 2 and lines[0].startswith("event: "):
            events.append((lines[0][7:], json.loads(lines[1].removeprefix("data: "))))
    return events


def _captured(n: int) -> dict[str, Any]:
    captured: dict[str, Any] = json.loads(CAPTURES.read_text())[f"claude-code-{n}"]
    return captured


def _replay_headers(captured: dict[str, Any]) -> dict[str, str]:
    """The client's headers, its key replaced by ours (x-api-key, as Claude Code sends it)."""
    skip = {"host", "content-length", "connection", "accept-encoding", "x-api-key"}
    headers = {k: v for k, v in captured["headers"].items() if k.lower() not in skip}
    return headers | {"x-api-key": ADMIN_TOKEN}


async def test_claude_code_requests_reach_anthropic_verbatim_with_cache_usage_back(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """Claude Code 2.1's first two requests, replayed byte for byte: a role-system message
    mid-conversation, adaptive thinking, context_management, output_config.effort, the
    `?beta=true` query, eight anthropic-beta flags, cache_control on system, user and
    tool_result blocks, a JSON string in metadata.user_id, 24 tools. The Anthropic upstream
    gets each body unchanged (model aside, which is the same here) with the beta header and
    query, and the cache usage it reports comes back in the stream's usage."""
    _, ant = upstreams
    async with httpx.AsyncClient(base_url=f"{app.url}/api", timeout=60) as client:
        for n in (2, 3):
            captured = _captured(n)
            ant.enqueue(
                text_reply(
                    "The secret word is rutabaga.",
                    input_tokens=9,
                    cache_creation_input_tokens=2048 if n == 2 else 0,
                    cache_read_input_tokens=0 if n == 2 else 2048,
                )
            )
            r = await client.post(
                captured["path"],
                content=json.dumps(captured["body"]),
                headers=_replay_headers(captured),
            )
            assert r.status_code == 200, r.text
            sent = ant.requests[-1]
            assert sent.path == "/v1/messages" and sent.json == captured["body"]
            assert sent.headers["anthropic-beta"] == captured["headers"]["anthropic-beta"]
            # Of the caller's headers only anthropic-beta goes on: never its key (ours is a
            # gateway token), nor its session id, app name or browser-access flag.
            assert ADMIN_TOKEN not in json.dumps(sent.headers)
            sent_names = {k.lower() for k in sent.headers}
            for name in (
                "x-claude-code-session-id",
                "x-app",
                "anthropic-dangerous-direct-browser-access",
            ):
                assert name not in sent_names, name
            assert ant.violations == []
            events = _sse(r.text)
            start = events[0][1]["message"]["usage"]
            end = next(d for name, d in events if name == "message_delta")["usage"]
            for usage in (start, end):
                assert usage["input_tokens"] == 9
                assert usage["cache_creation_input_tokens"] == (2048 if n == 2 else 0)
                assert usage["cache_read_input_tokens"] == (0 if n == 2 else 2048)
    # ?beta=true reached the upstream too: without it, a role-system message is refused there
    assert all(q.json.get("context_management") for q in ant.requests[-2:])


async def test_claude_code_request_to_other_providers_is_translated_or_refused_by_name(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """The same first request aimed at an OpenAI model: refused naming what OpenAI cannot
    take (context_management), or with drop_unsupported_params translated (the mid-
    conversation system message joins the system prompt, adaptive thinking at effort high is
    reasoning_effort high) and dropped-and-listed (context_management, cache_control)."""
    oai, ant = upstreams
    captured = _captured(2)
    body = {**captured["body"], "model": "gpt-4o-mini", "stream": False}
    for drop in (False, True):
        settings = settings_for(make_settings, oai, ant, drop_unsupported_params=drop)
        async with (
            ServedApp(settings) as app,
            httpx.AsyncClient(base_url=f"{app.url}/api", timeout=60) as client,
        ):
            oai.script([FakeReply(text="Reading it.", prompt_tokens=500, cached_tokens=384)])
            r = await client.post(
                "/v1/messages?beta=true", json=body, headers=_replay_headers(captured)
            )
            if not drop:
                assert r.status_code == 400, r.text
                assert "openai" in r.json()["error"]
                # cache_control is advisory (dropped and listed, never a 400)
                assert [f["field"] for f in r.json()["fields"]] == ["context_management"]
                continue
            assert r.status_code == 200, r.text
            assert set(r.headers[DROPPED].split(",")) == {"context_management", "cache_control"}
            sent = oai.chat_requests[-1].json
            assert sent["reasoning_effort"] == "high"
            assert sent["messages"][0]["role"] == "system"
            mid = captured["body"]["messages"][1]["content"]
            assert sent["messages"][0]["content"].endswith(mid)
            assert [m["role"] for m in sent["messages"]] == ["system", "user"]
            usage = r.json()["usage"]
            assert usage["cache_read_input_tokens"] == 384  # OpenAI's own cache
            assert usage["input_tokens"] == 500 - 384


async def test_cache_control_and_documents_pass_through_the_sdk(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """The official SDK's cache_control (system, tools, blocks) and document blocks (a base64
    PDF, plain text) reach Anthropic as sent; the cache usage comes back on the Message, and
    on /chat/completions as prompt_tokens_details.cached_tokens."""
    oai, ant = upstreams
    client = app.track(
        anthropic.Anthropic(base_url=f"{app.url}/api", api_key=ADMIN_TOKEN, max_retries=0)
    )
    ephemeral: Any = {"type": "ephemeral"}
    system: Any = [{"type": "text", "text": "Read documents.", "cache_control": ephemeral}]
    tools: Any = [
        {
            "name": "lookup",
            "description": "Look a word up",
            "input_schema": {"type": "object", "properties": {"w": {"type": "string"}}},
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        }
    ]
    content: Any = [
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
            "title": "report.pdf",
            "cache_control": ephemeral,
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "Plain notes."},
        },
        {"type": "text", "text": "Summarise.", "cache_control": ephemeral},
    ]
    ant.enqueue(text_reply("A report.", cache_read_input_tokens=1500, input_tokens=20))
    message = await asyncio.to_thread(
        client.messages.create,
        model="claude-sonnet-4-5",
        max_tokens=100,
        system=system,
        tools=tools,
        messages=[{"role": "user", "content": content}],
    )
    sent = ant.requests[-1].json
    assert sent["system"] == system and sent["tools"] == tools
    assert sent["messages"] == [{"role": "user", "content": content}]
    assert message.usage.cache_read_input_tokens == 1500 and message.usage.input_tokens == 20

    # The same document from /chat/completions (OpenAI's `file` part) is a document block.
    oai_client = app.track(
        openai.OpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0)
    )
    ant.enqueue(text_reply("A report.", cache_read_input_tokens=1500, input_tokens=20))
    file_part: Any = {
        "type": "file",
        "file": {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
    }
    completion = await asyncio.to_thread(
        oai_client.chat.completions.create,
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": [file_part, {"type": "text", "text": "Sum."}]}],
    )
    block = ant.requests[-1].json["messages"][0]["content"][0]
    assert block == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
        "title": "report.pdf",
    }
    assert completion.usage is not None and completion.usage.prompt_tokens == 1520
    details = completion.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == 1500

    # ...and an Anthropic document reaches OpenAI as its `file` part (schema-checked there).
    oai.script([FakeReply(text="ok")])
    r = await asyncio.to_thread(
        client.messages.create,
        model="gpt-4o-mini",
        max_tokens=100,
        messages=[{"role": "user", "content": content[:1] + content[2:]}],
    )
    assert r.content[0].type == "text"
    parts = oai.chat_requests[-1].json["messages"][0]["content"]
    assert parts[0] == {
        "type": "file",
        "file": {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
    }
    assert oai.violations == []
    # A document URL is refused by name for OpenAI (its file part takes inline data only).
    url_doc: Any = {"type": "document", "source": {"type": "url", "url": "https://x.test/a.pdf"}}
    with pytest.raises(anthropic.BadRequestError) as info:
        await asyncio.to_thread(
            client.messages.create,
            model="gpt-4o-mini",
            max_tokens=10,
            messages=[{"role": "user", "content": [url_doc]}],
        )
    assert "document" in str(info.value) and "openai" in str(info.value)


async def test_signed_and_redacted_thinking_round_trip_streamed(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """A streamed answer's thinking block keeps its signature (signature_delta) and a
    redacted_thinking block its data; sent back by the SDK, both reach Anthropic unchanged."""
    _, ant = upstreams
    client = app.track(
        anthropic.Anthropic(base_url=f"{app.url}/api", api_key=ADMIN_TOKEN, max_retries=0)
    )
    reply = thinking_reply("Let me think.", "Answer.", signature="EqQBCkgIARABGAIiQL")
    reply.content.insert(1, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"})
    ant.enqueue(reply)
    ask: Any = [{"role": "user", "content": "Think, then answer."}]

    def streamed() -> Any:
        with client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=4096,
            thinking={"type": "enabled", "budget_tokens": 2048},
            messages=ask,
        ) as stream:
            return stream.get_final_message()

    final = await asyncio.to_thread(streamed)
    blocks = [b.model_dump(exclude_none=True) for b in final.content]
    assert blocks[0] == {
        "type": "thinking",
        "thinking": "Let me think.",
        "signature": "EqQBCkgIARABGAIiQL",
    }
    assert blocks[1] == {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    ant.enqueue(text_reply("Done."))
    history: Any = [*ask, {"role": "assistant", "content": blocks}]
    history.append({"role": "user", "content": "Go on."})
    await asyncio.to_thread(
        client.messages.create,
        model="claude-sonnet-4-5",
        max_tokens=4096,
        thinking={"type": "enabled", "budget_tokens": 2048},
        messages=history,
    )
    assert ant.requests[-1].json["messages"][1]["content"][:2] == blocks[:2]


async def test_count_tokens_from_the_provider_or_estimated(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """`POST /messages/count_tokens` (the SDK's messages.count_tokens): Anthropic's own count
    for a Claude model, our estimate (marked) for a model whose provider has no count."""
    _, ant = upstreams
    client = app.track(
        anthropic.Anthropic(base_url=f"{app.url}/api", api_key=ADMIN_TOKEN, max_retries=0)
    )
    ant.token_count = 1234
    messages: Any = [{"role": "user", "content": "How many tokens is this? " * 10}]
    counted = await asyncio.to_thread(
        client.messages.with_raw_response.count_tokens,
        model="claude-sonnet-4-5",
        messages=messages,
        system="Be brief.",
    )
    assert counted.parse().input_tokens == 1234
    assert counted.headers["x-orchestrator-token-count"] == "provider"
    sent = ant.requests[-1]
    assert sent.path == "/v1/messages/count_tokens" and ant.violations == []
    assert sent.json == {"model": "claude-sonnet-4-5", "messages": messages, "system": "Be brief."}
    estimated = await asyncio.to_thread(
        client.messages.with_raw_response.count_tokens, model="gpt-4o-mini", messages=messages
    )
    assert estimated.headers["x-orchestrator-token-count"] == "estimate"
    assert estimated.parse().input_tokens == len(messages[0]["content"]) // 4 + 1
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", timeout=30) as raw:
        r = await raw.post("/messages/count_tokens", json={"model": "gpt-4o-mini"})
        assert r.status_code == 401  # the same auth as /messages
        r = await raw.post(
            "/messages/count_tokens",
            json={"model": "gpt-4o-mini", "messages": messages, "max_tokens": 5},
            headers=ADMIN,
        )
        assert r.status_code == 400 and "max_tokens" in r.text  # not a count_tokens field


async def test_logprobs_pass_to_openai_and_come_back_in_its_shape(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    oai, _ = upstreams
    client = app.track(
        openai.OpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0)
    )
    oai.script([FakeReply(text="Hello there")])
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as raw:
        r = await raw.post(
            "/chat/completions",
            json={
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "hi"}],
                "logprobs": True,
                "top_logprobs": 2,
            },
        )
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    sent = oai.chat_requests[-1].json
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == "Hello there"
    assert all(len(t["top_logprobs"]) == 2 for t in content)

    oai.script([FakeReply(text="Hello there", text_chunk=3)])
    stream = await asyncio.to_thread(
        client.chat.completions.create,
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        top_logprobs=1,
        stream=True,
    )
    tokens = [
        t.token
        for c in list(stream)
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for t in c.choices[0].logprobs.content
    ]
    assert "".join(tokens) == "Hello there"
    # The chunks as they went out, against OpenAI's schema.
    oai.script([FakeReply(text="Hello there")])
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as raw:
        r = await raw.post(
            "/chat/completions",
            json={
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "hi"}],
                "logprobs": True,
                "stream": True,
            },
        )
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: {")]
    for frame in frames:
        validate(json.loads(frame), "CreateChatCompletionStreamResponse")
    assert any(json.loads(f)["choices"][0]["logprobs"] for f in frames)


async def test_an_anthropic_answer_comes_back_verbatim_to_a_messages_caller(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic]
) -> None:
    """Non-streamed, what only Anthropic answers (server-tool blocks, citations, the applied
    context edits) reaches the caller as Anthropic sent it; the model is the one asked."""
    _, ant = upstreams
    content = [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_01",
            "name": "web_search",
            "input": {"query": "weather Paris"},
        },
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_01",
            "content": [{"type": "web_search_result", "url": "https://x.test", "title": "X"}],
        },
        {
            "type": "text",
            "text": "Sunny.",
            "citations": [{"type": "web_search_result_location", "url": "https://x.test"}],
        },
    ]
    ant.enqueue(Reply(content, cache_read_input_tokens=7))
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
    }
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as raw:
        r = await raw.post("/messages", json=body)
    assert r.status_code == 200, r.text
    assert ant.requests[-1].json["tools"] == body["tools"]
    assert r.json()["content"] == content and r.json()["model"] == "claude-sonnet-4-5"
    assert r.json()["usage"]["cache_read_input_tokens"] == 7
