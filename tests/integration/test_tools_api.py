"""Users' agent tools over HTTP (the app under uvicorn, real Postgres and Redis, and a real MCP
server, the official SDK's, on loopback): MCP servers registered and listed (their tools
and schemas), header values kept secret (masked in answers, sealed in the database),
unreachable and refused servers, refresh, tenancy, shared and stdio servers (admins), name
conflicts and limits; HTTP tools; tool policies with their permission-grant events; what
`ToolStore.for_user` gives the agent runtime; and the SDK against the same app."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from cryptography.fernet import Fernet

from orchestrator.auth import Principal
from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.errors import ValidationFailed
from orchestrator.events import EventStore
from orchestrator.sdk import ApiError, AsyncClient
from orchestrator.secret_box import secret_box
from orchestrator.tools._store import ToolLimits, ToolStore
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.mcp_server import McpServerProcess

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "Bearer s3cret-mcp-token"
FAKE_TOOLS = {"add", "echo", "fail", "slow", "whoami"}
ROOT = Path(__file__).resolve().parents[2]


def _settings(make_settings: Any, **kw: Any) -> Settings:
    values: dict[str, Any] = {
        # The fake MCP server and the HTTP tools' hosts are on loopback, which the egress
        # guard refuses unless allowed.
        "outbound_allowed_cidrs": ["127.0.0.0/8"],
        "mcp_stdio_commands": [sys.executable],
        "mcp_connect_timeout_s": 10.0,
        "rate_limit_per_minute": 0,
    }
    values.update(kw)
    return make_settings(**values)  # type: ignore[no-any-return]


@pytest.fixture
def settings(make_settings: Any) -> Settings:
    return _settings(make_settings)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=60) as client:
            yield client


@pytest.fixture
def mcp_server() -> Iterator[McpServerProcess]:
    """The fake MCP server, requiring the secret header (401 without it)."""
    with McpServerProcess(require_header=("authorization", SECRET)) as server:
        yield server


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _fields(r: httpx.Response) -> list[str]:
    return [f["field"] for f in r.json().get("fields", [])]


async def _register(
    c: httpx.AsyncClient, who: dict[str, str], url: str, name: str = "fake", **body: Any
) -> dict[str, Any]:
    r = await c.post(
        "/mcp/servers",
        headers=who,
        json={"name": name, "url": url, "headers": {"Authorization": SECRET}, **body},
    )
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def _store(settings: Settings) -> tuple[Any, ToolStore]:
    """The service's ToolStore over its database, with its secret box (the key file in
    data_dir), as the agent runtime builds it."""
    db = await connect(settings.database_url or "")
    box = secret_box(None, settings.data_dir)
    return db, ToolStore(db.pool, box, events=EventStore(db.pool), limits=ToolLimits.of(settings))


# --- MCP servers ----------------------------------------------------------------------------


async def test_register_lists_tools_and_keeps_header_values_secret(
    api: httpx.AsyncClient, settings: Settings, mcp_server: McpServerProcess
) -> None:
    ann = await _user(api, "ann")
    made = await _register(api, ann, mcp_server.url)
    assert made["id"].startswith("mcp-") and made["name"] == "fake"
    assert made["transport"] == "streamable_http" and made["url"] == mcp_server.url
    assert made["status"] == "ready" and "error" not in made, made
    assert made["owner"] == "ann" and made["shared"] is False and made["version"] == 1
    assert made["headers"] == {"Authorization": "***"}
    tools = {t["name"]: t for t in made["tools"]}
    assert set(tools) == FAKE_TOOLS
    add = tools["add"]
    assert add["description"] == "Adds two integers."
    assert add["input_schema"]["type"] == "object"
    assert add["input_schema"]["properties"]["a"]["type"] == "integer"
    assert sorted(add["input_schema"]["required"]) == ["a", "b"]
    assert SECRET not in json.dumps(made)

    got = (await api.get(f"/mcp/servers/{made['id']}", headers=ann)).json()
    assert got == made
    listed = (await api.get("/mcp/servers", headers=ann)).json()
    assert [s["id"] for s in listed["servers"]] == [made["id"]]
    assert SECRET not in json.dumps(listed)

    # At rest: a Fernet token, not the value; the service's box opens it.
    db = await connect(settings.database_url or "")
    try:
        sealed = await db.pool.fetchval(
            "SELECT headers FROM mcp_servers WHERE id = $1", int(made["id"][4:])
        )
        dumped = await db.pool.fetchval(
            "SELECT row_to_json(m)::text FROM mcp_servers m WHERE id = $1", int(made["id"][4:])
        )
    finally:
        await db.close()
    assert isinstance(sealed, bytes) and SECRET.encode() not in sealed
    assert "s3cret" not in dumped
    opened = json.loads(secret_box(None, settings.data_dir).decrypt(sealed))
    assert opened == {"Authorization": SECRET}

    # Without the header the server answers 401: registered, with status error and why.
    r = await api.post("/mcp/servers", headers=ann, json={"name": "noauth", "url": mcp_server.url})
    assert r.status_code == 201, r.text
    bare = r.json()
    assert bare["status"] == "error" and bare["error"] and bare["tools"] == []
    assert bare["headers"] == {}


async def test_unreachable_server_is_registered_with_its_error(
    api: httpx.AsyncClient, mcp_server: McpServerProcess
) -> None:
    ann = await _user(api, "ann")
    with McpServerProcess() as spare:
        dead_url = spare.url
    r = await api.post("/mcp/servers", headers=ann, json={"name": "dead", "url": dead_url})
    assert r.status_code == 201, r.text
    dead = r.json()
    assert dead["status"] == "error" and isinstance(dead["error"], str) and dead["error"]
    assert dead["tools"] == []


async def test_refused_destinations_are_400(make_settings: Any) -> None:
    async with ServedApp(_settings(make_settings, outbound_allowed_cidrs=[])) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            for url in (
                "http://127.0.0.1:9/mcp",
                "http://[::1]:9/mcp",
                "http://169.254.169.254/latest",
                "http://0x7f000001/mcp",
            ):
                r = await c.post("/mcp/servers", headers=ann, json={"name": "x", "url": url})
                assert r.status_code == 400, (url, r.text)
                assert _fields(r) == ["url"] and "outbound_allowed_cidrs" in r.json()["error"]
            tool = {
                "name": "t",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
                "method": "GET",
                "url": "http://10.0.0.1/x",
            }
            r = await c.post("/tools/http", headers=ann, json=tool)
            assert r.status_code == 400 and _fields(r) == ["url"], r.text
            # A host name is resolved when saved, by the check each connect makes.
            for url in ("http://localhost:9/mcp", "http://LocalHost/mcp"):
                r = await c.post("/mcp/servers", headers=ann, json={"name": "x", "url": url})
                assert r.status_code == 400, (url, r.text)
                assert r.json()["fields"] == [
                    {"field": "url", "message": "destination not allowed (outbound_allowed_cidrs)"}
                ]
                r = await c.post("/tools/http", headers=ann, json={**tool, "url": url})
                assert r.status_code == 400 and _fields(r) == ["url"], r.text
            # By its host only: placeholders in the path.
            templated = {**tool, "url": "http://localhost:9/users/{id}", "parameters": _ID}
            r = await c.post("/tools/http", headers=ann, json=templated)
            assert r.status_code == 400 and _fields(r) == ["url"], r.text
            assert (await c.get("/mcp/servers", headers=ann)).json()["servers"] == []
            # A host that does not resolve is no 400: the server is registered with its
            # error, the tool accepted (each call resolves it again).
            r = await c.post(
                "/mcp/servers", headers=ann, json={"name": "x", "url": "http://nowhere.invalid/m"}
            )
            assert r.status_code == 201 and r.json()["status"] == "error", r.text
            sid = r.json()["id"]
            unresolved = {**tool, "url": "http://nowhere.invalid/users/{id}", "parameters": _ID}
            r = await c.post("/tools/http", headers=ann, json=unresolved)
            assert r.status_code == 201, r.text
            tid = r.json()["id"]
            # And a change of the URL to a refused host is a 400 too, the stored one kept.
            r = await c.put(f"/mcp/servers/{sid}", headers=ann, json={"url": "http://localhost/"})
            assert r.status_code == 400 and _fields(r) == ["url"], r.text
            r = await c.put(f"/tools/http/{tid}", headers=ann, json={"url": "http://localhost/"})
            assert r.status_code == 400 and _fields(r) == ["url"], r.text
            got = (await c.get(f"/mcp/servers/{sid}", headers=ann)).json()
            assert got["url"] == "http://nowhere.invalid/m"
            got = (await c.get(f"/tools/http/{tid}", headers=ann)).json()
            assert got["url"] == "http://nowhere.invalid/users/{id}"


_ID = {"type": "object", "properties": {"id": {"type": "string"}}}


async def test_a_name_resolving_to_the_metadata_service_is_refused_when_saved(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the store (the API's uvicorn resolves with uvloop, which this test cannot
    point a name elsewhere in): a name whose address is 169.254.169.254 is a 400."""
    real = socket.getaddrinfo

    def dns(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "metadata.rebind.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    db, store = await _store(_settings(make_settings, outbound_allowed_cidrs=[]))
    ann = Principal("ann")
    try:
        for url in ("http://metadata.rebind.test/latest", "https://metadata.rebind.test/{id}"):
            with pytest.raises(ValidationFailed) as mcp:
                await store.create_mcp_server(ann, {"name": "meta", "url": url.replace("{id}", "")})
            assert mcp.value.extra["fields"][0]["field"] == "url"
            body = {**_http_tool(), "url": url, "parameters": _ID}
            with pytest.raises(ValidationFailed) as http:
                await store.create_http_tool(ann, body)
            assert http.value.extra["fields"] == [
                {"field": "url", "message": "destination not allowed (outbound_allowed_cidrs)"}
            ]
        assert await store.list_mcp_servers(ann) == [] and await store.list_http_tools(ann) == []
    finally:
        await db.close()


async def test_refresh_follows_the_server(
    api: httpx.AsyncClient, mcp_server: McpServerProcess
) -> None:
    ann = await _user(api, "ann")
    made = await _register(api, ann, mcp_server.url)
    assert made["status"] == "ready"
    mcp_server.kill()
    r = await api.post(f"/mcp/servers/{made['id']}/refresh", headers=ann)
    assert r.status_code == 200, r.text
    down = r.json()
    assert down["status"] == "error" and down["error"]
    assert down["version"] == 1
    mcp_server.start()
    r = await api.post(f"/mcp/servers/{made['id']}/refresh", headers=ann)
    back = r.json()
    assert back["status"] == "ready" and "error" not in back, back
    assert {t["name"] for t in back["tools"]} == FAKE_TOOLS
    assert back["updated_at"] >= down["updated_at"]


async def test_update_reconnects_on_connection_changes(
    api: httpx.AsyncClient, mcp_server: McpServerProcess
) -> None:
    ann = await _user(api, "ann")
    made = await _register(api, ann, mcp_server.url)
    sid = made["id"]
    # A new name only: same version, tools kept.
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"name": "renamed"})
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "renamed" and r.json()["version"] == 1
    assert r.json()["status"] == "ready"
    # Headers given replace the stored ones: without the secret the server refuses.
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"headers": {"X-Other": "1"}})
    changed = r.json()
    assert changed["version"] == 2 and changed["status"] == "error", changed
    assert changed["headers"] == {"X-Other": "***"} and changed["tools"] == []
    # Back, and `***` keeps the stored value of a header.
    r = await api.put(
        f"/mcp/servers/{sid}",
        headers=ann,
        json={"headers": {"Authorization": SECRET, "X-Other": "***"}},
    )
    again = r.json()
    assert again["version"] == 3 and again["status"] == "ready", again
    assert again["headers"] == {"Authorization": "***", "X-Other": "***"}
    # Sending back what was read changes nothing: no new version.
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"headers": again["headers"]})
    assert r.json()["version"] == 3
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"headers": {"New": "***"}})
    assert r.status_code == 400 and _fields(r) == ["headers.New"]
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"command": sys.executable})
    assert r.status_code == 400 and _fields(r) == ["command"]
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"shared": True})
    assert r.status_code == 400 and _fields(r) == ["shared"]
    r = await api.put(f"/mcp/servers/{sid}", headers=ann, json={"colour": "red"})
    assert r.status_code == 400
    r = await api.delete(f"/mcp/servers/{sid}", headers=ann)
    assert r.status_code == 200 and r.json() == {"ok": True, "deleted": sid}
    assert (await api.get(f"/mcp/servers/{sid}", headers=ann)).status_code == 404


