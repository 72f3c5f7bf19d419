"""Requests real agent clients sent (tests/reference/clients: Codex CLI 0.171.0 and the
OpenAI Agents SDK 0.24.0), replayed byte for byte against `POST /responses` with OpenAI and
Anthropic upstreams (the real app under uvicorn, real Postgres and Redis, loopback fakes);
every streamed event is checked against OpenAI's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServedApp
from tests.fakes.anthropic_server import FakeAnthropic, text_reply, tool_reply
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake
from tests.integration.test_gateway import app, gateway_settings, upstreams
from tests.integration.test_responses_api import _http, _streamed

__all__ = ["app", "upstreams"]  # fixtures shared with the gateway tests

CLIENTS = Path(__file__).resolve().parents[1] / "reference" / "clients"


def _captured(name: str, model: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((CLIENTS / f"{name}.json").read_text())["body"]
    return {**body, "model": model}  # the capture's model ("gpt-test") named ours


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-sonnet-4-5"])
async def test_agents_sdk_requests(
    app: ServedApp, upstreams: tuple[OpenAIFake, FakeAnthropic], model: str
) -> None:
    oai, ant = upstreams
    if model.startswith("gpt"):
        oai.script(
            [
                FakeReply(tool_calls=[FakeToolCall("get_word", {"topic": "birds"})]),
                FakeReply(tool_calls=[FakeToolCall("transfer_to_specialist", {})]),
                FakeReply(text="The word is PELICAN."),
            ]
        )
    else:
        ant.enqueue(
            tool_reply("get_word", {"topic": "birds"}),
            tool_reply("transfer_to_specialist", {}),
            text_reply("The word is PELICAN."),
        )
    kinds = []
    for n in (1, 2, 3):
        events = await _streamed(app, _captured(f"openai-agents-responses-{n}", model))
        assert events[-1]["type"] == "response.completed", events[-1]
        kinds.append([item["type"] for item in events[-1]["response"]["output"]])
    assert kinds == [["function_call"], ["function_call"], ["message"]]
    if model.startswith("gpt"):
        last = oai.chat_requests[-1].json
        assert last["messages"][0] == {"role": "system", "content": "You answer in one sentence."}
        assert [m["role"] for m in last["messages"]] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
        ]
        assert "tools" not in last  # `tools: []`
    else:
        last = ant.requests[-1].json
        assert last["system"] == "You answer in one sentence."
        assert [m["role"] for m in last["messages"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]


async def test_codex_default_tools_are_refused_by_name_without_drop(app: ServedApp) -> None:
    async with _http(app) as http:
        answer = await http.post("/responses", json=_captured("codex-1", "gpt-4o-mini"))
    assert answer.status_code == 400, answer.text
    assert [f["field"] for f in answer.json()["fields"]] == ["tools[8].type"]
    assert "web_search" in answer.json()["error"]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-sonnet-4-5"])
async def test_codex_requests_with_drop_unsupported_params(
    make_settings: Any, upstreams: tuple[OpenAIFake, FakeAnthropic], model: str
) -> None:
    oai, ant = upstreams
    settings = gateway_settings(make_settings, oai, ant, drop_unsupported_params=True)
    openai_model = model.startswith("gpt")
    if openai_model:
        oai.script(
            [
                FakeReply(text="(read for its headers)"),
                FakeReply(
                    tool_calls=[FakeToolCall("exec_command", {"cmd": "cat note.txt"}, id="c1")]
                ),
                FakeReply(text="The secret word is PELICAN."),
                FakeReply(tool_calls=[FakeToolCall("multi_agent_v1__wait_agent", {}, id="c2")]),
            ]
        )
    else:
        ant.enqueue(
            text_reply("(read for its headers)"),
            tool_reply("exec_command", {"cmd": "cat note.txt"}, id="c1"),
            text_reply("The secret word is PELICAN."),
            tool_reply("multi_agent_v1__wait_agent", {}, id="c2"),
        )
    async with ServedApp(settings) as served:
        first = _captured("codex-1", model)
        async with _http(served) as http:
            async with http.stream("POST", "/responses", json=first) as answer:
                assert answer.status_code == 200
                dropped = answer.headers["X-Orchestrator-Dropped-Params"].split(",")
                await answer.aread()
        assert dropped[0] == "tools[8]:web_search"
        assert ("prompt_cache_key" in dropped) is not openai_model  # a hint OpenAI takes
        events = await _streamed(served, first)
        call = events[-1]["response"]["output"][0]
        assert (call["type"], call["name"], call["call_id"]) == (
            "function_call",
            "exec_command",
            "c1",
        )
        upstream = oai.chat_requests[-1].json if openai_model else ant.requests[-1].json
        names = [t["function"]["name"] if openai_model else t["name"] for t in upstream["tools"]]
        assert "multi_agent_v1__spawn_agent" in names and "web_search" not in names
        assert len(names) == 12  # 7 functions and the namespace's 5, flattened

        events = await _streamed(served, _captured("codex-2", model))
        done = [e for e in events if e["type"] == "response.output_item.done"]
        assert done[0]["item"]["content"][0]["text"] == "The secret word is PELICAN."
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["store"] is False

        # A namespaced function's call comes back namespaced (OpenAI's FunctionToolCall).
        events = await _streamed(served, first)
        call = events[-1]["response"]["output"][0]
        assert (call["namespace"], call["name"]) == ("multi_agent_v1", "wait_agent")
        args_done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert args_done["name"] == "wait_agent"
        echo = {**_captured("codex-2", model)}
        echo["input"] = [
            *echo["input"][:4],
            call,
            {"type": "function_call_output", "call_id": "c2", "output": "ok"},
        ]
        echo["stream"] = False
        ant.enqueue(text_reply("done"))
        oai.script([FakeReply(text="done")])
        async with _http(served) as http:
            answer = await http.post("/responses", json=echo)
        assert answer.status_code == 200, answer.text
        upstream = oai.chat_requests[-1].json if openai_model else ant.requests[-1].json
        flat = json.dumps(upstream["messages"])
        assert "multi_agent_v1__wait_agent" in flat
