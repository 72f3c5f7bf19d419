"""The agent loop's tool policy and audit trail (no HTTP): real Postgres for the events, the
real gateway to a loopback OpenAI-format model with scripted replies, the real `Policy`.

A denied tool is not offered and a call of it is refused before it runs, recorded as
audit.tool_denied and audit.permission_deny; every model turn is an audit.llm_decision; an
executed call's arguments appear in audit.tool_executed with secrets masked; a task's skills
reach the model's system prompt after the mode's; a tool's answer is cut at
tool_result_max_bytes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.agents import (
    AgentRunner,
    AgentTask,
    TaskTools,
    Tool,
    ToolContext,
    ToolOutcome,
    default_registry,
)
from orchestrator.auth import Principal
from orchestrator.db import connect
from orchestrator.events import EventQuery, EventStore
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import Gateway
from orchestrator.tools._model import Rule
from orchestrator.tools._policy import Policy
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

MODEL = "fake-agent"


class PolicyTools:
    """A ToolSource whose tools are fixed and whose policy the test sets."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.policy = Policy()
        self.ran: list[tuple[str, dict[str, Any]]] = []

    async def for_task(self, user_uuid: str) -> TaskTools:
        return TaskTools(self.registry, self.policy)


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
        agent_max_turns=5,
        tool_result_max_bytes=1024,
    )
    assert settings.database_url
    db = await connect(settings.database_url)
    events = EventStore(db.pool)
    gateway = Gateway(settings, MetricsRecorder("test"))
    registry = default_registry()
    source = PolicyTools(registry)

    async def login(ctx: ToolContext, args: dict[str, Any]) -> str:
        source.ran.append(("login", args))
        return f"logged in as {args.get('user')}"

    async def shout(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        source.ran.append(("shout", args))
        return ToolOutcome("é" * 2000)  # 4,000 bytes of UTF-8

    async def flaky(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome("the server said no", is_error=True)

    schema = {"type": "object", "properties": {}}
    registry.register(Tool("login", "Log in", schema, login, source="http", origin="http-7"))
    registry.register(Tool("shout", "Loud", schema, shout, source="mcp", origin="mcp-3"))
    registry.register(Tool("flaky", "Fails", schema, flaky, source="mcp", origin="mcp-3"))
    runner = AgentRunner(settings, gateway, events, source)
    try:
        yield runner, events, source
    finally:
        await gateway.aclose()
        await db.close()


async def _events(events: EventStore, **query: Any) -> list[Any]:
    found, _ = await events.query(
        EventQuery(user_uuid=None, from_seq=0, limit=500, offset=0, **query),
        Principal("test", is_admin=True),
    )
    return found


def _offered(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.json.get("tools", [])]


async def test_a_denied_tool_is_not_offered_and_its_call_is_refused_and_audited(
    runtime: Any, llm: OpenAIFake
) -> None:
    runner, events, source = runtime
    source.policy = Policy(
        global_rules=(Rule("log*", "deny"),), user_rules=(Rule("login", "allow"),)
    )
    llm.script(
        [
            FakeReply(tool_calls=[FakeToolCall("login", {"user": "u", "password": "hunter2"})]),
            FakeReply(text="gave up"),
        ]
    )
    result = await runner.run(AgentTask("t-deny", "alice", "log in"), "w")
    assert result.ok and result.result == "gave up"
    assert source.ran == []  # refused before it ran
    assert "login" not in _offered(llm.chat_requests[0]) and "shout" in _offered(
        llm.chat_requests[0]
    )
    refusal = llm.chat_requests[1].json["messages"][-1]
    assert refusal["role"] == "tool" and "denied by the global policy rule 'log*'" in str(
        refusal["content"]
    )
    denied = [e for e in await _events(events, aggregate="t-deny") if e.type == "audit.tool_denied"]
    assert len(denied) == 1 and denied[0].data["tool"] == "login"
    assert denied[0].data["arguments"] == {"user": "u", "password": "***"}
    perm = await _events(events, aggregate="alice", types=("audit.permission_deny",))
    assert len(perm) == 1
    assert perm[0].data["permission"] == "tool:login" and perm[0].user_uuid == "alice"
    assert perm[0].data["task_id"] == "t-deny" and "global" in perm[0].data["denied_by"]


async def test_a_user_deny_refuses_and_no_rule_allows(runtime: Any, llm: OpenAIFake) -> None:
    runner, events, source = runtime
    source.policy = Policy(user_rules=(Rule("shout", "deny"),))
    llm.script(
        [
            FakeReply(tool_calls=[FakeToolCall("shout", {}), FakeToolCall("login", {})]),
            FakeReply(text="ok"),
        ]
    )
    await runner.run(AgentTask("t-user", "bob", "go"), "w")
    assert [name for name, _ in source.ran] == ["login"]
    perm = await _events(events, aggregate="bob", types=("audit.permission_deny",))
    assert [e.data["permission"] for e in perm] == ["tool:shout"]
    assert "user" in perm[0].data["denied_by"]


async def test_an_ask_rule_is_offered_but_refused_where_nobody_can_wait(
    runtime: Any, llm: OpenAIFake
) -> None:
    """A task that cannot wait for a person (this one is no workflow step: can_wait False)
    refuses a call under an `ask` rule as it refuses a deny, with the reason that says why;
    the tool is still offered (a workflow step could run it once approved)."""
    runner, events, source = runtime
    source.policy = Policy(user_rules=(Rule("login", "ask"),))
    llm.script(
        [
            FakeReply(tool_calls=[FakeToolCall("login", {"user": "u", "token": "t0k"})]),
            FakeReply(text="gave up"),
        ]
    )
    task = AgentTask("t-ask", "carol", "log in")
    assert not task.can_wait
    result = await runner.run(task, "w")
    assert result.ok and result.result == "gave up"
    assert source.ran == []
    assert "login" in _offered(llm.chat_requests[0])
    reason = "needs a person's approval; only a workflow step can wait for one"
    refusal = llm.chat_requests[1].json["messages"][-1]
    assert refusal["role"] == "tool" and reason in str(refusal["content"])
    trail = await _events(events, aggregate="t-ask")
    (denied,) = [e for e in trail if e.type == "audit.tool_denied"]
    assert denied.data["reason"] == reason and denied.data["scope"] == "user"
    assert denied.data["arguments"] == {"user": "u", "token": "***"}
    assert not [e for e in trail if e.type.startswith("audit.intervention")]
    (perm,) = await _events(events, aggregate="carol", types=("audit.permission_deny",))
    assert perm.data["permission"] == "tool:login" and perm.data["reason"] == reason


async def test_every_turn_is_an_llm_decision_and_executions_name_their_source(
    runtime: Any, llm: OpenAIFake
) -> None:
    runner, events, _source = runtime
    llm.script(
        [
            FakeReply(
                tool_calls=[
                    FakeToolCall("login", {"user": "carol", "api_key": "sk-live-1"}),
                    FakeToolCall("flaky", {}),
                ]
            ),
            FakeReply(tool_calls=[FakeToolCall("shout", {})]),
            FakeReply(text="finished"),
        ]
    )
    result = await runner.run(
        AgentTask("t-audit", "carol", "work", workflow_id="wf-9", step="s1"), "w"
    )
    assert result.ok
    decisions = await _events(events, types=("audit.llm_decision",))
    mine = [e for e in decisions if e.data.get("task_id") == "t-audit"]
    assert [e.data["decision"] for e in mine] == ["tool_calls", "tool_calls", "final"]
    assert [e.data["tools"] for e in mine] == [["login", "flaky"], ["shout"], []]
    first = mine[0].data
    assert first["model"] and first["provider"] == "openai" and first["workflow_id"] == "wf-9"
    assert first["tokens_in"] > 0 and first["tokens_out"] > 0 and first["finish_reason"]
    assert len({e.aggregate_id for e in mine}) == 3  # one per model call (its request id)
    trail = await _events(events, aggregate="t-audit")
    executed = [e.data for e in trail if e.type == "audit.tool_executed"]
    by_tool = {d["tool"]: d for d in executed}
    assert by_tool["login"]["source"] == "http" and by_tool["login"]["http_tool_id"] == "http-7"
    assert by_tool["login"]["arguments"] == {"user": "carol", "api_key": "***"}
    assert by_tool["flaky"]["ok"] is False and by_tool["flaky"]["mcp_server_id"] == "mcp-3"
    assert by_tool["shout"]["ok"] is True
    # A tool's answer the model sees is cut at tool_result_max_bytes (1,024), whole characters,
    # the note of the cut included.
    shouted = llm.chat_requests[2].json["messages"][-1]["content"]
    assert len(shouted.encode()) <= 1024
    kept, note = shouted.split("\n", 1)
    assert kept == "é" * len(kept) and 480 <= len(kept) < 512
    assert note == f"[... {4000 - 2 * len(kept)} more bytes cut (tool_result_max_bytes)]"
    # The error result is marked as one for the model.
    flaky_result = llm.chat_requests[1].json["messages"][-1]
    assert "the server said no" in str(flaky_result["content"])
    stored = json.dumps([e.data for e in await _events(events, aggregate="t-audit")])
    assert "sk-live-1" not in stored


async def test_skills_follow_the_modes_instructions(runtime: Any, llm: OpenAIFake) -> None:
    runner, _events_store, _ = runtime
    llm.script([FakeReply(text="reviewed")])
    task = AgentTask(
        "t-skill",
        "dave",
        "review this",
        mode="review",
        skills=(("style-guide v2 by erin", "Always cite the line numbers."),),
    )
    assert (await runner.run(task, "w")).ok
    system = llm.chat_requests[0].json["messages"][0]
    assert system["role"] == "system"
    text = system["content"]
    assert text.index("reviewing agent") < text.index("## Skill: style-guide v2 by erin")
    assert text.index("Always cite the line numbers.") < text.index("final answer only")
