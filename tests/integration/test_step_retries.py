"""Step retries (issue 32). Over HTTP (the app under uvicorn with its in-process engine and
agent runtime, real Postgres) against a loopback OpenAI-format model that fails twice, then
answers: a step allowed 3 attempts completes, its 2 failed attempts in GET /workflows/{id} and
in the events; allowed 2 it fails (compensation as for any failure); bad `retry` is a 400.
With engines in this process standing in for shards (real Postgres): the wait for the next
attempt survives the shard (the next driver waits out what is left: it neither skips the
wait nor starts again from attempt 1), and an attempt lost with its worker is never sent
again: the next attempt is, and the lost one's late answer is refused."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import Database, connect
from orchestrator.events import EventStore
from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore
from tests.conftest import ADMIN_TOKEN, ServedApp, make_supervisor
from tests.fakes.agent_llm import agent_reply, task_prompt
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.integration.test_workflows_api import agent_settings, create, events, finished

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class FailsTwice:
    """The model's replies (`default_reply`): a step whose prompt holds `[flaky KEY]` gets
    OpenAI's 503 error the first two times it asks (the gateway does not retry it here:
    provider_retries=0), then the usual answer (tests/fakes/agent_llm.py)."""

    def __init__(self) -> None:
        self.asked: collections.Counter[str] = collections.Counter()

    def __call__(self, body: Any) -> FakeReply:
        found = re.search(r"\[flaky (\S+)\]", task_prompt(body))
        if found is not None:
            self.asked[found[1]] += 1
            if self.asked[found[1]] <= 2:
                return FakeReply.server_error(503, "The server is overloaded")
        return agent_reply(body)


@pytest.fixture
def model() -> FailsTwice:
    return FailsTwice()


@pytest.fixture
async def llm(model: FailsTwice) -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=model) as server:
        yield server


@pytest.fixture
async def api(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[httpx.AsyncClient]:
    async with ServedApp(agent_settings(make_settings, llm)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


def _flaky(attempts: int, backoff_ms: int = 1000) -> dict[str, Any]:
    return {
        "name": "flaky",
        "steps": [
            {"name": "setup", "prompt": "[answer SET]", "compensate": {"notify": "undo setup"}},
            {
                "name": "fetch",
                "prompt": "[flaky fetch] [answer FETCHED]",
                "retry": {
                    "max_attempts": attempts,
                    "backoff_ms": backoff_ms,
                    "max_backoff_ms": backoff_ms,
                },
            },
            {"name": "after", "prompt": "use {{fetch.result}}"},
        ],
    }


async def _while_running(api: httpx.AsyncClient, wid: str, within: float = 30) -> dict[str, Any]:
    """The workflow's detail as soon as its `fetch` step waits for its next attempt."""
    deadline = time.monotonic() + within
    while True:
        body: dict[str, Any] = (await api.get(f"/workflows/{wid}", headers=ADMIN)).json()
        step = body["steps"][1]
        if "next_attempt_at" in step or body["status"] not in ("pending", "running"):
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.02)


async def test_a_step_failing_twice_completes_on_its_third_attempt(
    api: httpx.AsyncClient, model: FailsTwice
) -> None:
    wid = await create(api, ADMIN, **_flaky(3))
    waiting = await _while_running(api, wid)
    step = waiting["steps"][1]
    assert waiting["status"] == "running" and step["status"] == "running", waiting
    assert step["attempt"] == 1 and "model call failed" in step["error"]
    assert [a["attempt"] for a in step["attempts"]] == [1]
    assert step["next_attempt_at"] > step["attempts"][0]["ended_at"]

    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed", body
    fetch = body["steps"][1]
    assert fetch["status"] == "completed" and fetch["result"] == "FETCHED"
    assert fetch["attempt"] == 3 and "error" not in fetch and "next_attempt_at" not in fetch
    tried = fetch["attempts"]
    assert [a["attempt"] for a in tried] == [1, 2, 3]
    assert all("model call failed" in a["error"] for a in tried[:2])
    assert "error" not in tried[2] and tried[2]["ended_at"] >= tried[2]["started_at"]
    assert body["steps"][2]["result"] == "done: use FETCHED"
    assert [a["attempt"] for a in body["steps"][0]["attempts"]] == [1]
    assert model.asked["fetch"] == 3  # the model saw three tries of the step, no more

    got = await events(api, wid)
    of_fetch = [
        (e["type"], e["data"].get("attempt")) for e in got if e["data"].get("step") == "fetch"
    ]
    assert of_fetch == [
        ("workflow.step_started", 1),
        ("workflow.step_retrying", 1),
        ("workflow.step_started", 2),
        ("workflow.step_retrying", 2),
        ("workflow.step_started", 3),
        ("workflow.step_completed", 3),
    ]
    retrying = [e["data"] for e in got if e["type"] == "workflow.step_retrying"]
    assert [(d["next_attempt"], d["max_attempts"]) for d in retrying] == [(2, 3), (3, 3)]
    assert all(500 <= d["delay_ms"] <= 1000 and "model call failed" in d["error"] for d in retrying)
    assert not any(e["type"] == "workflow.step_failed" for e in got)
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    # Each attempt is its own task, sent once.
    for n in (1, 2, 3):
        dispatched = [
            e for e in await events(api, f"{wid}:fetch:{n}") if e["type"] == "task.dispatched"
        ]
        assert len(dispatched) == 1, n


