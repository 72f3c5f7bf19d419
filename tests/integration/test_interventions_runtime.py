"""Waiting for a person at run time (issue 32): the real app under uvicorn (its in-process
engine, agent runner and sweep), real Postgres, a loopback OpenAI-format model steered by
the prompt (tests/fakes/agent_llm.py) and a user's HTTP tool on a loopback server that counts
its calls, under an `ask` tool policy rule.

- A call under `ask` parks the task: a pending intervention, the worker free (its active
  count back to 0), the workflow holding no claim and left alone by the sweep.
- Approved: the call runs exactly once and the workflow completes. Rejected: the model is
  told "refused by a person: <reason>" and goes on. Undecided past `approval_timeout_s`: the
  sweep expires it, the model is told, the workflow completes.
- The app stopped and a new one started on the same database: the decision there resumes.
- Two calls asked in one turn: each waits, each runs once.
- Approval steps: approved, the workflow goes on; rejected, the step fails and compensation
  runs. A cancel while parked closes the intervention. `notify` names a visible channel.
- The engine alone (a scripted agent): a parked workflow is never swept; decided, the sweep
  takes it without being told; a continuation lost with its worker is not sent again (the
  step's next attempt is).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from deployments.api import create_app
from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.interventions import Decider, InterventionStore
from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore
from tests.conftest import ADMIN_TOKEN, ServedApp, make_supervisor
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes.agent_llm import agent_reply, task_prompt
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "fake-agent"
PAY = '[tool http__pay {"amount": 5}]'


class PayApi(LoopbackServer):
    """The third-party API the user's `pay` tool calls: counts the payments."""

    label = "pay-api"

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        await self.send_json(send, 200, {"paid": len(self.requests)})


def reply(body: Any) -> FakeReply:
    """agent_reply, and `[two-pay]`: two calls of http__pay in one turn, then an answer
    quoting every tool result."""
    if "[two-pay]" in task_prompt(body):
        messages = body.get("messages", [])
        if messages and messages[-1].get("role") == "tool":
            said = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
            return FakeReply(text="both said: " + " | ".join(said))
        return FakeReply(
            tool_calls=[
                FakeToolCall("http__pay", {"amount": 1}),
                FakeToolCall("http__pay", {"amount": 2}),
            ]
        )
    return agent_reply(body)


class Service:
    """The app (restartable on the same database) with its HTTP client."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.app: Any = None
        self.served: ServedApp | None = None
        self.c: httpx.AsyncClient | None = None

    async def start(self) -> httpx.AsyncClient:
        self.app = create_app(self.settings)
        self.served = await ServedApp(self.settings, app=self.app).__aenter__()
        self.c = httpx.AsyncClient(base_url=f"{self.served.url}/api/v1", timeout=30)
        return self.c

    async def stop(self) -> None:
        if self.c is not None:
            await self.c.aclose()
        if self.served is not None:
            await self.served.__aexit__()
        self.c, self.served = None, None

    @property
    def active(self) -> int:
        """Tasks the app's in-process worker runs now."""
        return int(self.app.state.services.workflow_runner._dispatcher.active)


@pytest.fixture
async def pay_api() -> AsyncIterator[PayApi]:
    async with PayApi() as server:
        yield server


@pytest.fixture
async def service(make_settings: Any, pay_api: PayApi) -> AsyncIterator[Service]:
    async with OpenAIFake(api_key="sk-agent", default_reply=reply) as llm:
        settings = make_settings(
            providers={
                "openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}
            },
            default_model=MODEL,
            provider_retries=0,
            rate_limit_per_minute=0,
            outbound_allowed_cidrs=["127.0.0.0/8"],
            # A sweep (and an expiry round) about every half second.
            workflow_claim_ttl_ms=1500,
        )
        svc = Service(settings)
        c = await svc.start()
        try:
            tool = {
                "name": "pay",
                "description": "Pay an amount",
                "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}},
                "method": "POST",
                "url": f"{pay_api.url}/pay",
            }
            made = await c.post("/tools/http", headers=ADMIN, json=tool)
            assert made.status_code == 201, made.text
            rules = {"rules": [{"tool": "http__pay", "action": "ask"}]}
            put = await c.put("/tools/policy", headers=ADMIN, json=rules)
            assert put.status_code == 200, put.text
            yield svc
        finally:
            await svc.stop()


