"""Workflow overrides and re-run (issue 32) over HTTP: the app under uvicorn with its
in-process engine and agent runtime, real Postgres, a loopback OpenAI-format model that the
test breaks and mends per step. Retry, skip and resume of a failed workflow, retry of a
stuck running step, re-run from a step (earlier results kept, the model not asked for them
again), `audit.workflow_override` with who acted, 404 for another user, 409 for a state an
action does not apply to, and concurrent overrides of which exactly one wins."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator.sdk import ApiError, AsyncClient
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply, task_prompt
from tests.fakes.openai_server import FakeReply, OpenAIFake
from tests.integration.test_workflows_api import agent_settings, create, events, finished, user

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TAG = re.compile(r"\[(tag|broken|stuck) (\S+)\]")


class Scripted:
    """The model's replies: a step's own prompt with `[tag K]` is counted under K;
    `[broken K]` is an OpenAI 400 while K is in `broken`; `[stuck K]` answers only after
    STUCK_S while K is in `stuck`; otherwise tests/fakes/agent_llm.py answers."""

    STUCK_S = 12.0

    def __init__(self) -> None:
        self.asked: collections.Counter[str] = collections.Counter()
        self.broken: set[str] = set()
        self.stuck: set[str] = set()

    def __call__(self, body: Any) -> FakeReply:
        prompt = task_prompt(body)
        for kind, key in TAG.findall(prompt):
            if kind == "tag":
                self.asked[key] += 1
            if kind == "broken" and key in self.broken:
                return FakeReply(
                    status=400,
                    error={"message": "scripted failure", "type": "invalid_request_error"},
                )
            if kind == "stuck" and key in self.stuck:
                reply = agent_reply(body)
                return FakeReply(text=reply.text, delay_s=self.STUCK_S)
        return agent_reply(body)


@pytest.fixture
def model() -> Scripted:
    return Scripted()


@pytest.fixture
async def llm(model: Scripted) -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=model) as server:
        yield server


@pytest.fixture
async def served(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[ServedApp]:
    async with ServedApp(agent_settings(make_settings, llm)) as app:
        yield app


@pytest.fixture
async def api(served: ServedApp) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
        yield client


def three_steps() -> dict[str, Any]:
    """setup, then fetch (broken while "fetch" is), then after (uses fetch's result)."""
    return {
        "name": "three",
        "steps": [
            {
                "name": "setup",
                "prompt": "[tag setup] [answer SET]",
                "compensate": {"notify": "undo setup"},
            },
            {"name": "fetch", "prompt": "[tag fetch] [broken fetch] [answer FETCHED]"},
            {"name": "after", "prompt": "[tag after] use <{{fetch.result}}>"},
        ],
    }


async def failed_at_fetch(
    api: httpx.AsyncClient, model: Scripted, h: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    model.broken.add("fetch")
    wid = await create(api, h, **three_steps())
    body = await finished(api, h, wid)
    assert body["status"] == "failed", body
    assert [s["status"] for s in body["steps"]] == ["completed", "failed", "skipped"]
    return wid, body


def overrides(got: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit.workflow_override data, without the catalog's optional fields left out."""
    return [
        {k: v for k, v in e["data"].items() if v is not None}
        for e in got
        if e["type"] == "audit.workflow_override"
    ]


def conflict(r: httpx.Response, status: str) -> dict[str, Any]:
    assert r.status_code == 409, r.text
    body: dict[str, Any] = r.json()
    assert body["ok"] is False and body["code"] == "conflict" and body["status"] == status
    assert body["request_id"] and body["error"]
    return body


async def test_retry_the_failed_step_completes_the_workflow(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    alice = await user(api, "alice-over")
    wid, failed = await failed_at_fetch(api, model, alice)
    assert failed["steps"][1]["attempt"] == 1
    model.broken.clear()

    r = await api.post(
        f"/workflows/{wid}/steps/fetch/retry", headers=alice, json={"reason": "provider back"}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "ok": True,
        "id": wid,
        "status": "running",
        "action": "retry",
        "step": "fetch",
    }
    body = await finished(api, alice, wid)
    assert body["status"] == "completed", body
    assert body["error"] is None
    setup, fetch, after = body["steps"]
    assert setup["result"] == "SET" and fetch["result"] == "FETCHED"
    assert after["result"] == "done: [tag after] use <FETCHED>"
    # A new run of the step: its attempt numbers go on (a new task id), its count afresh.
    assert fetch["attempt"] == 2 and [a["attempt"] for a in fetch["attempts"]] == [2]
    assert model.asked == {"setup": 1, "fetch": 2, "after": 1}  # setup was not run again

    got = await events(api, wid, alice)  # the owner sees the override on their workflow
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    (override,) = overrides(got)
    assert override == {
        "workflow_id": wid,
        "action": "retry",
        "step": "fetch",
        "user_uuid": "alice-over",
        "previous_status": "failed",
        "reason": "provider back",
    }
    types = [e["type"] for e in got]
    after_override = types[types.index("audit.workflow_override") :]
    assert after_override == [
        "audit.workflow_override",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.step_started",
        "workflow.step_completed",
        "workflow.completed",
    ]
    started = [e["data"] for e in got if e["type"] == "workflow.step_started"]
    assert [(d["step"], d["attempt"]) for d in started] == [
        ("setup", 1),
        ("fetch", 1),
        ("fetch", 2),
        ("after", 1),
    ]
    # The compensation that ran when it failed is not run again.
    assert types.count("workflow.failed") == 1
    assert types.count("workflow.compensating") == 2


async def test_skip_the_failed_step_gives_later_steps_an_empty_result(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    alice = await user(api, "alice-skip")
    wid, _ = await failed_at_fetch(api, model, alice)

    r = await api.post(f"/workflows/{wid}/steps/fetch/skip", headers=alice)
    assert r.status_code == 200 and r.json()["action"] == "skip", r.text
    body = await finished(api, alice, wid)
    assert body["status"] == "completed", body
    assert [s["status"] for s in body["steps"]] == ["completed", "skipped", "completed"]
    assert "result" not in body["steps"][1]
    assert body["steps"][2]["result"] == "done: [tag after] use <>"
    assert model.asked == {"setup": 1, "fetch": 1, "after": 1}
    (override,) = overrides(await events(api, wid))
    assert override["action"] == "skip" and override["step"] == "fetch"


async def test_resume_by_an_admin_and_another_user_gets_404(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    alice = await user(api, "alice-resume")
    mallory = await user(api, "mallory-resume")
    wid, _ = await failed_at_fetch(api, model, alice)

    for path, body in (
        (f"/workflows/{wid}/steps/fetch/retry", None),
        (f"/workflows/{wid}/steps/fetch/skip", None),
        (f"/workflows/{wid}/resume", None),
        (f"/workflows/{wid}/rerun", {"from_step": "fetch"}),
    ):
        r = await api.post(path, headers=mallory, json=body)
        assert r.status_code == 404 and r.json()["code"] == "not_found", (path, r.text)
    # Unknown step in the path: 404; in the body (rerun's from_step): 400 naming the field.
    r = await api.post(f"/workflows/{wid}/steps/nope/retry", headers=alice)
    assert r.status_code == 404 and "no step 'nope'" in r.json()["error"], r.text
    r = await api.post(f"/workflows/{wid}/rerun", headers=alice, json={"from_step": "nope"})
    assert r.status_code == 400, r.text
    assert r.json()["fields"][0]["field"] == "from_step"
    # Not the step it failed at.
    bad = conflict(await api.post(f"/workflows/{wid}/steps/setup/retry", headers=alice), "failed")
    assert bad["step_status"] == "completed" and "failed at step fetch" in bad["error"]
    # A re-run cannot keep a result the failed step never had.
    r = await api.post(f"/workflows/{wid}/rerun", headers=alice, json={"from_step": "after"})
    assert conflict(r, "failed")["step_status"] == "failed"
    assert overrides(await events(api, wid)) == []  # nothing refused was recorded

    model.broken.clear()
    r = await api.post(f"/workflows/{wid}/resume", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["step"] == "fetch" and r.json()["action"] == "resume"
    assert (await finished(api, alice, wid))["status"] == "completed"
    (override,) = overrides(await events(api, wid))
    assert override["action"] == "resume" and override["step"] == "fetch"
    assert override["user_uuid"] != "alice-resume"  # the admin acted

    # Completed now: nothing applies but a re-run.
    for path in (f"/workflows/{wid}/steps/fetch/retry", f"/workflows/{wid}/resume"):
        conflict(await api.post(path, headers=alice), "completed")


async def test_a_cancelled_workflow_cannot_be_resumed(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    model.stuck.add("wait")
    wid = await create(
        api, ADMIN, name="c", steps=[{"name": "wait", "prompt": "[stuck wait] [answer W]"}]
    )
    # A running workflow cannot be re-run (it is not finished).
    await running_step(api, wid, 0)
    r = await api.post(f"/workflows/{wid}/rerun", headers=ADMIN, json={"from_step": "wait"})
    conflict(r, "running")
    r = await api.post(f"/workflows/{wid}/cancel", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    body = conflict(await api.post(f"/workflows/{wid}/resume", headers=ADMIN), "cancelled")
    assert "cannot be resumed" in body["error"]
    conflict(await api.post(f"/workflows/{wid}/steps/wait/skip", headers=ADMIN), "cancelled")


async def test_concurrent_overrides_one_wins(api: httpx.AsyncClient, model: Scripted) -> None:
    wid, _ = await failed_at_fetch(api, model, ADMIN)
    model.broken.clear()
    paths = [
        f"/workflows/{wid}/steps/fetch/skip",
        f"/workflows/{wid}/steps/fetch/retry",
        f"/workflows/{wid}/steps/fetch/skip",
        f"/workflows/{wid}/steps/fetch/retry",
    ]
    answers = await asyncio.gather(*(api.post(p, headers=ADMIN) for p in paths))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 409, 409, 409], [r.text for r in answers]
    for r in answers:
        if r.status_code == 409:
            assert r.json()["status"] == "running", r.text
    assert (await finished(api, ADMIN, wid))["status"] == "completed"
    assert len(overrides(await events(api, wid))) == 1


async def running_step(
    api: httpx.AsyncClient, wid: str, idx: int, within: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        body: dict[str, Any] = (await api.get(f"/workflows/{wid}", headers=ADMIN)).json()
        if body["steps"][idx]["status"] == "running":
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)


async def test_retry_a_stuck_running_step(api: httpx.AsyncClient, model: Scripted) -> None:
    model.stuck.add("slow")
    wid = await create(
        api,
        ADMIN,
        name="stuck",
        steps=[
            {"name": "slow", "prompt": "[tag slow] [stuck slow] [answer UNSTUCK]"},
            {"name": "next", "prompt": "[tag next] after {{slow.result}}"},
        ],
    )
    await running_step(api, wid, 0)
    # Only the running step of a running workflow can be retried.
    bad = conflict(await api.post(f"/workflows/{wid}/steps/next/retry", headers=ADMIN), "running")
    assert bad["step_status"] == "pending"
    model.stuck.clear()
    started = time.monotonic()
    r = await api.post(f"/workflows/{wid}/steps/slow/retry", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = await finished(api, ADMIN, wid)
    # The new attempt answered at once: the abandoned one's answer was not waited for.
    assert time.monotonic() - started < Scripted.STUCK_S - 2
    assert body["status"] == "completed", body
    slow = body["steps"][0]
    assert slow["result"] == "UNSTUCK" and slow["attempt"] == 2
    first, second = slow["attempts"]
    assert first["attempt"] == 1 and first["lost"] is True
    assert first["error"].startswith("abandoned by an override (retry)")
    assert second["attempt"] == 2 and "error" not in second
    assert body["steps"][1]["result"] == "done: [tag next] after UNSTUCK"
    got = await events(api, wid)
    of_slow = [
        (e["type"], e["data"].get("attempt"))
        for e in got
        if e["data"].get("step") == "slow" and e["type"].startswith("workflow.")
    ]
    assert of_slow == [
        ("workflow.step_started", 1),
        ("workflow.step_started", 2),
        ("workflow.step_completed", 2),
    ]
    (override,) = overrides(got)
    assert override["previous_status"] == "running" and override["action"] == "retry"


async def test_skip_a_stuck_running_step(api: httpx.AsyncClient, model: Scripted) -> None:
    model.stuck.add("slow")
    wid = await create(
        api,
        ADMIN,
        name="stuck-skip",
        steps=[
            {"name": "slow", "prompt": "[tag slow] [stuck slow] [answer LATE]"},
            {"name": "next", "prompt": "[tag next] after <{{slow.status}}>"},
        ],
    )
    await running_step(api, wid, 0)
    r = await api.post(f"/workflows/{wid}/steps/slow/skip", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed", body
    assert body["steps"][0]["status"] == "skipped" and "result" not in body["steps"][0]
    assert body["steps"][1]["result"] == "done: [tag next] after <skipped>"
    assert model.asked["slow"] == 1


async def test_rerun_keeps_earlier_results(api: httpx.AsyncClient, model: Scripted) -> None:
    alice = await user(api, "alice-rerun")
    steps = [
        {"name": "a", "prompt": "[tag a] [answer ALPHA]"},
        {"name": "b", "prompt": "[tag b] [answer BETA-from-{{a.result}}]"},
        {"name": "c", "prompt": "[tag c] then {{b.result}}"},
    ]
    wid = await create(api, alice, name="chain", steps=steps)
    first = await finished(api, alice, wid)
    assert first["status"] == "completed", first

    r = await api.post(f"/workflows/{wid}/rerun", headers=alice, json={"from_step": "b"})
    assert r.status_code == 200, r.text
    again = r.json()
    assert again["rerun_of"] == wid and again["from_step"] == "b" and again["id"] != wid
    body = await finished(api, alice, again["id"])
    assert body["status"] == "completed", body
    assert body["rerun_of"] == wid and "rerun_of" not in first
    assert [s["result"] for s in body["steps"]] == [s["result"] for s in first["steps"]]
    assert body["steps"][1]["result"] == "BETA-from-ALPHA"  # b saw the kept result of a
    assert "attempt" not in body["steps"][0]  # kept, not run
    assert model.asked == {"a": 1, "b": 2, "c": 2}  # the model was not asked for a again
    # The new workflow's own events start with its start, from step b; the original's
    # stream records the re-run.
    types = [e["type"] for e in await events(api, again["id"], alice)]
    assert types[:2] == ["workflow.started", "workflow.step_started"]
    started = [
        e["data"]["step"]
        for e in await events(api, again["id"], alice)
        if e["type"] == "workflow.step_started"
    ]
    assert started == ["b", "c"]
    (override,) = overrides(await events(api, wid, alice))
    assert override["action"] == "rerun" and override["step"] == "b"
    assert override["rerun_id"] == again["id"] and override["user_uuid"] == "alice-rerun"
    listed = (await api.get("/workflows", headers=alice)).json()["data"]
    assert {w["id"] for w in listed} == {wid, again["id"]}


async def test_sdk_overrides(served: ServedApp, api: httpx.AsyncClient, model: Scripted) -> None:
    """retry_step, skip_step, resume_workflow, rerun_workflow (the sync client is generated
    from the same code: scripts/unasync_sdk.py)."""
    wid, _ = await failed_at_fetch(api, model, ADMIN)
    model.broken.clear()
    async with AsyncClient(served.url, token=ADMIN_TOKEN) as sdk:
        with pytest.raises(ApiError) as caught:
            await sdk.skip_step(wid, "setup")
        assert caught.value.status == 409
        done = await sdk.retry_step(wid, "fetch", reason="fixed")
        assert (done.id, done.status, done.action, done.step) == (wid, "running", "retry", "fetch")
        assert (await finished(api, ADMIN, wid))["status"] == "completed"
        with pytest.raises(ApiError) as caught:
            await sdk.resume_workflow(wid)
        assert caught.value.status == 409
        again = await sdk.rerun_workflow(wid, "after")
        assert again.rerun_of == wid and again.from_step == "after" and again.status == "pending"
        body = await finished(api, ADMIN, again.id)
        assert body["status"] == "completed" and (await sdk.workflow(again.id)).rerun_of == wid
    assert model.asked == {"setup": 1, "fetch": 2, "after": 2}
    reasons = [d.get("reason") for d in overrides(await events(api, wid))]
    assert reasons == ["fixed", None]  # the retry's, the re-run's


def with_retries(backoff_ms: int) -> dict[str, Any]:
    return {
        "name": "retrying",
        "steps": [
            {
                "name": "fetch",
                "prompt": "[tag fetch] [broken fetch] [answer FETCHED]",
                "retry": {"max_attempts": 2, "backoff_ms": backoff_ms},
            }
        ],
    }


async def test_a_retried_failed_step_counts_its_attempts_afresh(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    model.broken.add("fetch")
    wid = await create(api, ADMIN, **with_retries(10))
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed" and body["steps"][0]["attempt"] == 2, body
    # Still broken: the retried step gets its two attempts again (3 and 4), then fails.
    r = await api.post(f"/workflows/{wid}/steps/fetch/retry", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed", body
    fetch = body["steps"][0]
    assert fetch["attempt"] == 4 and [a["attempt"] for a in fetch["attempts"]] == [3, 4]
    assert model.asked["fetch"] == 4
    model.broken.clear()
    r = await api.post(f"/workflows/{wid}/resume", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed" and body["steps"][0]["attempt"] == 5, body
    got = await events(api, wid)
    assert [e["type"] for e in got].count("workflow.failed") == 2
    assert [d["action"] for d in overrides(got)] == ["retry", "resume"]


async def test_retry_a_step_waiting_for_its_next_attempt_starts_it_now(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    model.broken.add("fetch")
    wid = await create(api, ADMIN, **with_retries(60_000))
    deadline = time.monotonic() + 30
    while "next_attempt_at" not in (body := await running_step(api, wid, 0))["steps"][0]:
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)
    model.broken.clear()
    r = await api.post(f"/workflows/{wid}/steps/fetch/retry", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = await finished(api, ADMIN, wid, within=20)  # not a minute later
    assert body["status"] == "completed", body
    fetch = body["steps"][0]
    # Nothing was in flight: the failed attempt 1, then attempt 2 at once.
    assert [(a["attempt"], "error" in a) for a in fetch["attempts"]] == [(1, True), (2, False)]
    assert not any(a.get("lost") for a in fetch["attempts"])


async def test_steps_named_with_slashes_and_dots_are_reachable(
    api: httpx.AsyncClient, model: Scripted
) -> None:
    """Issue 33: a step name may hold `/` or be `..`; the retry/skip paths take the rest of
    the path up to `/retry` or `/skip` (`{step:path}`), percent-encoded or not. A raw `..`
    is removed by the client (RFC 3986 dot segments) before it is sent: `%2E%2E` reaches it."""
    model.broken.update({"fetch/parse", "dots"})
    wid = await create(
        api,
        ADMIN,
        name="slashes",
        steps=[
            {"name": "fetch/parse", "prompt": "[tag fetch/parse] [broken fetch/parse] [answer FP]"},
            {"name": "..", "prompt": "[tag dots] [broken dots] [answer D]"},
            {"name": "after", "prompt": "[tag after] <{{fetch/parse.result}}>"},
        ],
    )
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed" and body["steps"][0]["status"] == "failed", body
    # Percent-encoded (as the SDK sends it): a new attempt, which fails again.
    r = await api.post(f"/workflows/{wid}/steps/fetch%2Fparse/retry", headers=ADMIN)
    assert r.status_code == 200 and r.json()["step"] == "fetch/parse", r.text
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed" and body["steps"][0]["attempt"] == 2, body
    r = await api.post(f"/workflows/{wid}/steps/fetch%2Fnope/retry", headers=ADMIN)
    assert r.status_code == 404, r.text
    # Raw: the same step.
    model.broken.discard("fetch/parse")
    r = await api.post(f"/workflows/{wid}/steps/fetch/parse/retry", headers=ADMIN)
    assert r.status_code == 200 and r.json()["step"] == "fetch/parse", r.text
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "failed", body
    assert [s["status"] for s in body["steps"]] == ["completed", "failed", "skipped"]
    # `..`: a raw one never reaches the step (the client drops it), `%2E%2E` does.
    r = await api.post(f"/workflows/{wid}/steps/../skip", headers=ADMIN)
    assert r.status_code == 404, r.text
    r = await api.post(f"/workflows/{wid}/steps/%2E%2E/skip", headers=ADMIN)
    assert r.status_code == 200 and r.json()["step"] == "..", r.text
    body = await finished(api, ADMIN, wid)
    assert body["status"] == "completed", body
    assert [s["status"] for s in body["steps"]] == ["completed", "skipped", "completed"]
    assert body["steps"][2]["result"] == "done: [tag after] <FP>"
    assert model.asked == {"fetch/parse": 3, "dots": 1, "after": 1}