async def test_the_last_failure_fails_the_step_and_compensation_runs(
    api: httpx.AsyncClient, model: FailsTwice
) -> None:
    wid = await create(api, ADMIN, **_flaky(2, backoff_ms=50))
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed", body
    fetch = body["steps"][1]
    assert fetch["status"] == "failed" and fetch["attempt"] == 2
    assert [a["attempt"] for a in fetch["attempts"]] == [1, 2]
    assert all("model call failed" in a["error"] for a in fetch["attempts"])
    assert body["steps"][2]["status"] == "skipped"
    assert "step fetch failed" in body["error"]
    types = [(e["type"], e["data"].get("step")) for e in await events(api, wid)]
    assert types[types.index(("workflow.step_started", "fetch")) :] == [
        ("workflow.step_started", "fetch"),
        ("workflow.step_retrying", "fetch"),
        ("workflow.step_started", "fetch"),
        ("workflow.step_failed", "fetch"),
        ("workflow.compensating", "fetch"),
        ("workflow.compensating", "setup"),
        ("workflow.failed", "fetch"),
    ]
    failed = next(e for e in await events(api, wid) if e["type"] == "workflow.step_failed")
    assert failed["data"]["attempt"] == 2
    assert model.asked["fetch"] == 2


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"max_attempts": 0}, "steps[0].retry.max_attempts"),
        ({"max_attempts": 11}, "steps[0].retry.max_attempts"),
        ({"max_attempts": 3, "backoff_ms": -1}, "steps[0].retry.backoff_ms"),
        ({"max_backoff_ms": -1}, "steps[0].retry.max_backoff_ms"),
        ({"backoff_ms": 2000, "max_backoff_ms": 1000}, "steps[0].retry.max_backoff_ms"),
        ({"attempts": 3}, "steps[0].retry.attempts"),
    ],
)
async def test_bad_retries_are_400_naming_the_field(
    api: httpx.AsyncClient, retry: dict[str, Any], field: str
) -> None:
    body = {"name": "w", "steps": [{"name": "s", "prompt": "p", "retry": retry}]}
    for path in ("/workflows", "/workflows/templates"):
        r = await api.post(path, headers=ADMIN, json=body)
        assert r.status_code == 400, r.text
        error = r.json()
        assert error["ok"] is False and error["code"] == "validation_error"
        assert error["error"].startswith(f"{field}: ") and error["request_id"]
        assert error["fields"][0]["field"] == field


# --- the durable runtime: engines standing in for shards -------------------------------------


class _Agent:
    """Agent work by task id `<wf>:<step>:<attempt>`: the attempts named in `fail` (as
    `<step>:<attempt>`) end as failed task results, those in `lose` never answer (the
    dispatcher raises, as when the worker running them died: AttemptLost). Every dispatch is
    counted, with its time."""

    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.lose: set[str] = set()
        self.dispatched: collections.Counter[str] = collections.Counter()
        self.at: dict[str, int] = {}
        self.seen = asyncio.Event()

    async def run(self, task: AgentTask) -> TaskResult:
        self.dispatched[task.task_id] += 1
        self.at[task.task_id] = int(time.time() * 1000)
        self.seen.set()
        attempt = task.task_id.split(":", 1)[1]  # "<step>:<attempt>"
        if attempt in self.lose:
            raise ConnectionError(f"agent-worker-0 died running {task.task_id}")
        if attempt in self.fail:
            return TaskResult(task.task_id, "failed", None, "model call failed: 503", 5, "w")
        return TaskResult(task.task_id, "completed", f"done {task.step}", None, 5, "w")


@pytest.fixture
async def db(make_settings: Any) -> AsyncIterator[Database]:
    database = await connect(make_settings().database_url)
    yield database
    await database.close()


def _spec(retry: dict[str, int] | None) -> WorkflowSpec:
    step: dict[str, Any] = {"name": "s", "prompt": "p"}
    if retry is not None:
        step["retry"] = retry
    return WorkflowSpec.parse("w", [step, {"name": "t", "prompt": "q"}])