async def until(check: Callable[[], Awaitable[Any]], within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while not (found := await check()):
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.1)
    return found


async def create(c: httpx.AsyncClient, steps: list[dict[str, Any]], **extra: Any) -> str:
    r = await c.post("/workflows", headers=ADMIN, json={"name": "w", "steps": steps, **extra})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


async def pending(c: httpx.AsyncClient, workflow_id: str, n: int = 1) -> list[dict[str, Any]]:
    async def found() -> list[dict[str, Any]] | None:
        r = await c.get(
            "/interventions",
            headers=ADMIN,
            params={"workflow_id": workflow_id, "status": "pending"},
        )
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        return data if len(data) >= n else None

    return list(await until(found))


async def finished(c: httpx.AsyncClient, workflow_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        body = (await c.get(f"/workflows/{workflow_id}", headers=ADMIN)).json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    return dict(await until(done))


async def events(c: httpx.AsyncClient, aggregate: str) -> list[dict[str, Any]]:
    r = await c.get("/events", headers=ADMIN, params={"aggregate": aggregate, "limit": 500})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


async def parked(svc: Service, workflow_id: str) -> None:
    """The workflow waits: no task runs, no claim is held, the row names what it waits for."""
    c = svc.c
    assert c is not None

    conn = await asyncpg.connect(svc.settings.database_url)

    async def released() -> bool:
        row = await conn.fetchrow(
            "SELECT w.waiting_for, (SELECT count(*) FROM claims k WHERE k.kind = 'workflow'"
            " AND k.key = w.id) AS claims FROM workflows w WHERE w.id = $1",
            workflow_id,
        )
        return bool(row["waiting_for"]) and row["claims"] == 0 and svc.active == 0

    try:
        await until(released)
    finally:
        await conn.close()


async def test_an_asked_call_parks_and_runs_once_approved(
    service: Service, pay_api: PayApi
) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, [{"name": "pay", "prompt": PAY}, {"name": "after", "prompt": "x"}])
    [iv] = await pending(c, wid)
    assert iv["kind"] == "tool" and iv["tool"] == "http__pay" and iv["step"] == "pay"
    assert iv["arguments"] == {"amount": 5}
    await parked(service, wid)
    assert pay_api.requests == []
    body = (await c.get(f"/workflows/{wid}", headers=ADMIN)).json()
    assert body["status"] == "running" and body["steps"][0]["status"] == "running"
    assert body["steps"][0]["intervention"] == {
        "id": iv["id"],
        "kind": "tool",
        "status": "pending",
        "tool": "http__pay",
    }
    task_id = iv["task_id"]
    completed = [e for e in await events(c, task_id) if e["type"] == "worker.task_completed"]
    assert [e["data"]["status"] for e in completed] == ["waiting"]

    r = await c.post(f"/interventions/{iv['id']}/approve", headers=ADMIN, json={"note": "ok"})
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert len(pay_api.requests) == 1
    assert final["steps"][0]["result"].startswith("tool http__pay said:")
    assert final["steps"][0]["attempt"] == 1  # resumed under the same attempt
    trail = [e["type"] for e in await events(c, task_id)]
    assert trail.count("task.dispatched") == 2 and trail.count("audit.tool_executed") == 1
    assert trail.count("task.completed") == 1
    resumed = [e for e in await events(c, task_id) if e["type"] == "task.dispatched"][-1]
    assert resumed["data"]["resumed_from"] == iv["id"]
    again = await c.post(f"/interventions/{iv['id']}/approve", headers=ADMIN, json={})
    assert again.status_code == 409
    assert service.active == 0


async def test_a_rejected_call_is_refused_to_the_model(service: Service, pay_api: PayApi) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, [{"name": "pay", "prompt": PAY}])
    [iv] = await pending(c, wid)
    r = await c.post(
        f"/interventions/{iv['id']}/reject", headers=ADMIN, json={"reason": "too expensive"}
    )
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert "refused by a person: too expensive" in final["steps"][0]["result"]
    assert pay_api.requests == []
    denied = [e for e in await events(c, iv["task_id"]) if e["type"] == "audit.tool_denied"]
    assert [e["data"]["reason"] for e in denied] == ["rejected: too expensive"]