async def test_another_users_server_is_not_found(
    api: httpx.AsyncClient, mcp_server: McpServerProcess
) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    sid = (await _register(api, ann, mcp_server.url))["id"]
    for who, wanted in ((bob, 404), (ADMIN, 404)):
        assert (await api.get(f"/mcp/servers/{sid}", headers=who)).status_code == wanted
        r = await api.put(f"/mcp/servers/{sid}", headers=who, json={"name": "mine"})
        assert r.status_code == wanted
        assert (await api.post(f"/mcp/servers/{sid}/refresh", headers=who)).status_code == wanted
        assert (await api.delete(f"/mcp/servers/{sid}", headers=who)).status_code == wanted
        assert (await api.get("/mcp/servers", headers=who)).json()["servers"] == []
    for bad in ("mcp-x", "nope", "mcp-99999999", "http-1"):
        assert (await api.get(f"/mcp/servers/{bad}", headers=ann)).status_code == 404
    # Bob may use the same name for his own.
    assert (await _register(api, bob, mcp_server.url))["owner"] == "bob"
    assert (await api.get(f"/mcp/servers/{sid}", headers=ann)).json()["name"] == "fake"


async def test_shared_servers(api: httpx.AsyncClient, mcp_server: McpServerProcess) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    body = {"name": "team", "url": mcp_server.url, "headers": {"Authorization": SECRET}}
    r = await api.post("/mcp/servers", headers=ann, json={**body, "shared": True})
    assert r.status_code == 403, r.text
    shared = await _register(api, ADMIN, mcp_server.url, name="team", shared=True)
    assert shared["shared"] is True and shared["owner"] == "admin"
    own = await _register(api, ann, mcp_server.url, name="mine")
    listed = (await api.get("/mcp/servers", headers=ann)).json()["servers"]
    assert [s["id"] for s in listed] == [own["id"], shared["id"]]  # own first
    assert [s["id"] for s in (await api.get("/mcp/servers", headers=bob)).json()["servers"]] == [
        shared["id"]
    ]
    sid = shared["id"]
    got = await api.get(f"/mcp/servers/{sid}", headers=bob)
    assert got.status_code == 200 and got.json()["headers"] == {"Authorization": "***"}
    assert (
        await api.put(f"/mcp/servers/{sid}", headers=bob, json={"name": "x"})
    ).status_code == 403
    assert (await api.post(f"/mcp/servers/{sid}/refresh", headers=bob)).status_code == 403
    assert (await api.delete(f"/mcp/servers/{sid}", headers=bob)).status_code == 403
    # Name conflicts: an own server may not take a shared one's name, nor two shared one name.
    r = await api.post("/mcp/servers", headers=ann, json={"name": "team", "url": mcp_server.url})
    assert r.status_code == 409, r.text
    r = await api.put(f"/mcp/servers/{own['id']}", headers=ann, json={"name": "team"})
    assert r.status_code == 409, r.text
    r = await api.post("/mcp/servers", headers=ADMIN, json={**body, "shared": True})
    assert r.status_code == 409, r.text
    r = await api.post("/mcp/servers", headers=ann, json={"name": "mine", "url": mcp_server.url})
    assert r.status_code == 409, r.text
    # Admins change and delete it.
    r = await api.post(f"/mcp/servers/{sid}/refresh", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "ready"
    r = await api.put(f"/mcp/servers/{sid}", headers=ADMIN, json={"name": "team2"})
    assert r.status_code == 200 and r.json()["name"] == "team2"
    assert (await api.delete(f"/mcp/servers/{sid}", headers=ADMIN)).status_code == 200
    assert (await api.get("/mcp/servers", headers=bob)).json()["servers"] == []


async def test_stdio_servers_are_admins_and_allowed_commands_only(
    api: httpx.AsyncClient,
) -> None:
    ann = await _user(api, "ann")
    stdio = {
        "name": "local",
        "command": sys.executable,
        "args": ["-m", "tests.fakes.mcp_server", "--stdio"],
        # The child runs wherever the worker runs: the fake is found by its path.
        "env": {"PYTHONPATH": str(ROOT)},
    }
    r = await api.post("/mcp/servers", headers=ann, json=stdio)
    assert r.status_code == 403, r.text
    r = await api.post("/mcp/servers", headers=ADMIN, json={**stdio, "command": "/bin/sh"})
    assert r.status_code == 400 and _fields(r) == ["command"], r.text
    r = await api.post(
        "/mcp/servers", headers=ADMIN, json={**stdio, "url": "http://127.0.0.1:9/mcp"}
    )
    assert r.status_code == 400 and _fields(r) == ["command"], r.text
    r = await api.post("/mcp/servers", headers=ADMIN, json={**stdio, "headers": {"A": "b"}})
    assert r.status_code == 400 and _fields(r) == ["headers"], r.text
    r = await api.post("/mcp/servers", headers=ADMIN, json=stdio)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["transport"] == "stdio" and made["command"] == sys.executable
    assert made["args"] == stdio["args"] and made["env"] == {"PYTHONPATH": "***"}
    assert "url" not in made and "headers" not in made
    assert made["status"] == "ready", made
    assert {t["name"] for t in made["tools"]} == FAKE_TOOLS
    # The listing's session was the request's own: the API process keeps no stdio child.
    await _until_true(lambda: not _stdio_children())
    r = await api.post(f"/mcp/servers/{made['id']}/refresh", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "ready", r.text
    await _until_true(lambda: not _stdio_children())


def _stdio_children() -> list[int]:
    """This process's live children running the fake MCP server over stdio (Linux /proc)."""
    me, found = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if stat[1] == me and stat[0] != "Z" and b"--stdio" in command:
            found.append(int(entry.name))
    return found


async def _until_true(check: Any, within: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Bad Name", "url": "http://127.0.0.1:9/mcp"}, "name"),
        ({"name": "x" * 33, "url": "http://127.0.0.1:9/mcp"}, "name"),
        ({"name": "gh__repo", "url": "http://127.0.0.1:9/mcp"}, "name"),
        ({"name": "ok"}, "url"),
        ({"name": "ok", "url": "ftp://127.0.0.1/mcp"}, "url"),
        ({"name": "ok", "url": "http://user:pw@127.0.0.1/mcp"}, "url"),
        ({"name": "ok", "url": "http://127.0.0.1:99999/mcp"}, "url"),
        ({"name": "ok", "url": "http://127.0.0.1:9/mcp", "headers": {"Bad Name": "v"}}, "headers"),
        ({"name": "ok", "url": "http://127.0.0.1:9/mcp", "headers": {"Host": "v"}}, "headers"),
        ({"name": "ok", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "v\n"}}, "headers"),
        ({"name": "ok", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "***"}}, "headers"),
        ({"name": "ok", "url": "http://127.0.0.1:9/mcp", "args": ["-v"]}, "args"),
        ({"url": "http://127.0.0.1:9/mcp"}, "name"),
    ],
)
async def test_bad_registrations_name_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await api.post("/mcp/servers", headers=ADMIN, json=body)
    assert r.status_code == 400, r.text
    assert any(f.startswith(field) for f in _fields(r)), r.json()
    assert field in r.json()["error"]
    assert "v\n" not in r.text  # a header value is never quoted