async def _until(check: Any, within: float = 20) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.02)


async def test_the_wait_for_the_next_attempt_survives_the_shard(
    make_settings: Any, db: Database
) -> None:
    """The first attempt fails; while the step waits for its second, its shard goes (a
    drain: the driver stops waiting at once, dispatching nothing). Another engine takes the
    workflow up and waits out what is left of the stored wait: the second attempt is sent
    once, not before it was due, and the first is never sent again."""
    settings = make_settings(workflow_claim_ttl_ms=60_000)
    store = WorkflowStore(db.pool, EventStore(db.pool))
    agent = _Agent()
    agent.fail.add("s:1")
    first = WorkflowEngine(store, agent, settings, owner="gen-a/0", supervisor=make_supervisor())
    second = WorkflowEngine(store, agent, settings, owner="gen-b/0", supervisor=make_supervisor())
    try:
        wid = await store.create(
            _spec({"max_attempts": 3, "backoff_ms": 3000, "max_backoff_ms": 3000}), "ann"
        )
        await first.start(wid)

        async def waiting() -> Any:
            record = await store.load(wid)
            assert record is not None
            return record if record.steps[0].waiting else None

        before = await _until(waiting)
        due = before.steps[0].retry_at
        await first.shutdown(drain_s=30)  # returns once its driver stopped waiting
        assert agent.dispatched[f"{wid}:s:2"] == 0
        after = await store.load(wid)
        assert after is not None and after.steps[0].retry_at == due and after.steps[0].waiting

        assert await second.resume_unfinished() == 1
        final = await second.wait(wid, within=30)
        assert str(final.status) == "completed"
        assert agent.dispatched == {f"{wid}:s:1": 1, f"{wid}:s:2": 1, f"{wid}:t:1": 1}
        # Not before it was due (the stored time, by the database's clock: this host's).
        assert agent.at[f"{wid}:s:2"] >= due - 50
        step = final.steps[0]
        assert step.attempt == 2 and step.retry_at is None
        assert [a["attempt"] for a in step.attempt_history()] == [1, 2]
        assert not any(a.get("lost") for a in step.attempt_history())
    finally:
        await first.shutdown()
        await second.shutdown()


async def test_an_attempt_lost_with_its_worker_is_not_sent_again(
    make_settings: Any, db: Database
) -> None:
    """The worker running attempt 1 dies (the dispatcher raises). That attempt is never
    sent again; attempt 2 is, at once, and is not charged to `max_attempts` (a loss is not
    the task's failure: a step without retry completes too). A late answer of attempt 1
    is refused."""
    settings = make_settings(workflow_retry_base_ms=20, workflow_retry_max_ms=50)
    store = WorkflowStore(db.pool, EventStore(db.pool))
    agent = _Agent()
    agent.lose.add("s:1")
    engine = WorkflowEngine(store, agent, settings, supervisor=make_supervisor())
    try:
        for retry in (None, {"max_attempts": 2, "backoff_ms": 10}):
            wid = await store.create(_spec(retry), "ann")
            await engine.start(wid)
            final = await engine.wait(wid, within=30)
            assert str(final.status) == "completed", final
            assert agent.dispatched[f"{wid}:s:1"] == 1 and agent.dispatched[f"{wid}:s:2"] == 1
            assert f"{wid}:s:3" not in agent.dispatched
            history = final.steps[0].attempt_history()
            assert [(a["attempt"], bool(a.get("lost"))) for a in history] == [(1, True), (2, False)]
            assert history[0]["error"].startswith("lost:")
            started = await db.pool.fetch(
                "SELECT data->>'attempt' AS attempt, data->>'lost_attempt' AS lost FROM events"
                " WHERE type = 'workflow.step_started' AND aggregate_id = $1"
                " AND data->>'step' = 's' ORDER BY seq",
                wid,
            )
            assert [(r["attempt"], r["lost"]) for r in started] == [("1", None), ("2", "1")]
            retried = await db.pool.fetchval(
                "SELECT count(*) FROM events WHERE aggregate_id = $1"
                " AND type IN ('workflow.step_retrying', 'workflow.step_failed')",
                wid,
            )
            assert retried == 0
            # The lost attempt's answer, arriving late, is not applied.
            key = f"{wid}:s:1"
            assert await store.fail_attempt(wid, 0, key, error="late", duration_ms=1) is None
            assert not await store.finish_step(
                wid, 0, key, ok=True, result="late", error=None, duration_ms=1, next_cursor=1
            )
            again = await store.load(wid)
            assert again is not None and again.steps[0].result == "done s"
    finally:
        await engine.shutdown()
