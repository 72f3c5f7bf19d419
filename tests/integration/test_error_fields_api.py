"""Issue 33: the 400s of many routes, over HTTP, all carry `fields: [{field, message}]`
(SPEC part 7's error body): request schema errors, domain checks, and the producers that
used other forms before (workflow steps, channels on a step, events, embeddings, gateway)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

APPROVAL = {"name": "s", "type": "approval", "prompt": "ok?", "notify": {"channel_id": "ch-9"}}
# (method, path, body or query): each is a 400 naming a field.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/workflows", {"name": "w", "steps": [{"name": "", "prompt": "p"}]}),
    ("POST", "/workflows", {"name": "w", "variables": [1], "template": "t"}),
    (
        "POST",
        "/workflows",
        {"name": "w", "steps": [{"name": "s", "prompt": "p", "tools": ["nope"]}]},
    ),
    (
        "POST",
        "/workflows",
        {
            "name": "w",
            "steps": [
                {
                    "name": "s",
                    "type": "approval",
                    "prompt": "ok?",
                    "notify": {"channel_id": "ch-999999"},
                }
            ],
        },
    ),
    ("POST", "/workflows", {"steps": "x"}),
    ("GET", "/events", {"types": "no.such.type"}),
    ("GET", "/events", {"limit": 10**6}),
    ("POST", "/embeddings", {"input": "x"}),
    ("POST", "/embeddings", {"model": "m", "input": [1, 2]}),
    ("POST", "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/marketplace/publish", {"name": "a/b", "body": "b"}),
    ("POST", "/channels", {"type": "slack", "name": "x", "config": {}}),
    ("POST", "/tokens", {"user_uuid": ""}),
]


async def test_every_400_names_its_fields_in_one_shape(make_settings: Any) -> None:
    async with ServedApp(make_settings(rate_limit_per_minute=0)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            for method, path, payload in CASES:
                if method == "GET":
                    r = await api.get(path, headers=ADMIN, params=payload)
                else:
                    r = await api.post(path, headers=ADMIN, json=payload)
                assert r.status_code == 400, (path, payload, r.text)
                body = r.json()
                assert body["ok"] is False and body["request_id"], body
                assert "field" not in body, body
                assert isinstance(body["fields"], list) and body["fields"], body
                for item in body["fields"]:
                    assert set(item) == {"field", "message"}, (path, payload, body)
                    assert isinstance(item["field"], str) and item["field"], body
                    assert isinstance(item["message"], str) and item["message"], body