async def test_limits_name_their_setting(make_settings: Any) -> None:
    settings = _settings(make_settings, mcp_max_servers_per_user=2, http_tools_max_per_user=1)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=60) as c:
            ann = await _user(c, "ann")
            with McpServerProcess() as spare:
                dead = spare.url
            for name in ("one", "two"):
                r = await c.post("/mcp/servers", headers=ann, json={"name": name, "url": dead})
                assert r.status_code == 201, r.text
            r = await c.post("/mcp/servers", headers=ann, json={"name": "three", "url": dead})
            assert r.status_code == 400 and r.json()["limit"] == "mcp_max_servers_per_user"
            bob = await _user(c, "bob")  # the limit is per user
            r = await c.post("/mcp/servers", headers=bob, json={"name": "three", "url": dead})
            assert r.status_code == 201
            r = await c.post("/tools/http", headers=ann, json=_http_tool("a"))
            assert r.status_code == 201, r.text
            r = await c.post("/tools/http", headers=ann, json=_http_tool("b"))
            assert r.status_code == 400 and r.json()["limit"] == "http_tools_max_per_user"


# --- HTTP tools -----------------------------------------------------------------------------


def _http_tool(name: str = "weather", **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "units": {"type": "string"}},
            "required": ["city"],
        },
        "method": "GET",
        "url": "https://api.example.com/weather/{city}",
        "headers": {"X-Api-Key": "k3y-secret"},
    }
    body.update(kw)
    return body


