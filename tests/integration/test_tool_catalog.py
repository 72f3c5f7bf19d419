"""GET /tools and the names a workflow step or a scheduled job may give: the service's tools
and the caller's own MCP servers' and HTTP tools, each with its source; a name that is none
of the caller's is a 400 at creation naming the field (spawn children's steps too), and
another tenant's tools are not the caller's. The real app over HTTP, real Postgres, a real
MCP server (the SDK's own, on loopback)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.mcp_server import McpServerProcess

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def api(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        outbound_allowed_cidrs=["127.0.0.0/8"],
        mcp_stdio_commands=[sys.executable],
        rate_limit_per_minute=0,
        default_model="m",
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=60) as client:
            yield client


@pytest.fixture
def mcp_server() -> Iterator[McpServerProcess]:
    with McpServerProcess() as server:
        yield server


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def _setup(c: httpx.AsyncClient, who: dict[str, str], mcp_url: str) -> None:
    r = await c.post("/mcp/servers", headers=who, json={"name": "docs", "url": mcp_url})
    assert r.status_code == 201 and r.json()["status"] == "ready", r.text
    r = await c.post(
        "/tools/http",
        headers=who,
        json={
            "name": "ping",
            "description": "Ping a host",
            "parameters": {"type": "object", "properties": {"host": {"type": "string"}}},
            "method": "GET",
            "url": "http://127.0.0.1:9/ping/{host}",
        },
    )
    assert r.status_code == 201, r.text


async def test_every_tool_with_its_source(
    api: httpx.AsyncClient, mcp_server: McpServerProcess
) -> None:
    ann = await _user(api, "ann")
    await _setup(api, ann, mcp_server.url)
    tools = {t["name"]: t for t in (await api.get("/tools", headers=ann)).json()["tools"]}
    sources = {name: t["source"] for name, t in tools.items()}
    assert sources["current_time"] == sources["calculate"] == "builtin"
    assert sources["memory_store"] == "memory" and sources["workspace_read"] == "workspace"
    assert sources["marketplace_search"] == sources["marketplace_read"] == "marketplace"
    assert sources["mcp__docs__echo"] == "mcp" and sources["http__ping"] == "http"
    assert tools["mcp__docs__add"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert tools["mcp__docs__add"]["origin"].startswith("mcp-")
    assert tools["http__ping"]["origin"].startswith("http-")
    # Another tenant sees the service's tools, not ann's.
    bob = await _user(api, "bob")
    theirs = {t["name"] for t in (await api.get("/tools", headers=bob)).json()["tools"]}
    assert "calculate" in theirs and not {n for n in theirs if n.startswith(("mcp__", "http__"))}


async def test_a_step_names_only_the_creators_tools(
    api: httpx.AsyncClient, mcp_server: McpServerProcess
) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    await _setup(api, ann, mcp_server.url)
    ok = [{"name": "s", "prompt": "p", "tools": ["mcp__docs", "mcp__docs__echo", "http__ping"]}]
    r = await api.post("/workflows", headers=ann, json={"name": "w", "steps": ok})
    assert r.status_code == 200, r.text

    bad = [{"name": "s", "prompt": "p", "tools": ["calculate", "mcp__docs__nope"]}]
    r = await api.post("/workflows", headers=ann, json={"name": "w", "steps": bad})
    assert r.status_code == 400 and r.json()["fields"][0]["field"] == "steps[0].tools[1]"
    assert "mcp__docs__nope" in r.json()["error"]

    child = {"name": "c", "steps": [{"name": "x", "prompt": "p", "tools": ["http__nope"]}]}
    spawn = [{"name": "s", "type": "spawn", "workflows": [child]}]
    r = await api.post("/workflows", headers=ann, json={"name": "w", "steps": spawn})
    assert r.status_code == 400
    assert r.json()["fields"][0]["field"] == "steps[0].workflows[0].steps[0].tools[0]"

    # ann's tools are not bob's to name.
    r = await api.post("/workflows", headers=bob, json={"name": "w", "steps": ok})
    assert r.status_code == 400 and r.json()["fields"][0]["field"] == "steps[0].tools[0]"


async def test_a_scheduled_job_names_only_its_creators_tools(api: httpx.AsyncClient) -> None:
    job = {"prompt": "p", "every": 3_600_000, "opts": {"tools": ["calculate", "mcp__ghost__x"]}}
    r = await api.post("/schedules", headers=ADMIN, json=job)
    assert r.status_code == 400 and r.json()["fields"][0]["field"] == "opts.tools"
    job["opts"] = {"tools": ["calculate"]}
    assert (await api.post("/schedules", headers=ADMIN, json=job)).status_code == 200
