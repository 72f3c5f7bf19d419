"""Workflows over HTTP (the app under uvicorn, its in-process engine and agent runtime, real
Postgres) against a loopback OpenAI-format model steered by directives in step prompts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply, task_prompt
from tests.fakes.openai_server import OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "fake-agent"


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as server:
        yield server


def agent_settings(make_settings: Any, llm: OpenAIFake, **kw: Any) -> Any:
    values: dict[str, Any] = {
        "providers": {
            "openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}
        },
        "default_model": MODEL,
        "rate_limit_per_minute": 0,
        "provider_retries": 0,
        "agent_loop_warn": 2,
        "agent_loop_limit": 3,
    }
    values.update(kw)
    return make_settings(**values)


@pytest.fixture
async def api(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[httpx.AsyncClient]:
    async with ServedApp(agent_settings(make_settings, llm)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def create(c: httpx.AsyncClient, h: dict[str, str], **body: Any) -> str:
    r = await c.post("/workflows", headers=h, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True and r.json()["status"] == "pending"
    assert r.json()["id"].startswith("wf-")
    return str(r.json()["id"])


async def finished(
    c: httpx.AsyncClient, h: dict[str, str], wid: str, within: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        body: dict[str, Any] = (await c.get(f"/workflows/{wid}", headers=h)).json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return body
        assert time.monotonic() < deadline, f"{wid} still {body}"
        await asyncio.sleep(0.05)


async def events(c: httpx.AsyncClient, aggregate: str, h: dict[str, str] = ADMIN) -> list[Any]:
    r = await c.get("/events", headers=h, params={"aggregate": aggregate, "limit": 1000})
    return list(r.json()["data"])


def step_prompts(llm: OpenAIFake) -> list[str]:
    return [task_prompt(r.json) for r in llm.chat_requests]


async def test_three_steps_pass_results_forward(api: httpx.AsyncClient, llm: OpenAIFake) -> None:
    wid = await create(
        api,
        ADMIN,
        name="research",
        steps=[
            {"name": "gather", "prompt": "[answer FACT-ALPHA]", "mode": "explore"},
            {"name": "draft", "prompt": "write using {{gather.result}}", "mode": "build"},
            {"name": "check", "prompt": "review it", "mode": "review", "timeout": 20},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed", body
    assert [s["status"] for s in body["steps"]] == ["completed"] * 3
    assert body["steps"][0]["result"] == "FACT-ALPHA"
    assert body["steps"][1]["result"] == "done: write using FACT-ALPHA"
    assert body["parent_id"] is None and body["children"] == []
    # The third step's model request holds the original prompt and both earlier results,
    # and the system prompt of its mode.
    third = llm.chat_requests[-1].json
    opening = third["messages"][1]["content"]
    assert "[answer FACT-ALPHA]" in opening and "FACT-ALPHA" in opening
    assert "done: write using FACT-ALPHA" in opening
    systems = [r.json["messages"][0]["content"] for r in llm.chat_requests]
    assert "exploring agent" in systems[0] and "builder agent" in systems[1]
    assert "reviewing agent" in systems[2]
    types = [e["type"] for e in await events(api, wid)]
    assert types == [
        "workflow.started",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.completed",
    ]
    seqs = [e["seq"] for e in await events(api, wid)]
    assert seqs == list(range(1, len(seqs) + 1))
    # The task of each step carries its events under the creator.
    task_events = await events(api, f"{wid}:check:1")
    kinds = [e["type"] for e in task_events]
    assert kinds[:3] == ["task.created", "task.dispatched", "worker.task_started"]
    assert "agent.turn_started" in kinds and "agent.turn_completed" in kinds
    done = next(e for e in task_events if e["type"] == "task.completed")
    assert set(done["data"]) >= {"task_id", "worker_id", "status", "duration_ms"}
    assert done["data"]["status"] == "completed"


async def test_a_step_named_with_a_leading_space_is_referred_to(api: httpx.AsyncClient) -> None:
    """Issue 33: `{{ a.result }}` names the step " a" (the spaces inside the braces are part
    of the name); its result reaches the next prompt."""
    wid = await create(
        api,
        ADMIN,
        name="spaced",
        steps=[
            {"name": " a", "prompt": "[answer SPACED]"},
            {
                "name": "b",
                "prompt": "got {{ a.result }}",
                "condition": "{{ a.status }} == 'completed'",
            },
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed", body
    assert [s["name"] for s in body["steps"]] == [" a", "b"]
    assert body["steps"][1]["result"] == "done: got SPACED"


async def test_tools_reach_the_model_and_outside_tools_are_denied(
    api: httpx.AsyncClient, llm: OpenAIFake
) -> None:
    wid = await create(
        api,
        ADMIN,
        name="tools",
        steps=[
            {
                "name": "calc",
                "prompt": '[tool calculate {"expression": "6*7"}]',
                "tools": ["calculate"],
            },
            {"name": "clock", "prompt": "[tool current_time {}]", "tools": ["calculate"]},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["steps"][0]["result"] == "tool calculate said: 42"
    assert body["steps"][1]["result"].startswith("tool current_time said: tool 'current_time'")
    first = llm.chat_requests[0].json
    assert [t["function"]["name"] for t in first["tools"]] == ["calculate"]
    executed = await events(api, f"{wid}:calc:1")
    audit = next(e for e in executed if e["type"] == "audit.tool_executed")
    assert audit["data"]["tool"] == "calculate" and audit["data"]["ok"] is True
    assert audit["data"]["arguments"] == {"expression": "6*7"}
    denied = [e for e in await events(api, f"{wid}:clock:1") if e["type"] == "audit.tool_denied"]
    assert len(denied) == 1 and denied[0]["data"]["tool"] == "current_time"
    assert denied[0]["data"]["reason"] == "not in this step's tools"


async def test_branch_routes_and_skips(api: httpx.AsyncClient) -> None:
    wid = await create(
        api,
        ADMIN,
        name="triage",
        steps=[
            {"name": "classify", "prompt": "[answer severity: HIGH]"},
            {
                "name": "route",
                "type": "branch",
                "conditions": {
                    "low": {"match": "{{classify.result}}", "pattern": "LOW", "then": "log"},
                    "high": {"match": "{{classify.result}}", "pattern": "HIGH", "then": "page"},
                    "other": {"then": "log"},
                },
            },
            {"name": "log", "prompt": "log it"},
            {"name": "page", "prompt": "page someone"},
            {"name": "after", "prompt": "wrap up", "condition": '{{page.status}} == "completed"'},
            {"name": "never", "prompt": "x", "condition": '{{classify.result}} contains "LOW"'},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed"
    assert {s["name"]: s["status"] for s in body["steps"]} == {
        "classify": "completed",
        "route": "completed",
        "log": "skipped",
        "page": "completed",
        "after": "completed",
        "never": "skipped",
    }
    assert body["steps"][1]["result"] == "high -> page"


async def test_branch_without_match_or_fallback_fails(api: httpx.AsyncClient) -> None:
    wid = await create(
        api,
        ADMIN,
        name="nomatch",
        steps=[
            {"name": "a", "prompt": "[answer green]"},
            {
                "name": "b",
                "type": "branch",
                "conditions": {"red": {"match": "{{a.result}}", "pattern": "red", "then": "c"}},
            },
            {"name": "c", "prompt": "x"},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed"
    assert "no branch condition matched" in body["steps"][1]["error"]


async def test_failure_compensates_in_reverse_then_fails(
    api: httpx.AsyncClient, llm: OpenAIFake
) -> None:
    wid = await create(
        api,
        ADMIN,
        name="deploy",
        steps=[
            {"name": "one", "prompt": "create bucket", "compensate": "delete bucket"},
            {"name": "two", "prompt": "create db", "compensate": {"notify": "db removed"}},
            {"name": "three", "prompt": "migrate [fail]"},
            {"name": "four", "prompt": "never runs"},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed"
    assert [s["status"] for s in body["steps"]] == ["completed", "completed", "failed", "skipped"]
    assert "scripted failure" in body["steps"][2]["error"]
    got = await events(api, wid)
    assert [e["type"] for e in got] == [
        "workflow.started",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.step_started",
        "workflow.step_failed",
        "workflow.compensating",
        "workflow.compensating",
        "workflow.compensating",
        "workflow.failed",
    ]
    assert got[7]["data"]["steps"] == ["two", "one"]
    assert [got[8]["data"]["step"], got[9]["data"]["step"]] == ["two", "one"]
    assert got[8]["data"]["reason"] == "notify: db removed"
    assert got[9]["data"]["reason"].startswith("compensated: done: delete bucket")
    assert got[10]["data"]["step"] == "three"
    assert "delete bucket" in step_prompts(llm)[-1]


async def test_cancel_running_workflow(api: httpx.AsyncClient) -> None:
    wid = await create(
        api,
        ADMIN,
        name="long",
        steps=[
            {"name": "quick", "prompt": "quick", "compensate": {"notify": "undo quick"}},
            {"name": "slow", "prompt": "[sleep 20]"},
            {"name": "later", "prompt": "later"},
        ],
    )
    deadline = time.monotonic() + 10
    while (await api.get(f"/workflows/{wid}", headers=ADMIN)).json()["steps"][1][
        "status"
    ] != "running":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    r = await api.post(f"/workflows/{wid}/cancel", headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"ok": True, "id": wid, "status": "cancelled"}
    body = (await api.get(f"/workflows/{wid}", headers=ADMIN)).json()
    assert [s["status"] for s in body["steps"]] == ["completed", "skipped", "skipped"]
    types = [e["type"] for e in await events(api, wid)]
    assert types[-3:] == ["workflow.compensating", "workflow.compensating", "workflow.cancelled"]
    again = await api.post(f"/workflows/{wid}/cancel", headers=ADMIN)
    assert again.status_code == 409 and again.json()["code"] == "conflict"


async def test_tree_aggregates_children_and_cancel_cascades(api: httpx.AsyncClient) -> None:
    wid = await create(
        api,
        ADMIN,
        name="fanout",
        steps=[
            {
                "name": "spawn",
                "type": "spawn",
                "workflows": [
                    {"name": "kid-a", "steps": [{"name": "s", "prompt": "[answer A]"}]},
                    {"name": "kid-b", "steps": [{"name": "s", "prompt": "[answer B]"}]},
                ],
            },
            {"name": "merge", "prompt": "merge"},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed" and len(body["children"]) == 2
    result = json.loads(body["steps"][0]["result"])
    assert [(c["name"], c["status"], c["result"]) for c in result["children"]] == [
        ("kid-a", "completed", "A"),
        ("kid-b", "completed", "B"),
    ]
    kid = (await api.get(f"/workflows/{body['children'][0]}", headers=ADMIN)).json()
    assert kid["parent_id"] == wid
    listed = (await api.get("/workflows", headers=ADMIN, params={"parent": wid})).json()
    assert listed["total"] == 2

    # A tree of three levels, cancelled at the top while the leaves run.
    root = await create(
        api,
        ADMIN,
        name="deep",
        steps=[
            {
                "name": "spawn",
                "type": "spawn",
                "workflows": [
                    {
                        "name": "mid",
                        "steps": [
                            {
                                "name": "spawn",
                                "type": "spawn",
                                "workflows": [
                                    {
                                        "name": "leaf",
                                        "steps": [{"name": "s", "prompt": "[sleep 20]"}],
                                    }
                                ],
                            }
                        ],
                    }
                ],
            }
        ],
    )
    deadline = time.monotonic() + 10
    while True:
        page = (await api.get("/workflows", headers=ADMIN, params={"status": "running"})).json()
        if any(w["name"] == "leaf" for w in page["data"]):
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    r = await api.post(f"/workflows/{root}/cancel", headers=ADMIN)
    assert r.json()["status"] == "cancelled"
    mid_id = (await api.get(f"/workflows/{root}", headers=ADMIN)).json()["children"][0]
    mid = await finished(api, ADMIN, mid_id)
    leaf = await finished(api, ADMIN, mid["children"][0])
    assert mid["status"] == "cancelled" and leaf["status"] == "cancelled"


async def test_delete_rules_and_tenancy(api: httpx.AsyncClient) -> None:
    alice, bob = await user(api, "alice"), await user(api, "bob")
    done = await create(api, alice, name="mine", steps=[{"name": "a", "prompt": "a"}])
    await finished(api, alice, done)
    slow = await create(api, alice, name="slow", steps=[{"name": "a", "prompt": "[sleep 20]"}])
    # Bob sees none of Alice's workflows: 404 on every path, absent from his list.
    for method, path in (
        ("GET", f"/workflows/{done}"),
        ("POST", f"/workflows/{slow}/cancel"),
        ("DELETE", f"/workflows/{done}"),
    ):
        r = await api.request(method, path, headers=bob)
        assert r.status_code == 404 and r.json()["code"] == "not_found", (path, r.text)
    assert (await api.get("/workflows", headers=bob)).json()["total"] == 0
    mine = (await api.get("/workflows", headers=alice)).json()
    assert {w["id"] for w in mine["data"]} == {done, slow} and mine["total"] == 2
    assert (await api.get("/workflows", headers=ADMIN)).json()["total"] >= 2
    # Running: 409; completed: deleted; then 404.
    r = await api.delete(f"/workflows/{slow}", headers=alice)
    assert r.status_code == 409
    assert (await api.delete(f"/workflows/{done}", headers=alice)).json() == {
        "ok": True,
        "id": done,
    }
    assert (await api.get(f"/workflows/{done}", headers=alice)).status_code == 404
    assert (await api.post(f"/workflows/{slow}/cancel", headers=alice)).status_code == 200
    assert (await api.delete(f"/workflows/{slow}", headers=alice)).status_code == 200
    # Task events are the creator's.
    alice_events = (await api.get("/events", headers=alice, params={"limit": 1000})).json()
    assert any(e["type"] == "task.created" for e in alice_events["data"])
    bob_events = (await api.get("/events", headers=bob, params={"limit": 1000})).json()
    assert not any(e["type"].startswith(("task.", "workflow.")) for e in bob_events["data"])


async def test_loop_detection_and_timeout(api: httpx.AsyncClient) -> None:
    looping = await create(
        api,
        ADMIN,
        name="loop",
        steps=[{"name": "spin", "prompt": '[loop calculate {"expression": "1+1"}]'}],
    )
    late = await create(
        api, ADMIN, name="late", steps=[{"name": "wait", "prompt": "[sleep 5]", "timeout": 0.5}]
    )
    body = await finished(api, ADMIN, looping)
    assert body["status"] == "failed" and "loop detected" in body["steps"][0]["error"]
    kinds = [e["type"] for e in await events(api, f"{looping}:spin:1")]
    assert kinds.index("agent.loop_warning") < kinds.index("agent.loop_detected")
    assert kinds[-2:] == ["task.failed", "worker.task_failed"]
    body = await finished(api, ADMIN, late)
    assert body["status"] == "failed" and body["steps"][0]["error"].startswith("timeout")


async def test_templates(api: httpx.AsyncClient) -> None:
    alice, bob = await user(api, "alice"), await user(api, "bob")
    r = await api.post(
        "/workflows/templates",
        headers=alice,
        json={"name": "greet", "steps": [{"name": "hi", "prompt": "[answer hello {{who}}]"}]},
    )
    assert r.json() == {"ok": True, "name": "greet"}
    listed = (await api.get("/workflows/templates", headers=alice)).json()["data"]
    assert [(t["name"], t["variables"], t["shared"]) for t in listed] == [("greet", ["who"], False)]
    assert (await api.get("/workflows/templates", headers=bob)).json()["data"] == []
    wid = await create(api, alice, template="greet", variables={"who": "world"})
    body = await finished(api, alice, wid)
    assert body["name"] == "greet" and body["steps"][0]["result"] == "hello world"
    r = await api.post("/workflows", headers=alice, json={"template": "greet", "variables": {}})
    assert r.status_code == 400 and "who" in r.json()["error"]
    r = await api.post("/workflows", headers=bob, json={"template": "greet"})
    assert r.status_code == 404
    r = await api.post(
        "/workflows/templates",
        headers=alice,
        json={"name": "g2", "shared": True, "steps": [{"name": "a", "prompt": "x"}]},
    )
    assert r.status_code == 403
    r = await api.post(
        "/workflows/templates",
        headers=ADMIN,
        json={"name": "g2", "shared": True, "steps": [{"name": "a", "prompt": "{{x}}"}]},
    )
    assert r.status_code == 200
    assert [
        t["name"] for t in (await api.get("/workflows/templates", headers=bob)).json()["data"]
    ] == ["g2"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"steps": [{"name": "a", "prompt": "x"}]}, "name"),
        ({"name": "w", "steps": []}, "steps"),
        ({"name": "w", "steps": [{"name": "a"}]}, "steps[0].prompt"),
        ({"name": "w", "steps": [{"name": "a", "prompt": "x", "mode": "dance"}]}, "steps[0].mode"),
        (
            {"name": "w", "steps": [{"name": "a", "prompt": "x"}, {"name": "a", "prompt": "y"}]},
            "steps[1].name",
        ),
        (
            {
                "name": "w",
                "steps": [{"name": "a", "prompt": "x", "condition": "{{zz.result}} == 'a'"}],
            },
            "steps[0].condition",
        ),
        (
            {
                "name": "w",
                "steps": [{"name": "a", "type": "branch", "conditions": {"x": {"then": "nope"}}}],
            },
            "steps[0].conditions.x.then",
        ),
        (
            {
                "name": "w",
                "steps": [
                    {
                        "name": "a",
                        "type": "branch",
                        "conditions": {"x": {"match": "{{a.result}}", "pattern": "(", "then": "b"}},
                    },
                    {"name": "b", "prompt": "x"},
                ],
            },
            "steps[0].conditions.x.pattern",
        ),
        ({"name": "w", "steps": [{"name": "a", "prompt": "x", "timeout": -1}]}, "steps[0].timeout"),
        (  # issue 33: a reference to a step named " a", not literal text
            {
                "name": "w",
                "steps": [{"name": "a", "prompt": "x"}, {"name": "b", "prompt": "{{ a.result }}"}],
            },
            "steps[1].prompt",
        ),
    ],
)
async def test_invalid_workflows_are_400_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await api.post("/workflows", headers=ADMIN, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["ok"] is False and field in r.json()["error"]
    assert (await api.get("/workflows", headers=ADMIN)).json()["total"] == 0


async def test_unknown_ids(api: httpx.AsyncClient) -> None:
    assert (await api.get("/workflows/wf-999999", headers=ADMIN)).status_code == 404
    assert (await api.get("/workflows/nope", headers=ADMIN)).status_code in (400, 404)
    assert (await api.get("/workflows")).status_code == 401