async def test_an_undecided_call_expires_by_the_sweep(service: Service, pay_api: PayApi) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, [{"name": "pay", "prompt": PAY, "approval_timeout_s": 1}])
    [iv] = await pending(c, wid)
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert "refused by a person: nobody decided in time" in final["steps"][0]["result"]
    assert pay_api.requests == []
    got = (await c.get(f"/interventions/{iv['id']}", headers=ADMIN)).json()
    assert got["status"] == "expired" and got["via"] == "timeout"


async def test_a_new_app_on_the_same_database_resumes(service: Service, pay_api: PayApi) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, [{"name": "pay", "prompt": PAY}])
    [iv] = await pending(c, wid)
    await parked(service, wid)
    await service.stop()
    c = await service.start()
    r = await c.post(f"/interventions/{iv['id']}/approve", headers=ADMIN, json={})
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert len(pay_api.requests) == 1


async def test_two_asked_calls_in_one_turn_each_wait_and_run_once(
    service: Service, pay_api: PayApi
) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, [{"name": "pay", "prompt": "[two-pay]"}])
    [first] = await pending(c, wid)
    assert first["arguments"] == {"amount": 1}
    r = await c.post(f"/interventions/{first['id']}/approve", headers=ADMIN, json={})
    assert r.status_code == 200, r.text

    async def second() -> dict[str, Any] | None:
        found = await pending(c, wid)
        return found[0] if found[0]["id"] != first["id"] else None

    nxt = await until(second)
    assert nxt["arguments"] == {"amount": 2} and nxt["task_id"] == first["task_id"]
    assert len(pay_api.requests) == 1
    r = await c.post(f"/interventions/{nxt['id']}/approve", headers=ADMIN, json={})
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert [r.json["amount"] for r in pay_api.requests] == [1, 2]
    assert final["steps"][0]["result"].count('"paid"') == 2


def _approval_flow() -> list[dict[str, Any]]:
    return [
        {"name": "prepare", "prompt": "[answer READY]", "compensate": {"notify": "undo"}},
        {"name": "ok", "type": "approval", "prompt": "Ship {{prepare.result}}?"},
        {"name": "ship", "prompt": "[answer SHIPPED]"},
    ]


async def test_an_approval_step_approved_goes_on(service: Service) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, _approval_flow())
    [iv] = await pending(c, wid)
    assert iv["kind"] == "approval" and iv["question"] == "Ship READY?"
    await parked(service, wid)
    r = await c.post(f"/interventions/{iv['id']}/approve", headers=ADMIN, json={"note": "go"})
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert final["steps"][1]["status"] == "completed"
    assert (
        final["steps"][1]["result"].startswith("approved by user:")
        and "go" in (final["steps"][1]["result"])
    )
    assert final["steps"][2]["result"] == "SHIPPED"


async def test_an_approval_step_rejected_fails_and_compensates(service: Service) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, _approval_flow())
    [iv] = await pending(c, wid)
    r = await c.post(f"/interventions/{iv['id']}/reject", headers=ADMIN, json={"reason": "no"})
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "failed", final
    assert final["steps"][1]["status"] == "failed" and "rejected" in final["steps"][1]["error"]
    assert final["steps"][2]["status"] == "skipped"
    types = [(e["type"], e["data"].get("step")) for e in await events(c, wid)]
    assert ("workflow.compensating", "prepare") in types
    assert types[-1] == ("workflow.failed", "ok")


async def test_a_cancel_while_parked_closes_the_intervention(service: Service) -> None:
    c = service.c
    assert c is not None
    wid = await create(c, [{"name": "pay", "prompt": PAY}])
    [iv] = await pending(c, wid)
    await parked(service, wid)
    r = await c.post(f"/workflows/{wid}/cancel", headers=ADMIN)
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "cancelled"
    got = (await c.get(f"/interventions/{iv['id']}", headers=ADMIN)).json()
    assert got["status"] == "rejected" and got["via"] == "cancel"


