"""The agent loop on its own (no HTTP): real Postgres for its events, the real gateway to a
loopback OpenAI-format model with scripted replies, tools registered by the test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.agents import (
    AgentRunner,
    AgentTask,
    LocalDispatcher,
    Tool,
    ToolContext,
    default_registry,
)
from orchestrator.auth import Principal
from orchestrator.db import connect
from orchestrator.events import EventQuery, EventStore
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import Gateway
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

MODEL = "fake-agent"


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent") as server:
        yield server


@pytest.fixture
async def runtime(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[Any]:
    settings = make_settings(
        providers={"openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}},
        default_model=MODEL,
        provider_retries=0,
        agent_ctx_tokens=1500,
        agent_max_turns=4,
    )
    assert settings.database_url
    db = await connect(settings.database_url)
    events = EventStore(db.pool)
    gateway = Gateway(settings, MetricsRecorder("test"))
    tools = default_registry()

    async def big(ctx: ToolContext, args: dict[str, Any]) -> str:
        return f"{args['n']}:" + "x" * 3000 + f" owner={ctx.task.user_uuid}"

    tools.register(Tool("big", "A large answer", {"type": "object"}, big))
    runner = AgentRunner(settings, gateway, events, tools)
    try:
        yield runner, events
    finally:
        await gateway.aclose()
        await db.close()


async def _events(events: EventStore, task_id: str) -> list[Any]:
    found, _ = await events.query(
        EventQuery(aggregate=task_id, user_uuid=None, types=(), from_seq=0, limit=500, offset=0),
        Principal("test", is_admin=True),
    )
    return found


async def test_context_overflow_truncates_older_tool_results_not_the_prompt(
    runtime: Any, llm: OpenAIFake
) -> None:
    runner, events = runtime
    llm.script(
        [
            FakeReply(tool_calls=[FakeToolCall("big", {"n": 1})]),
            FakeReply(tool_calls=[FakeToolCall("big", {"n": 2})]),
            FakeReply(tool_calls=[FakeToolCall("big", {"n": 3})]),
            FakeReply(text="summary"),
        ]
    )
    prompt = "P" * 2000
    task = AgentTask("t-overflow", "carol", prompt, context=(("Earlier", "E" * 500),))
    result = await LocalDispatcher(runner).run(task)
    assert result.status == "completed" and result.result == "summary" and result.turns == 4
    last = llm.chat_requests[-1].json["messages"]
    assert prompt in last[1]["content"] and "E" * 500 in last[1]["content"]
    tool_texts = [m["content"] for m in last if m["role"] == "tool"]
    assert len(tool_texts) == 3
    assert tool_texts[0].startswith("[truncated: ")
    assert tool_texts[-1].startswith("3:xxx") and tool_texts[-1].endswith("owner=carol")
    got = await _events(events, "t-overflow")
    overflow = [e for e in got if e.type == "agent.context_overflow"]
    assert overflow and overflow[0].data["limit"] == 1500
    assert all(e.user_uuid == "carol" for e in got)
    assert [e.type for e in got][:3] == ["task.created", "task.dispatched", "worker.task_started"]
    assert [e.type for e in got][-2:] == ["task.completed", "worker.task_completed"]


async def test_turn_limit_and_unknown_tool(runtime: Any, llm: OpenAIFake) -> None:
    runner, events = runtime
    llm.script([FakeReply(tool_calls=[FakeToolCall("nope", {"i": i})]) for i in range(4)])
    result = await LocalDispatcher(runner).run(AgentTask("t-turns", "dave", "go"))
    assert result.status == "failed" and result.error == "turn limit reached (4 turns)"
    denied = [e for e in await _events(events, "t-turns") if e.type == "audit.tool_denied"]
    assert len(denied) == 4 and denied[0].data["reason"] == "no such tool"
    sent = llm.chat_requests[1].json["messages"][-1]
    assert sent["role"] == "tool" and "refused: no such tool" in sent["content"]
    failed = [e for e in await _events(events, "t-turns") if e.type == "task.failed"]
    assert failed[0].data["error"] == "turn limit reached (4 turns)"


async def test_upstream_error_fails_the_task(runtime: Any, llm: OpenAIFake) -> None:
    runner, _ = runtime
    llm.script([FakeReply(status=401)])
    result = await LocalDispatcher(runner).run(AgentTask("t-err", "erin", "go"))
    assert result.status == "failed" and result.error and "model call failed" in result.error


async def test_modes_change_the_system_prompt(runtime: Any, llm: OpenAIFake) -> None:
    runner, _ = runtime
    seen = []
    for mode in ("build", "plan", "explore", "review", "general", "coordinate"):
        llm.script([FakeReply(text="ok")])
        await LocalDispatcher(runner).run(AgentTask(f"t-{mode}", "fay", "go", mode=mode))
        seen.append(llm.chat_requests[-1].json["messages"][0]["content"])
    assert len(set(seen)) == 6
    assert json.dumps(seen).count("planning agent") == 1


@pytest.mark.parametrize("takes", [False, None, True])
async def test_a_local_server_that_takes_no_tools_gets_none(
    make_settings: Any, llm: OpenAIFake, takes: bool | None
) -> None:
    """A step that names no tools, on a model whose local server says it takes none (its
    /props), is sent without tools; one that names tools fails saying why. A server that
    did not say (None) or takes them gets the tools as before. An answer is bounded by half
    the server's context window."""
    from orchestrator.inference import LocalEndpoint

    settings = make_settings(provider_retries=0, agent_max_turns=2)
    assert settings.database_url
    db = await connect(settings.database_url)
    # The gateway's source of local instances (`ready_endpoints` reads these rows in the
    # service): one instance of "local-smol" served by the loopback upstream.
    target = LocalEndpoint("inf-1", "local-smol", llm.base_url, 2048, "ready", "sk-agent", takes)
    gateway = Gateway(settings, MetricsRecorder("test"), local=lambda: _served([target]))
    runner = AgentRunner(settings, gateway, EventStore(db.pool), default_registry())
    try:
        llm.script([FakeReply(text="three fruits")])
        plain = AgentTask(f"t-plain-{takes}", "gus", "List three fruits.", model="local-smol")
        result = await LocalDispatcher(runner).run(plain)
        assert result.status == "completed" and result.result == "three fruits"
        sent = llm.chat_requests[-1].json
        assert ("tools" in sent) is (takes is not False)
        # One answer may fill at most half of the server's 2,048-token window (a later
        # step given it must still fit), below agent_max_tokens (2,048).
        assert sent.get("max_tokens", sent.get("max_completion_tokens")) == 1024

        llm.script([FakeReply(text="noon")])
        named = AgentTask(
            f"t-named-{takes}", "gus", "Time?", model="local-smol", tools=("current_time",)
        )
        result = await LocalDispatcher(runner).run(named)
        if takes is False:
            assert result.status == "failed"
            assert result.error and "'local-smol' takes no tools" in result.error
            assert len(llm.chat_requests) == 1  # no call was made for it
        else:
            assert result.status == "completed"
            assert [t["function"]["name"] for t in llm.chat_requests[-1].json["tools"]] == [
                "current_time"
            ]
    finally:
        await gateway.aclose()
        await db.close()