async def test_http_tools_crud_and_tenancy(api: httpx.AsyncClient, settings: Settings) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    r = await api.post("/tools/http", headers=ann, json=_http_tool())
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["id"].startswith("http-") and made["tool"] == "http__weather"
    assert made["headers"] == {"X-Api-Key": "***"} and made["method"] == "GET"
    assert made["url"] == "https://api.example.com/weather/{city}"
    assert "k3y-secret" not in r.text
    tid = made["id"]
    assert (await api.get(f"/tools/http/{tid}", headers=ann)).json() == made
    assert [t["id"] for t in (await api.get("/tools/http", headers=ann)).json()["tools"]] == [tid]
    r = await api.post("/tools/http", headers=ann, json=_http_tool())
    assert r.status_code == 409, r.text
    # Bob: his own list is empty, Ann's tool is not found, and he may use the name.
    assert (await api.get("/tools/http", headers=bob)).json()["tools"] == []
    assert (await api.get(f"/tools/http/{tid}", headers=bob)).status_code == 404
    r = await api.put(f"/tools/http/{tid}", headers=bob, json={"description": "mine"})
    assert r.status_code == 404
    assert (await api.delete(f"/tools/http/{tid}", headers=bob)).status_code == 404
    assert (await api.post("/tools/http", headers=bob, json=_http_tool())).status_code == 201
    for bad in ("http-x", "mcp-1", "1"):
        assert (await api.get(f"/tools/http/{bad}", headers=ann)).status_code == 404

    # Changes are checked with what is kept: a URL naming a parameter the tool lacks is a 400.
    r = await api.put(
        f"/tools/http/{tid}", headers=ann, json={"url": "https://api.example.com/{country}"}
    )
    assert r.status_code == 400 and _fields(r) == ["url"], r.text
    r = await api.put(
        f"/tools/http/{tid}",
        headers=ann,
        json={"method": "post", "headers": {"X-Api-Key": "***", "X-Trace": "1"}},
    )
    assert r.status_code == 200, r.text
    changed = r.json()
    assert changed["method"] == "POST" and changed["description"] == made["description"]
    assert changed["headers"] == {"X-Api-Key": "***", "X-Trace": "***"}
    assert changed["updated_at"] >= made["updated_at"]

    db, store = await _store(settings)
    try:
        sealed = await db.pool.fetchval(
            "SELECT headers FROM http_tools WHERE id = $1", int(tid[5:])
        )
        assert b"k3y-secret" not in sealed
        user = await store.for_user("ann")
        assert [(t.id, t.headers) for t in user.http] == [
            (tid, {"X-Api-Key": "k3y-secret", "X-Trace": "1"})
        ]
    finally:
        await db.close()

    r = await api.delete(f"/tools/http/{tid}", headers=ann)
    assert r.status_code == 200 and r.json() == {"ok": True, "deleted": tid}
    assert (await api.get(f"/tools/http/{tid}", headers=ann)).status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad"}, "name"),
        ({"name": "my__tool"}, "name"),
        ({"description": ""}, "description"),
        ({"parameters": {"type": "string"}}, "parameters.type"),
        ({"method": "TRACE"}, "method"),
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "https://example.com/{nope}"}, "url"),
        ({"headers": {"Host": "x"}}, "headers.Host"),
        ({"headers": {"X-Key": "***"}}, "headers.X-Key"),
    ],
)
async def test_http_tool_validation(
    api: httpx.AsyncClient, change: dict[str, Any], field: str
) -> None:
    ann = await _user(api, "ann")
    r = await api.post("/tools/http", headers=ann, json=_http_tool(**change))
    assert r.status_code == 400, r.text
    assert _fields(r) == [field], r.json()
    r = await api.post("/tools/http", headers=ann, json={**_http_tool(), "extra": 1})
    assert r.status_code == 400
    r = await api.post("/tools/http", headers=ann, json={"name": "x"})
    assert r.status_code == 400


