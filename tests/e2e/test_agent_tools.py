"""Agents that reach the world, through the service the README starts (`scripts/serve`: Serve,
WorkflowShard and AgentWorker actors, embedded Postgres), against a loopback OpenAI-format
model that calls whatever tool a step's prompt names (tests/fakes/agent_llm.py):

- a real MCP server (the `mcp` SDK's own server, tests/fakes/mcp_server.py) over streamable
  HTTP with a bearer header, registered by a user and called from a workflow step on an
  AgentWorker: the server's real answer is the step's, it saw exactly the model's arguments;
  its error result, a call past `mcp_call_timeout_s` and the server killed and started again
  (no re-registration) are results the agent goes on with;
- a shared stdio MCP server an admin registered (a child process of the worker), used by
  another user;
- a user's HTTP tool against a loopback API;
- a marketplace skill's body in the model's system prompt;
- policies: a user's own deny, and a global deny their allow cannot loosen;
- the audit trail on /events, and no secret of the run in any event or log line.

On the e2e modules' shared service (tests/e2e/shared.py): its users, servers and skills have
names of their own, and the global rule it adds it takes back.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.shared import SharedService
from tests.e2e.test_json_logs import _session_dir
from tests.e2e.test_workflows import Orchestrator
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes.mcp_server import McpServerProcess
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MCP_SECRET = "Bearer mcp-secret-e2e-7f3a9c"
HTTP_SECRET = "http-secret-e2e-51d2e8"
STDIO_SECRET = "stdio-secret-e2e-93be11"
ARG_SECRET = "pw-e2e-0c44d7"


class WeatherApi(LoopbackServer):
    """A third-party JSON API an HTTP tool points at: `GET /weather/<city>`."""

    label = "weather"

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if request.path.startswith("/weather/"):
            city = request.path.removeprefix("/weather/")
            await self.send_json(send, 200, {"city": city, "sky": "clear"})
        else:
            await self.send_json(send, 404, {"error": "no such route"})


@pytest.fixture(scope="module")
def llm(shared_service: SharedService) -> OpenAIFake:
    """The agents' model (answers with tests/fakes/agent_llm.py's `agent_reply`)."""
    return shared_service.llm


@pytest.fixture(scope="module")
def mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServerProcess]:
    record = tmp_path_factory.mktemp("mcp") / "calls.jsonl"
    server = McpServerProcess(record=record, require_header=("Authorization", MCP_SECRET))
    with server:
        yield server


@pytest.fixture(scope="module")
def weather() -> Iterator[WeatherApi]:
    with WeatherApi() as server:
        yield server


@pytest.fixture(scope="module")
def service(shared_service: SharedService) -> Orchestrator:
    """The shared service: provider_retries 0, loopback allowed outbound, this interpreter
    allowed as a stdio MCP command, and `mcp_call_timeout_s: 3`."""
    return shared_service.orch


def _user(service: Orchestrator) -> httpx.Client:
    """A client acting as a new ordinary user."""
    name = f"u-{uuid.uuid4().hex[:10]}"
    with service.client() as admin:
        r = admin.post("/tokens", json={"user_uuid": name})
        assert r.status_code == 200, r.text
        token = r.json()["token"]
    return httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _run(c: httpx.Client, steps: list[dict[str, Any]], within: float = 90) -> dict[str, Any]:
    r = c.post("/workflows", json={"name": "tools-e2e", "steps": steps})
    assert r.status_code == 200, r.text
    workflow_id = r.json()["id"]
    deadline = time.monotonic() + within
    while True:
        body: dict[str, Any] = c.get(f"/workflows/{workflow_id}").json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.3)


def _events(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/events", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def _hidden(arguments: dict[str, Any]) -> str:
    """Tool arguments the scripted model decodes (tests/fakes/agent_llm.py): they appear in
    no prompt, so only the tool call itself can carry them into an event."""
    return "b64:" + base64.b64encode(json.dumps(arguments).encode()).decode()


def _typed(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == type_]


def _task_of(c: httpx.Client, workflow_id: str, step: str) -> str:
    created = _events(c, types="task.created")
    return next(
        e["aggregate_id"]
        for e in created
        if e["data"].get("workflow_id") == workflow_id and e["data"].get("step") == step
    )


def _register(c: httpx.Client, name: str, url: str) -> dict[str, Any]:
    r = c.post(
        "/mcp/servers", json={"name": name, "url": url, "headers": {"Authorization": MCP_SECRET}}
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_an_mcp_tool_in_a_workflow_step(service: Orchestrator, mcp: McpServerProcess) -> None:
    with _user(service) as alice, _user(service) as bob:
        server = _register(alice, "files", mcp.url)
        assert server["status"] == "ready" and server["id"].startswith("mcp-")
        assert server["headers"] == {"Authorization": "***"}
        assert {"echo", "add", "fail", "slow", "whoami"} <= {t["name"] for t in server["tools"]}
        echo = next(t for t in server["tools"] if t["name"] == "echo")
        assert echo["input_schema"]["properties"]["text"]["type"] == "string"
        listed = {t["name"]: t for t in alice.get("/tools").json()["tools"]}
        assert listed["mcp__files__echo"]["source"] == "mcp"
        assert listed["calculate"]["source"] == "builtin"
        assert listed["marketplace_search"]["source"] == "marketplace"

        body = _run(
            alice,
            [
                {
                    "name": "ask",
                    "prompt": '[tool mcp__files__echo {"text": "hello from alice"}]',
                    "tools": ["mcp__files"],
                }
            ],
        )
        assert body["status"] == "completed", body
        assert body["steps"][0]["result"] == "tool mcp__files__echo said: hello from alice"
        assert mcp.calls()[-1]["tool"] == "echo"
        assert mcp.calls()[-1]["arguments"] == {"text": "hello from alice"}

        task_id = _task_of(alice, body["id"], "ask")
        trail = _events(alice, aggregate=task_id)
        executed = [e["data"] for e in trail if e["type"] == "audit.tool_executed"]
        assert len(executed) == 1
        assert executed[0]["tool"] == "mcp__files__echo" and executed[0]["source"] == "mcp"
        assert executed[0]["mcp_server_id"] == server["id"] and executed[0]["ok"] is True
        decisions = [
            e["data"]
            for e in _events(alice, types="audit.llm_decision")
            if e["data"].get("task_id") == task_id
        ]
        assert [d["decision"] for d in decisions] == ["tool_calls", "final"]
        assert decisions[0]["tools"] == ["mcp__files__echo"]

        # Another tenant's server: invisible, and its tools are not bob's to name.
        assert bob.get(f"/mcp/servers/{server['id']}").status_code == 404
        assert server["id"] not in {s["id"] for s in bob.get("/mcp/servers").json()["servers"]}
        r = bob.post(
            "/workflows",
            json={"name": "x", "steps": [{"name": "s", "prompt": "p", "tools": ["mcp__files"]}]},
        )
        assert r.status_code == 400 and "steps[0].tools[0]" in r.text


def test_error_results_a_timeout_and_a_restarted_server(
    service: Orchestrator, mcp: McpServerProcess
) -> None:
    with _user(service) as carol:
        _register(carol, "box", mcp.url)
        body = _run(
            carol,
            [
                {"name": "fails", "prompt": '[tool mcp__box__fail {"message": "no disk"}]'},
                {"name": "slow", "prompt": '[tool mcp__box__slow {"seconds": 20}]'},
            ],
        )
        assert body["status"] == "completed", body
        failed, slow = (s["result"] for s in body["steps"])
        assert failed.startswith("tool mcp__box__fail said:") and "no disk" in failed
        assert slow.startswith("tool mcp__box__slow said:") and "did not answer within 3s" in slow
        task_id = _task_of(carol, body["id"], "fails")
        executed = [
            e["data"]
            for e in _events(carol, aggregate=task_id)
            if e["type"] == "audit.tool_executed"
        ]
        assert executed[0]["ok"] is False

        pid_before = mcp.calls()[-1]["pid"]
        mcp.kill()
        mcp.start()  # the same URL: no re-registration
        body = _run(carol, [{"name": "again", "prompt": '[tool mcp__box__echo {"text": "back"}]'}])
        assert body["steps"][0]["result"] == "tool mcp__box__echo said: back"
        assert mcp.calls()[-1]["pid"] != pid_before


def test_a_shared_stdio_server_an_admin_registered(service: Orchestrator) -> None:
    name = f"calc{uuid.uuid4().hex[:6]}"
    script = str(ROOT / "tests" / "fakes" / "mcp_server.py")
    with service.client() as admin, _user(service) as dave:
        r = admin.post(
            "/mcp/servers",
            json={
                "name": name,
                "command": sys.executable,
                "args": [script, "--stdio"],
                "env": {"CALC_TOKEN": STDIO_SECRET},
                "shared": True,
            },
        )
        assert r.status_code == 201, r.text
        server = r.json()
        assert server["transport"] == "stdio" and server["env"] == {"CALC_TOKEN": "***"}
        try:
            body = _run(
                dave, [{"name": "sum", "prompt": f'[tool mcp__{name}__add {{"a": 2, "b": 3}}]'}]
            )
            assert body["steps"][0]["result"] == f"tool mcp__{name}__add said: 5"
            # Usable by all, editable by admins only; the refusal is audited.
            assert dave.delete(f"/mcp/servers/{server['id']}").status_code == 403
            # Recorded after the answer went out (deployments/layers/records.py): waited for.
            deadline = time.monotonic() + 30
            while True:
                denials = _events(dave, types="audit.permission_deny")
                if any(
                    d["data"]["permission"].startswith("DELETE ")
                    and "mcp/servers" in d["data"]["permission"]
                    for d in denials
                ):
                    break
                assert time.monotonic() < deadline, denials
                time.sleep(0.1)
        finally:
            assert admin.delete(f"/mcp/servers/{server['id']}").status_code == 200


def test_an_http_tool_in_a_workflow_step(service: Orchestrator, weather: WeatherApi) -> None:
    with _user(service) as erin:
        r = erin.post(
            "/tools/http",
            json={
                "name": "weather",
                "description": "Today's weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "units": {"type": "string"}},
                    "required": ["city"],
                },
                "method": "GET",
                "url": f"{weather.url}/weather/{{city}}",
                "headers": {"X-Api-Key": HTTP_SECRET},
            },
        )
        assert r.status_code == 201, r.text
        tool = r.json()
        assert tool["headers"] == {"X-Api-Key": "***"}
        args = _hidden({"city": "São Paulo", "units": "metric", "password": ARG_SECRET})
        body = _run(erin, [{"name": "w", "prompt": f"[tool http__weather {args}]"}])
        assert body["status"] == "completed", body
        result = body["steps"][0]["result"]
        assert result.startswith("tool http__weather said:") and '"sky": "clear"' in result.replace(
            '":"', '": "'
        )
        hit = next(req for req in reversed(weather.requests) if req.path.startswith("/weather/"))
        assert hit.raw_path.startswith("/weather/S%C3%A3o%20Paulo")
        assert "units=metric" in hit.query and hit.headers["x-api-key"] == HTTP_SECRET
        task_id = _task_of(erin, body["id"], "w")
        executed = [
            e["data"]
            for e in _events(erin, aggregate=task_id)
            if e["type"] == "audit.tool_executed"
        ]
        assert executed[0]["source"] == "http" and executed[0]["http_tool_id"] == tool["id"]
        assert executed[0]["arguments"]["password"] == "***"


def test_a_skill_reaches_the_system_prompt(service: Orchestrator, llm: OpenAIFake) -> None:
    skill = f"house-style-{uuid.uuid4().hex[:6]}"
    body_text = f"Always answer in haiku ({skill})."
    with _user(service) as frank:
        r = frank.post(
            "/marketplace/publish",
            json={"name": skill, "description": "House style", "body": body_text},
        )
        assert r.status_code == 200, r.text
        body = _run(frank, [{"name": "s", "prompt": f"write {skill}", "skills": [skill]}])
        assert body["status"] == "completed", body
        assert body["steps"][0]["skills"][0]["version"] == 1
        systems = [
            m["content"]
            for req in llm.chat_requests
            for m in req.json.get("messages", [])
            if m.get("role") == "system" and skill in str(m.get("content"))
        ]
        assert systems and body_text in systems[-1]


def test_policies_deny_by_user_and_by_global_rule(
    service: Orchestrator, mcp: McpServerProcess
) -> None:
    server_name = f"guard{uuid.uuid4().hex[:6]}"
    with service.client() as admin, _user(service) as grace:
        _register(grace, server_name, mcp.url)
        r = grace.put("/tools/policy", json={"rules": [{"tool": "calculate", "action": "deny"}]})
        assert r.status_code == 200, r.text
        glob = f"mcp__{server_name}__*"
        before = admin.get("/tools/policy", params={"scope": "global"}).json()["rules"]
        r = admin.put(
            "/tools/policy",
            params={"scope": "global"},
            json={"rules": [*before, {"tool": glob, "action": "deny"}]},
        )
        assert r.status_code == 200, r.text
        try:
            # Her own allow cannot loosen the global deny.
            rules = [
                {"tool": "calculate", "action": "deny"},
                {"tool": f"mcp__{server_name}__echo", "action": "allow"},
            ]
            assert grace.put("/tools/policy", json={"rules": rules}).status_code == 200
            calls_before = len(mcp.calls())
            body = _run(
                grace,
                [
                    {"name": "calc", "prompt": '[tool calculate {"expression": "1+1"}]'},
                    {"name": "mcp", "prompt": f'[tool mcp__{server_name}__echo {{"text": "x"}}]'},
                ],
            )
            assert body["status"] == "completed", body
            calc, echoed = (s["result"] for s in body["steps"])
            assert "refused" in calc and "user policy" in calc
            assert "refused" in echoed and "global policy" in echoed
            assert len(mcp.calls()) == calls_before  # never reached the server
            for step in ("calc", "mcp"):
                task_id = _task_of(grace, body["id"], step)
                denied = [
                    e for e in _events(grace, aggregate=task_id) if e["type"] == "audit.tool_denied"
                ]
                assert len(denied) == 1, denied
            me = grace.get("/whoami").json()["user_uuid"]
            denials = [
                e["data"]
                for e in _events(grace, aggregate=me, types="audit.permission_deny")
                if e["data"]["permission"].startswith("tool:")
            ]
            assert {d["permission"] for d in denials} == {
                "tool:calculate",
                f"tool:mcp__{server_name}__echo",
            }
            grants = _events(grace, aggregate=me, types="audit.permission_grant")
            assert any(g["data"]["permission"] == f"tool:mcp__{server_name}__echo" for g in grants)
        finally:
            admin.put("/tools/policy", params={"scope": "global"}, json={"rules": before})


def _all_events(c: httpx.Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        page = _events(c, offset=len(out))
        out.extend(page)
        if len(page) < 1000:
            return out


def test_no_secret_of_the_run_in_any_event_or_log_line(
    service: Orchestrator, mcp: McpServerProcess, weather: WeatherApi
) -> None:
    """Every event and every log line of the service (its own output and every log of its
    Ray session: Serve's, the actors' and workers'), after a run that used each secret."""
    with _user(service) as heidi:
        _register(heidi, "secrets", mcp.url)
        # As a model would pass a credential it came by: the prompt does not hold it.
        arguments = _hidden({"text": "t", "token": ARG_SECRET})
        body = _run(heidi, [{"name": "s", "prompt": f"[tool mcp__secrets__echo {arguments}]"}])
        assert body["steps"][0]["result"] == "tool mcp__secrets__echo said: t", body
    # Each secret used here, whatever ran before (a test alone uses them all).
    test_a_shared_stdio_server_an_admin_registered(service)
    test_an_http_tool_in_a_workflow_step(service, weather)
    with service.client() as admin:
        everything = json.dumps(_all_events(admin))
    assert service.proc is not None
    session = _session_dir(service.proc.pid)
    logs = [service.work / "serve.log", *(p for p in (session / "logs").rglob("*") if p.is_file())]
    for secret in (MCP_SECRET.split()[-1], HTTP_SECRET, STDIO_SECRET, ARG_SECRET):
        assert secret not in everything, secret
        for path in logs:
            assert secret.encode() not in path.read_bytes(), (secret, path)