async def test_overrides_on_a_parked_workflow(service: Service, pay_api: PayApi) -> None:
    """A parked task step: resume is a 409 (it waits for a decision); retry closes the question
    (rejected via cancel) and the new attempt asks again; skip closes it and the workflow goes
    on. A parked approval step cannot be retried (a person decides it) but can be skipped."""
    c = service.c
    assert c is not None
    wid = await create(
        c, [{"name": "pay", "prompt": PAY}, {"name": "after", "prompt": "[answer OK]"}]
    )
    [first] = await pending(c, wid)
    await parked(service, wid)
    r = await c.post(f"/workflows/{wid}/resume", headers=ADMIN)
    assert r.status_code == 409 and r.json()["intervention_id"] == first["id"], r.text
    r = await c.post(f"/workflows/{wid}/steps/pay/retry", headers=ADMIN)
    assert r.status_code == 200, r.text
    closed = (await c.get(f"/interventions/{first['id']}", headers=ADMIN)).json()
    assert closed["status"] == "rejected" and closed["via"] == "cancel", closed

    async def asked_again() -> list[dict[str, Any]] | None:
        data = await pending(c, wid)
        return data if data[0]["id"] != first["id"] else None

    [second] = await until(asked_again)
    assert second["task_id"] != first["task_id"]  # a new attempt
    await parked(service, wid)
    r = await c.post(f"/workflows/{wid}/steps/pay/skip", headers=ADMIN)
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert final["status"] == "completed", final
    assert [s["status"] for s in final["steps"]] == ["skipped", "completed"]
    assert (await c.get(f"/interventions/{second['id']}", headers=ADMIN)).json()[
        "status"
    ] == "rejected"
    assert pay_api.requests == []  # nothing was paid: no one approved

    wid = await create(c, _approval_flow())
    [iv] = await pending(c, wid)
    r = await c.post(f"/workflows/{wid}/steps/ok/retry", headers=ADMIN)
    assert r.status_code == 409 and "approval step" in r.json()["error"], r.text
    r = await c.post(f"/workflows/{wid}/steps/ok/skip", headers=ADMIN)
    assert r.status_code == 200, r.text
    final = await finished(c, wid)
    assert [s["status"] for s in final["steps"]] == ["completed", "skipped", "completed"], final
    assert (await c.get(f"/interventions/{iv['id']}", headers=ADMIN)).json()["via"] == "cancel"
    overrides = [e["data"] for e in await events(c, wid) if e["type"] == "audit.workflow_override"]
    assert [(o["action"], o["step"]) for o in overrides] == [("skip", "ok")]


async def test_notify_names_a_visible_channel_with_approvers(service: Service) -> None:
    c = service.c
    assert c is not None
    steps = [{"name": "ok", "type": "approval", "prompt": "?", "notify": {"channel_id": "ch-9"}}]
    r = await c.post("/workflows", headers=ADMIN, json={"name": "w", "steps": steps})
    assert r.status_code == 400, r.text
    assert r.json()["fields"][0]["field"] == "steps[0].notify.channel_id"
    r = await c.post(
        "/workflows",
        headers=ADMIN,
        json={"name": "w", "steps": [{"name": "a", "prompt": "x"}], "notify": {"channel_id": "x"}},
    )
    assert r.status_code == 400 and r.json()["fields"][0]["field"] == "notify.channel_id"
    # A channel nobody on it may answer from: a 400 too, until it lists approvers.
    hook = {"callback_url": "http://127.0.0.1:9/hook"}
    made = await c.post(
        "/channels", headers=ADMIN, json={"type": "webhook", "name": "h", "config": hook}
    )
    assert made.status_code == 200, made.text
    channel = made.json()["data"]["id"]
    steps[0]["notify"] = {"channel_id": channel}
    r = await c.post("/workflows", headers=ADMIN, json={"name": "w", "steps": steps})
    assert r.status_code == 400 and "approvers" in r.json()["fields"][0]["message"], r.text
    put = await c.put(
        f"/channels/{channel}", headers=ADMIN, json={"config": {**hook, "approvers": ["ops"]}}
    )
    assert put.status_code == 200, put.text
    r = await c.post("/workflows", headers=ADMIN, json={"name": "w", "steps": steps})
    assert r.status_code == 200, r.text
    # A Slack channel with approvers but nowhere to post a question.
    slack = {"signing_secret": "s" * 32, "bot_token": "xoxb-1", "approvers": ["U1"]}
    made = await c.post(
        "/channels", headers=ADMIN, json={"type": "slack", "name": "s", "config": slack}
    )
    assert made.status_code == 200, made.text
    steps[0]["notify"] = {"channel_id": made.json()["data"]["id"]}
    r = await c.post("/workflows", headers=ADMIN, json={"name": "w", "steps": steps})
    assert r.status_code == 400 and "config.notify_channel" in r.json()["error"], r.text


