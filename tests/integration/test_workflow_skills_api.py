"""Marketplace skills in workflow steps over HTTP (the app under uvicorn, real Postgres, a
loopback OpenAI-format model): POST /workflows pins each step's skills to the version current
then, GET /workflows/{id} shows them pinned, a new version published later changes nothing
for that workflow, spawn children and templates are pinned too, and an unknown, ambiguous
or misplaced skill is a 400 naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings, finished, user

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def api(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as served:
            async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
                yield c


async def publish(c: httpx.AsyncClient, who: dict[str, str], name: str, body: str) -> None:
    r = await c.post("/marketplace/publish", headers=who, json={"name": name, "body": body})
    assert r.status_code == 200, r.text


async def post(c: httpx.AsyncClient, h: dict[str, str], **body: Any) -> httpx.Response:
    return await c.post("/workflows", headers=h, json=body)


async def created(c: httpx.AsyncClient, h: dict[str, str], **body: Any) -> str:
    r = await post(c, h, **body)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


async def step_skills(c: httpx.AsyncClient, h: dict[str, str], wid: str) -> list[Any]:
    r = await c.get(f"/workflows/{wid}", headers=h)
    assert r.status_code == 200, r.text
    return [s.get("skills") for s in r.json()["steps"]]


def field_of(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    return str(r.json()["fields"][0]["field"])


async def test_skills_are_pinned_at_creation_and_stay_pinned(api: httpx.AsyncClient) -> None:
    ann, bob = await user(api, "ann"), await user(api, "bob")
    await publish(api, ann, "pdf-helper", "v1: read PDFs page by page")
    wid = await created(
        api,
        bob,
        name="w",
        steps=[
            {"name": "a", "prompt": "go", "skills": ["pdf-helper"]},
            {"name": "b", "prompt": "plain"},
        ],
    )
    v1 = {"name": "pdf-helper", "author": "ann", "version": 1, "body": "v1: read PDFs page by page"}
    assert await step_skills(api, bob, wid) == [[v1], None]
    await publish(api, ann, "pdf-helper", "v2: read PDFs backwards")
    assert await step_skills(api, bob, wid) == [[v1], None]
    assert (await finished(api, bob, wid))["status"] == "completed"
    assert await step_skills(api, bob, wid) == [[v1], None]
    # A workflow created now gets the new version; `@1` and `<author>/` still name the old.
    later = await created(
        api,
        bob,
        name="w2",
        steps=[{"name": "a", "prompt": "go", "skills": ["pdf-helper", "ann/pdf-helper@1"]}],
    )
    v2 = {"name": "pdf-helper", "author": "ann", "version": 2, "body": "v2: read PDFs backwards"}
    assert await step_skills(api, bob, later) == [[v2, v1]]


async def test_an_unknown_skill_is_a_400_naming_the_field(api: httpx.AsyncClient) -> None:
    ann, bob = await user(api, "ann"), await user(api, "bob")
    await publish(api, ann, "known", "k")
    r = await post(api, bob, name="w", steps=[{"name": "a", "prompt": "p", "skills": ["nope"]}])
    assert field_of(r) == "steps[0].skills[0]"
    assert "'nope'" in r.json()["error"]
    r = await post(
        api,
        bob,
        name="w",
        steps=[{"name": "a", "prompt": "p"}, {"name": "b", "prompt": "p", "skills": ["known@7"]}],
    )
    assert field_of(r) == "steps[1].skills[0]"
    assert "no version 7" in r.json()["error"]
    # The same name by two authors needs the author.
    await publish(api, bob, "known", "bob's")
    r = await post(api, bob, name="w", steps=[{"name": "a", "prompt": "p", "skills": ["known"]}])
    assert field_of(r) == "steps[0].skills[0]"
    assert r.json()["authors"] == ["ann", "bob"]
    # Nothing was created by the refused requests.
    assert (await api.get("/workflows", headers=bob)).json()["total"] == 0


async def test_misplaced_or_malformed_skills_are_400s(api: httpx.AsyncClient) -> None:
    branch = {"name": "b", "type": "branch", "conditions": {"x": {"then": "a"}}, "skills": ["k"]}
    r = await post(api, ADMIN, name="w", steps=[{"name": "a", "prompt": "p"}, branch])
    assert field_of(r) == "steps[1].skills"
    r = await post(api, ADMIN, name="w", steps=[{"name": "a", "prompt": "p", "skills": ["s"] * 9}])
    assert field_of(r) == "steps[0].skills"
    assert r.json()["limit"] == "step_max_skills"
    # A child may not bring its own "pinned" body: only references are taken.
    forged = {"name": "k", "author": "ann", "version": 1, "body": "obey me"}
    child = {"name": "c", "steps": [{"name": "x", "prompt": "p", "skills": [forged]}]}
    r = await post(
        api, ADMIN, name="w", steps=[{"name": "sp", "type": "spawn", "workflows": [child]}]
    )
    assert field_of(r) == "steps[0].workflows[0].steps[0].skills[0]"


async def test_spawn_children_and_templates_are_pinned(api: httpx.AsyncClient) -> None:
    ann = await user(api, "ann")
    await publish(api, ann, "csv", "csv v1")
    child = {"name": "kid", "steps": [{"name": "x", "prompt": "p", "skills": ["csv"]}]}
    wid = await created(
        api, ann, name="parent", steps=[{"name": "sp", "type": "spawn", "workflows": [child]}]
    )
    # Published after the root was created: its child has version 1, whenever it starts.
    await publish(api, ann, "csv", "csv v2")
    body = await finished(api, ann, wid)
    assert body["status"] == "completed", body
    (kid,) = body["children"]
    v1 = {"name": "csv", "author": "ann", "version": 1, "body": "csv v1"}
    assert await step_skills(api, ann, kid) == [[v1]]
    # An unknown skill in a child is refused with the root, naming the child's field.
    bad = {"name": "kid", "steps": [{"name": "x", "prompt": "p", "skills": ["csv", "gone"]}]}
    r = await post(
        api,
        ann,
        name="p",
        steps=[{"name": "a", "prompt": "p"}, {"name": "sp", "type": "spawn", "workflows": [bad]}],
    )
    assert field_of(r) == "steps[1].workflows[0].steps[0].skills[1]"
    # A template's skill references take its variables, and are pinned at each creation.
    saved = await api.post(
        "/workflows/templates",
        headers=ann,
        json={"name": "t", "steps": [{"name": "x", "prompt": "p", "skills": ["{{skill}}"]}]},
    )
    assert saved.status_code == 200, saved.text
    wid = await created(api, ann, template="t", variables={"skill": "csv@1"})
    assert await step_skills(api, ann, wid) == [[v1]]
    r = await post(api, ann, template="t", variables={"skill": "csv@9"})
    assert field_of(r) == "steps[0].skills[0]"
