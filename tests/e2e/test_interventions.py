"""Asking a person (issue 32) through the service the README starts (`scripts/serve`: Serve,
WorkflowShard and AgentWorker actors, embedded Postgres), against a loopback OpenAI-format
model and a user's HTTP tool on a loopback server that counts its calls, under an `ask` tool
policy rule. One service start (and one restart, the point of the test):

five workflows wait for people (a tool call to approve, one to reject, one left to expire,
an approval step to approve and one to reject); the service is stopped (SIGTERM) and
started again while they wait; then the decisions go through the API. The approved call ran
exactly once, the rejected and expired ones never, and the model was told why; the
approved approval step let its workflow complete, the rejected one failed it after
compensation."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_workflows import Orchestrator, agent_config, running
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e


class PayApi(LoopbackServer):
    """What the user's `pay` tool calls: counts payments, by amount."""

    label = "pay-api"

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        await self.send_json(send, 200, {"paid": request.json.get("amount")})


@pytest.fixture(scope="module")
def pay_api() -> Iterator[PayApi]:
    with PayApi() as server:
        yield server


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, pay_api: PayApi) -> Iterator[Orchestrator]:
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        work = tmp_path_factory.mktemp("interventions-e2e")
        settings = agent_config(
            llm,
            provider_retries=0,
            agent_workers=1,
            workflow_shards=1,
            outbound_allowed_cidrs=["127.0.0.0/8"],
        )
        with running(work, settings) as orch:
            yield orch


def _until(check: Any, within: float = 90.0) -> Any:
    deadline = time.monotonic() + within
    while not (found := check()):
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.3)
    return found


def _intervention_of(c: httpx.Client, workflow_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        r = c.get("/interventions", params={"workflow_id": workflow_id})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        return data[0] if data else None

    return dict(_until(found))


def _finished(c: httpx.Client, workflow_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = c.get(f"/workflows/{workflow_id}").json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    return dict(_until(done, 120))


def _create(c: httpx.Client, steps: list[dict[str, Any]]) -> str:
    r = c.post("/workflows", json={"name": "ask", "steps": steps})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _pay(amount: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": "pay", "prompt": f'[tool http__pay {{"amount": {amount}}}]', **extra}]


def _approval() -> list[dict[str, Any]]:
    return [
        {"name": "prepare", "prompt": "[answer READY]", "compensate": {"notify": "undo"}},
        {"name": "ok", "type": "approval", "prompt": "Ship {{prepare.result}}?"},
        {"name": "ship", "prompt": "[answer SHIPPED]"},
    ]


def test_decisions_after_a_restart(service: Orchestrator, pay_api: PayApi) -> None:
    with service.client() as c:
        tool = {
            "name": "pay",
            "description": "Pay an amount",
            "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}},
            "method": "POST",
            "url": f"{pay_api.url}/pay",
        }
        assert c.post("/tools/http", json=tool).status_code == 201
        rules = {"rules": [{"tool": "http__pay", "action": "ask"}]}
        assert c.put("/tools/policy", json=rules).status_code == 200
        approve = _create(c, _pay(1))
        reject = _create(c, _pay(2))
        expire = _create(c, _pay(3, approval_timeout_s=3))
        step_ok = _create(c, _approval())
        step_no = _create(c, _approval())
        asked = {w: _intervention_of(c, w) for w in (approve, reject, expire, step_ok, step_no)}
        assert all(iv["status"] in ("pending", "expired") for iv in asked.values())
        assert asked[step_ok]["question"] == "Ship READY?"
        assert pay_api.requests == []

    service.stop()
    service.start()

    with service.client() as c:
        r = c.post(f"/interventions/{asked[approve]['id']}/approve", json={"note": "fine"})
        assert r.status_code == 200, r.text
        r = c.post(f"/interventions/{asked[reject]['id']}/reject", json={"reason": "too much"})
        assert r.status_code == 200, r.text
        r = c.post(f"/interventions/{asked[step_ok]['id']}/approve", json={})
        assert r.status_code == 200, r.text
        r = c.post(f"/interventions/{asked[step_no]['id']}/reject", json={"reason": "not now"})
        assert r.status_code == 200, r.text
        final = {w: _finished(c, w) for w in asked}

        assert final[approve]["status"] == "completed", final[approve]
        assert final[approve]["steps"][0]["result"].startswith("tool http__pay said:")
        assert [r.json["amount"] for r in pay_api.requests] == [1]  # once, only the approved
        assert final[reject]["status"] == "completed", final[reject]
        assert "refused by a person: too much" in final[reject]["steps"][0]["result"]
        assert final[expire]["status"] == "completed", final[expire]
        assert "nobody decided in time" in final[expire]["steps"][0]["result"]
        expired = c.get(f"/interventions/{asked[expire]['id']}").json()
        assert expired["status"] == "expired" and expired["via"] == "timeout"

        assert final[step_ok]["status"] == "completed", final[step_ok]
        assert final[step_ok]["steps"][2]["result"] == "SHIPPED"
        assert final[step_no]["status"] == "failed", final[step_no]
        assert "rejected" in final[step_no]["steps"][1]["error"]
        trail = c.get("/events", params={"aggregate": step_no, "limit": 500}).json()["data"]
        steps = [(e["type"], e["data"].get("step")) for e in trail]
        assert ("workflow.compensating", "prepare") in steps
        assert steps[-1] == ("workflow.failed", "ok")
        health = c.get("/health").json()
        assert health["components"]["workers"]["active"] == 0