async def _served(targets: list[Any]) -> list[Any]:
    return targets


async def test_tool_calls_past_the_tasks_limit_fail_it_before_any_runs(
    make_settings: Any, llm: OpenAIFake
) -> None:
    """One turn may ask for any number of tool calls: past `agent_max_tool_calls` in all,
    the task fails naming the setting, and none of that turn's calls runs."""
    settings = make_settings(
        providers={"openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}},
        default_model=MODEL,
        provider_retries=0,
        agent_max_tool_calls=5,
    )
    assert settings.database_url
    db = await connect(settings.database_url)
    events = EventStore(db.pool)
    gateway = Gateway(settings, MetricsRecorder("test"))
    ran: list[int] = []
    tools = default_registry()

    async def count(ctx: ToolContext, args: dict[str, Any]) -> str:
        ran.append(args["n"])
        return "ok"

    tools.register(Tool("count", "Counts", {"type": "object"}, count))
    runner = AgentRunner(settings, gateway, events, tools)
    try:
        llm.script(
            [
                FakeReply(tool_calls=[FakeToolCall("count", {"n": n}) for n in range(3)]),
                FakeReply(tool_calls=[FakeToolCall("count", {"n": n}) for n in range(3, 6)]),
            ]
        )
        result = await LocalDispatcher(runner).run(AgentTask("t-calls", "hal", "go"))
        assert result.status == "failed"
        assert result.error == "tool call limit reached (6 asked, at most 5: agent_max_tool_calls)"
        assert ran == [0, 1, 2]  # the second turn's three never ran
        executed = [e for e in await _events(events, "t-calls") if e.type == "audit.tool_executed"]
        assert len(executed) == 3
    finally:
        await gateway.aclose()
        await db.close()