# --- policies -------------------------------------------------------------------------------


async def _grants(c: httpx.AsyncClient, who: dict[str, str]) -> list[dict[str, Any]]:
    r = await c.get("/events", headers=who, params={"types": "audit.permission_grant"})
    assert r.status_code == 200, r.text
    found = [e for e in r.json()["data"] if (e["data"].get("permission") or "").startswith("tool:")]
    # (the catalog's model fills the type's other optional fields with null)
    return [{**e, "data": {k: v for k, v in e["data"].items() if v is not None}} for e in found]


async def _until(check: Any, within: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = await check()
        if got:
            return got
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_policies(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    empty = (await api.get("/tools/policy", headers=ann)).json()
    assert empty == {
        "scope": "user",
        "user_uuid": "ann",
        "rules": [],
        "global_rules": [],
        "updated_at": None,
        "updated_by": None,
    }
    rules = [
        {"tool": "mcp__github__*", "action": "allow"},
        {"tool": "http__*", "action": "deny"},
    ]
    r = await api.put("/tools/policy", headers=ann, json={"rules": rules})
    assert r.status_code == 200, r.text
    stored = r.json()
    assert stored["rules"] == rules and stored["scope"] == "user"
    assert stored["user_uuid"] == "ann" and stored["updated_by"] == "ann"
    assert (await api.get("/tools/policy", headers=ann)).json() == stored

    # Non-admins: neither the global rules nor another user's.
    for params in ({"scope": "global"}, {"user_uuid": "bob"}):
        assert (await api.get("/tools/policy", headers=ann, params=params)).status_code == 403
        r = await api.put("/tools/policy", headers=ann, params=params, json={"rules": []})
        assert r.status_code == 403
    assert (await api.get("/tools/policy", headers=ann, params={"user_uuid": "ann"})).json() == (
        stored
    )

    # Admins set the global rules (which every user's GET shows) and anyone's.
    global_rules = [{"tool": "workspace_*", "action": "deny"}]
    r = await api.put(
        "/tools/policy", headers=ADMIN, params={"scope": "global"}, json={"rules": global_rules}
    )
    assert r.status_code == 200, r.text
    assert r.json()["scope"] == "global" and r.json()["user_uuid"] is None
    assert r.json()["rules"] == global_rules
    seen = (await api.get("/tools/policy", headers=bob)).json()
    assert seen["rules"] == [] and seen["global_rules"] == global_rules
    bob_rules = [{"tool": "http__weather", "action": "allow"}]
    r = await api.put(
        "/tools/policy", headers=ADMIN, params={"user_uuid": "bob"}, json={"rules": bob_rules}
    )
    assert r.status_code == 200 and r.json()["updated_by"] == "admin"
    assert (await api.get("/tools/policy", headers=bob)).json()["rules"] == bob_rules

    # Each new allow rule of a user is an audit.permission_grant of theirs.
    ann_grants = await _until(lambda: _grants(api, ann))
    assert [g["data"] for g in ann_grants] == [
        {"user_uuid": "ann", "permission": "tool:mcp__github__*", "granted_by": "ann"}
    ]
    assert ann_grants[0]["aggregate_id"] == "ann"
    bob_grants = await _until(lambda: _grants(api, bob))
    assert [g["data"] for g in bob_grants] == [
        {"user_uuid": "bob", "permission": "tool:http__weather", "granted_by": "admin"}
    ]
    # Setting the same allow rule again grants nothing new.
    r = await api.put("/tools/policy", headers=ann, json={"rules": rules[:1]})
    assert r.status_code == 200
    assert len(await _grants(api, ann)) == 1

    for body, field in (
        ({"rules": [{"tool": "x", "action": "maybe"}]}, "rules.0.action"),
        ({"rules": [{"tool": "bad tool", "action": "allow"}]}, "rules[0].tool"),
        ({"rules": [{"tool": "x", "action": "allow", "why": 1}]}, "rules.0.why"),
        ({"rules": "all"}, "rules"),
    ):
        r = await api.put("/tools/policy", headers=ann, json=body)
        assert r.status_code == 400, (body, r.text)
        assert field in r.json()["error"], (field, r.json())
    r = await api.get("/tools/policy", headers=ADMIN, params={"scope": "global", "user_uuid": "x"})
    assert r.status_code == 400


# --- what the agent runtime reads -----------------------------------------------------------


async def test_for_user_gives_what_the_routes_stored(
    api: httpx.AsyncClient, settings: Settings, mcp_server: McpServerProcess
) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    own = await _register(api, ann, mcp_server.url, name="dup")
    shared = await _register(api, ADMIN, mcp_server.url, name="team", shared=True)
    # A shared server named as Ann's own one (registered after hers): hidden from her.
    hidden = await _register(api, ADMIN, mcp_server.url, name="dup", shared=True)
    tool = (await api.post("/tools/http", headers=ann, json=_http_tool())).json()
    await api.put(
        "/tools/policy", headers=ann, json={"rules": [{"tool": "http__*", "action": "allow"}]}
    )
    await api.put(
        "/tools/policy",
        headers=ADMIN,
        params={"scope": "global"},
        json={"rules": [{"tool": "mcp__team__slow", "action": "deny"}]},
    )
    db, store = await _store(settings)
    try:
        mine = await store.for_user("ann")
        assert [s.id for s in mine.mcp] == [own["id"], shared["id"]]
        assert mine.mcp[0].headers == {"Authorization": SECRET}
        assert mine.mcp[1].headers == {"Authorization": SECRET} and mine.mcp[1].shared
        assert {t.name for t in mine.mcp[0].tools} == FAKE_TOOLS
        add = next(t for t in mine.mcp[0].tools if t.name == "add")
        assert add.input_schema["properties"]["b"]["type"] == "integer"
        assert mine.mcp[0].status == "ready" and mine.mcp[0].url == mcp_server.url
        assert [t.id for t in mine.http] == [tool["id"]]
        assert mine.http[0].headers == {"X-Api-Key": "k3y-secret"}
        assert mine.http[0].parameters == _http_tool()["parameters"]
        assert not mine.policy.decide("mcp__team__slow").allowed
        decision = mine.policy.decide("http__weather")
        assert decision.allowed and decision.scope == "user"
        theirs = await store.for_user("bob")
        assert [s.id for s in theirs.mcp] == [shared["id"], hidden["id"]]
        assert theirs.http == () and theirs.policy.user_rules == ()
        # Read through the store's own API as the routes do: the same servers.
        listed = await store.list_mcp_servers(Principal("ann"))
        assert [s.id for s in listed] == [own["id"], shared["id"], hidden["id"]]
    finally:
        await db.close()
    assert bob  # (Bob exists: a user with nothing of his own sees the shared servers)


async def test_for_user_leaves_out_a_row_sealed_with_another_key(
    api: httpx.AsyncClient,
    settings: Settings,
    mcp_server: McpServerProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A row whose secrets another node sealed with its own key: every other server and tool
    of the user still reaches their tasks, and the warning names the row, never a value."""
    ann = await _user(api, "ann")
    good = await _register(api, ann, mcp_server.url, name="good")
    tool = (await api.post("/tools/http", headers=ann, json=_http_tool())).json()
    foreign = Fernet(Fernet.generate_key())
    stray_value = "stray-secret-value"
    sealed = foreign.encrypt(json.dumps({"Authorization": stray_value}).encode())
    db, store = await _store(settings)
    try:
        bad_server = await db.pool.fetchval(
            "INSERT INTO mcp_servers (owner, name, transport, url, headers) VALUES"
            " ('ann', 'elsewhere', 'streamable_http', 'https://mcp.example.com/mcp', $1)"
            " RETURNING id",
            sealed,
        )
        bad_tool = await db.pool.fetchval(
            "INSERT INTO http_tools (user_uuid, name, description, parameters, method, url,"
            " headers) VALUES ('ann', 'elsewhere', 'd', '{\"type\": \"object\"}', 'GET',"
            " 'https://api.example.com/x', $1) RETURNING id",
            sealed,
        )
        with caplog.at_level(logging.WARNING, logger="orchestrator.tools"):
            mine = await store.for_user("ann")
        assert [s.id for s in mine.mcp] == [good["id"]]
        assert mine.mcp[0].headers == {"Authorization": SECRET}
        assert [t.id for t in mine.http] == [tool["id"]]
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"mcp-{bad_server}" in m for m in warned), warned
        assert any(f"http-{bad_tool}" in m for m in warned), warned
        assert stray_value not in caplog.text and SECRET not in caplog.text
    finally:
        await db.close()


async def test_the_database_refuses_a_name_with_two_underscores(settings: Settings) -> None:
    """The rule holds in the schema too (migration 0022), whatever writes the row."""
    db = await connect(settings.database_url or "")  # (migrates the database)
    try:
        with pytest.raises(asyncpg.CheckViolationError):
            await db.pool.execute(
                "INSERT INTO mcp_servers (owner, name, transport, url)"
                " VALUES ('ann', 'gh__repo', 'streamable_http', 'https://a.example/mcp')"
            )
        with pytest.raises(asyncpg.CheckViolationError):
            await db.pool.execute(
                "INSERT INTO http_tools (user_uuid, name, description, parameters, method,"
                " url) VALUES ('ann', 'my__tool', 'd', '{}', 'GET', 'https://a.example/')"
            )
    finally:
        await db.close()


# --- the SDK --------------------------------------------------------------------------------


async def test_sdk(settings: Settings, mcp_server: McpServerProcess) -> None:
    async with ServedApp(settings) as served:
        async with AsyncClient(served.url, token=ADMIN_TOKEN) as admin:
            token = (await admin.create_token("cleo")).token
        async with AsyncClient(served.url, token=token) as cleo:
            server = await cleo.create_mcp_server(
                "fake", mcp_server.url, headers={"Authorization": SECRET}
            )
            assert server.status == "ready" and server.headers == {"Authorization": "***"}
            assert {t.name for t in server.tools} == FAKE_TOOLS
            assert [s.id for s in (await cleo.mcp_servers()).servers] == [server.id]
            assert (await cleo.mcp_server(server.id)).name == "fake"
            renamed = await cleo.update_mcp_server(server.id, name="fake2")
            assert renamed.name == "fake2" and renamed.version == 1
            assert (await cleo.refresh_mcp_server(server.id)).status == "ready"
            assert (await cleo.delete_mcp_server(server.id)).deleted == server.id
            with pytest.raises(ApiError) as info:
                await cleo.mcp_server(server.id)
            assert info.value.status == 404

            tool = await cleo.create_http_tool(
                "weather",
                "The weather of a city",
                _http_tool()["parameters"],
                "GET",
                "https://api.example.com/weather/{city}",
                headers={"X-Api-Key": "k"},
            )
            assert tool.tool == "http__weather" and tool.headers == {"X-Api-Key": "***"}
            assert [t.id for t in (await cleo.http_tools()).tools] == [tool.id]
            assert (await cleo.http_tool(tool.id)).url == tool.url
            assert (await cleo.update_http_tool(tool.id, method="POST")).method == "POST"
            assert (await cleo.delete_http_tool(tool.id)).deleted == tool.id
            assert (await cleo.http_tools()).tools == []

            policy = await cleo.set_tool_policy([{"tool": "http__*", "action": "deny"}])
            assert [(r.tool, r.action) for r in policy.rules] == [("http__*", "deny")]
            assert (await cleo.tool_policy()).rules == policy.rules
            with pytest.raises(ApiError) as info:
                await cleo.tool_policy(scope="global")
            assert info.value.status == 403