# --- the engine alone: parked, swept once decided, a lost continuation -----------------------


class _Agent:
    """Agent work standing in for the runner: attempt 1 of step `s` asks (creates its
    intervention as the runner does, and answers `waiting`); its continuation is lost (the
    dispatcher raises, as when the worker running it died); any other attempt completes."""

    def __init__(self, interventions: InterventionStore, events: EventStore) -> None:
        self.interventions = interventions
        self.events = events
        self.dispatched: list[tuple[str, str | None]] = []

    async def run(self, task: AgentTask) -> TaskResult:
        self.dispatched.append((task.task_id, task.resume))
        assert task.workflow_id is not None and task.step is not None
        if task.task_id.endswith(":s:1"):
            if task.resume is not None:
                raise ConnectionError("agent-worker-0 died running the continuation")
            assert task.can_wait
            async with self.events.transaction() as tx:
                iv = await self.interventions.create_in(
                    tx,
                    task_id=task.task_id,
                    workflow_id=task.workflow_id,
                    step=task.step,
                    user_uuid=task.user_uuid,
                    kind="tool",
                    tool="http__pay",
                    arguments={"amount": 5},
                    question="Run http__pay?",
                    checkpoint=b"sealed",
                )
            return TaskResult(task.task_id, "waiting", None, None, 5, "w", 1, iv.id)
        return TaskResult(task.task_id, "completed", f"done {task.step}", None, 5, "w")


async def test_parked_is_never_swept_decided_is_and_a_lost_continuation_is_not_resent(
    make_settings: Any,
) -> None:
    settings = make_settings(
        workflow_claim_ttl_ms=1500, workflow_retry_base_ms=20, workflow_retry_max_ms=50
    )
    db = await connect(settings.database_url)
    events = EventStore(db.pool)
    store = WorkflowStore(db.pool, events)
    interventions = InterventionStore(db.pool, events)
    agent = _Agent(interventions, events)
    engine = WorkflowEngine(
        store, agent, settings, supervisor=make_supervisor(), interventions=interventions
    )
    try:
        spec = WorkflowSpec.parse("w", [{"name": "s", "prompt": "p"}, {"name": "t", "prompt": "q"}])
        wid = await store.create(spec, "ann")
        await engine.start(wid)

        async def waiting() -> Any:
            record = await store.load(wid)
            assert record is not None
            return record if record.waiting_for and engine.running_count() == 0 else None

        record = await until(waiting)
        held = await interventions.load(record.waiting_for)
        assert held is not None and held.pending
        # Parked: no live claim, and no sweep takes it (several periods).
        for _ in range(3):
            assert await engine.sweep() == 0
            await asyncio.sleep(0.5)
        assert agent.dispatched == [(f"{wid}:s:1", None)]

        # Decided, without anyone starting it: the sweep takes it within a period.
        decided = await interventions.decide(held.id, Decider(user_uuid="ann"), approve=True)
        assert decided.woke
        final = await engine.wait(wid, within=30)
        assert str(final.status) == "completed", final
        # The continuation went once; lost with its worker, it was not sent again: attempt 2.
        assert agent.dispatched == [
            (f"{wid}:s:1", None),
            (f"{wid}:s:1", held.id),
            (f"{wid}:s:2", None),
            (f"{wid}:t:1", None),
        ]
        history = final.steps[0].attempt_history()
        assert [(a["attempt"], bool(a.get("lost"))) for a in history] == [(1, True), (2, False)]
        assert not await interventions.take_resume(held.id)  # taken once, for good
    finally:
        await engine.shutdown()
        await db.close()
