"""A workflow step's pinned skills reach the model (the app under uvicorn, real Postgres, a
loopback OpenAI-format model that records what it is sent): each skill's body is in the
step's system prompt after the mode's instructions, as the version pinned when the workflow
was created, even when a new version is published before the step runs."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import ServedApp
from tests.fakes.agent_llm import agent_reply, task_prompt
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings, finished, user


def system_prompts(llm: OpenAIFake) -> dict[str, str]:
    """Each step's system prompt, by the step's own prompt."""
    out = {}
    for request in llm.chat_requests:
        messages = request.json["messages"]
        assert messages[0]["role"] == "system"
        out[task_prompt(request.json).strip()] = str(messages[0]["content"])
    return out


async def publish(c: httpx.AsyncClient, who: dict[str, str], body: str) -> None:
    r = await c.post("/marketplace/publish", headers=who, json={"name": "haiku", "body": body})
    assert r.status_code == 200, r.text


async def test_a_pinned_skill_body_reaches_the_system_prompt(make_settings: Any) -> None:
    steps = [
        {"name": "wait", "prompt": "[sleep 2]"},
        {"name": "write", "prompt": "write a poem", "mode": "build", "skills": ["haiku"]},
        {"name": "plain", "prompt": "no skills here"},
    ]
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as served:
            async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
                ann, bob = await user(c, "ann"), await user(c, "bob")
                await publish(c, ann, "Always answer in haiku (V1-MARKER).")
                r = await c.post("/workflows", headers=bob, json={"name": "poem", "steps": steps})
                assert r.status_code == 200, r.text
                wid = r.json()["id"]
                await publish(c, ann, "Answer in limericks (V2-MARKER).")
                # Version 2 is out before the skill's step starts; it runs version 1.
                now = (await c.get(f"/workflows/{wid}", headers=bob)).json()
                assert now["steps"][1]["status"] == "pending", now
                body = await finished(c, bob, wid)
                assert body["status"] == "completed", body
    systems = system_prompts(llm)
    write = systems["write a poem"]
    # The mode's instructions first, then the skill, labelled with its pinned version.
    assert write.index("builder agent") < write.index("Always answer in haiku (V1-MARKER).")
    assert "haiku v1 by ann" in write
    assert "V2-MARKER" not in write
    assert "V1-MARKER" not in systems["no skills here"]
