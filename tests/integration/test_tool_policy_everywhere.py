"""The tool policy holds wherever agent tasks run, not only in workflow steps: a scheduled
job's task and a channel conversation's task calling a denied tool are refused before it
runs (audit.tool_denied in the task's trail, audit.permission_deny in the user's); GET /tools
leaves out what the policy denies; every 403 the API answers is an audit.permission_deny
naming the route, the reason and the request. The real app over HTTP (agent tasks in its
process), real Postgres, a loopback model that calls the tool its prompt names."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "fake-agent"
CALL = '[tool calculate {"expression": "6*7"}]'


@pytest.fixture
async def api(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        settings = make_settings(
            providers={
                "openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}
            },
            default_model=MODEL,
            provider_retries=0,
            rate_limit_per_minute=0,
        )
        async with ServedApp(settings) as served:
            async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
                yield c


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def _until(check: Callable[[], Awaitable[Any]], within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while not (found := await check()):
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.1)
    return found


async def _events(c: httpx.AsyncClient, who: dict[str, str], **params: Any) -> list[Any]:
    r = await c.get("/events", headers=who, params={"limit": 500, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


async def _deny_calculate(c: httpx.AsyncClient, who: dict[str, str]) -> None:
    rules = {"rules": [{"tool": "calc*", "action": "deny"}]}
    assert (await c.put("/tools/policy", headers=who, json=rules)).status_code == 200


async def _refused_in(c: httpx.AsyncClient, who: dict[str, str], user: str, prefix: str) -> str:
    """The id of the task (`prefix`...) whose call of calculate was refused, once both audit
    events are in (each test has a database of its own: no other task is there)."""

    async def refused() -> str | None:
        denied = await _events(c, who, types="audit.tool_denied")
        mine = [e for e in denied if e["aggregate_id"].startswith(prefix)]
        if not mine:
            return None
        assert mine[0]["data"]["tool"] == "calculate" and "user policy" in mine[0]["data"]["reason"]
        return str(mine[0]["aggregate_id"])

    task_id = await _until(refused)
    deny = await _events(c, who, aggregate=user, types="audit.permission_deny")
    assert [d["data"]["task_id"] for d in deny if d["data"]["permission"] == "tool:calculate"] == [
        task_id
    ]
    executed = await _events(c, who, aggregate=task_id, types="audit.tool_executed")
    assert executed == []  # refused before it ran
    return task_id


async def test_a_scheduled_jobs_task_is_held_to_the_policy(api: httpx.AsyncClient) -> None:
    await _deny_calculate(api, ADMIN)
    admin_user = (await api.get("/whoami", headers=ADMIN)).json()["user_uuid"]
    made = await api.post("/schedules", headers=ADMIN, json={"prompt": CALL, "every": 3_600_000})
    assert made.status_code == 200, made.text
    ran = await api.post(f"/schedules/{made.json()['id']}/run", headers=ADMIN)
    assert ran.status_code == 200, ran.text
    await _refused_in(api, ADMIN, admin_user, "job-")


async def test_a_channel_conversations_task_is_held_to_the_policy(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    await _deny_calculate(api, ann)
    made = await api.post("/channels", headers=ann, json={"type": "webhook", "name": "h"})
    assert made.status_code == 200, made.text
    hook = f"/channels/webhook/{made.json()['data']['webhook_token']}"
    r = await api.post(f"{hook}?sync=true", json={"text": CALL})
    assert r.status_code == 200, r.text
    assert "refused" in r.json()["answer"] and "user policy" in r.json()["answer"]
    await _refused_in(api, ann, "ann", "chan-")


async def test_get_tools_leaves_out_what_the_policy_denies(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    before = {t["name"] for t in (await api.get("/tools", headers=ann)).json()["tools"]}
    await _deny_calculate(api, ann)
    after = {t["name"] for t in (await api.get("/tools", headers=ann)).json()["tools"]}
    assert before - after == {"calculate"}


async def test_get_tools_marks_what_the_policy_asks_approval_for(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    rules = {"rules": [{"tool": "calc*", "action": "ask"}]}
    put = await api.put("/tools/policy", headers=ann, json=rules)
    assert put.status_code == 200, put.text
    assert put.json()["rules"] == rules["rules"]
    listed = {t["name"]: t for t in (await api.get("/tools", headers=ann)).json()["tools"]}
    assert listed["calculate"]["approval"] is True
    assert all("approval" not in t for name, t in listed.items() if name != "calculate")
    bad = await api.put(
        "/tools/policy", headers=ann, json={"rules": [{"tool": "x", "action": "maybe"}]}
    )
    assert bad.status_code == 400 and "rules" in bad.text


async def test_every_403_is_an_audit_permission_deny(api: httpx.AsyncClient) -> None:
    bob = await _user(api, "bob")
    r = await api.get("/tools/policy", headers=bob, params={"scope": "global"})
    assert r.status_code == 403
    request_id = r.headers["x-request-id"]

    async def recorded() -> list[Any]:
        found = await _events(api, ADMIN, aggregate="bob", types="audit.permission_deny")
        return [e for e in found if e["data"].get("request_id") == request_id]

    (event,) = await _until(recorded)
    assert event["user_uuid"] == "bob" and event["data"]["denied_by"] == "api"
    assert event["data"]["permission"] == "GET /api/v1/tools/policy"
    assert event["data"]["reason"] == r.json()["error"]
    # bob reads his own refusals; the admin-only route refused him, nothing else.
    mine = await _events(api, bob, types="audit.permission_deny")
    assert [e["data"]["request_id"] for e in mine] == [request_id]
