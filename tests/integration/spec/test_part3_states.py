"""SPEC part 3, "States and transitions": the workflow table (each row's move, next state
and events), compensation, delete, step states, the inference instance moves a test can
cause, the scheduled job table and the circuit breaker's metric values. Each case's id
names the row it checks."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx

from tests.integration.spec._kit import (
    ADMIN,
    LOCAL_MODEL,
    MODEL,
    Spec,
    create_workflow,
    events,
    finished,
    until,
)


async def _status_seen(c: httpx.AsyncClient, h: dict[str, str], wid: str, status: str) -> None:
    async def seen() -> bool:
        return bool((await c.get(f"/workflows/{wid}", headers=h)).json()["status"] == status)

    await until(seen)


async def test_pending_running_completed(spec: Spec) -> None:
    """SPEC part 3 Workflow: pending -> running when execution begins (event
    workflow:started); running -> completed when every step succeeded (event
    workflow:completed). Steps run sequentially by default (SPEC part 2)."""
    h = await spec.user("p3-ok")
    r = await spec.c.post(
        "/workflows",
        headers=h,
        json={
            "name": "p3-ok",
            "steps": [{"name": "a", "prompt": "[sleep 0.5]"}, {"name": "b", "prompt": "x"}],
        },
    )
    assert r.json()["status"] == "pending"
    wid = r.json()["id"]
    await _status_seen(spec.c, h, wid, "running")
    body = await finished(spec.c, h, wid)
    assert body["status"] == "completed"
    types = [e["type"] for e in await events(spec.c, wid, h)]
    assert types[0] == "workflow.started" and types[-1] == "workflow.completed"
    # Sequential: b started only after a completed.
    assert types.index("workflow.step_completed") < types.index("workflow.step_started", 2)


async def test_running_failed_with_compensation(spec: Spec) -> None:
    """SPEC part 3 Workflow: running -> failed when a step fails: compensation runs for
    completed steps (a `compensate` event each, in reverse order; a failing compensation
    is logged and does not block the others), events workflow:step:failed,
    workflow:compensating, workflow:failed; failed only after all compensations."""
    h = await spec.user("p3-fail")
    wid = await create_workflow(
        spec.c,
        h,
        name="p3-fail",
        steps=[
            {"name": "a", "prompt": "x", "compensate": {"notify": "undo a"}},
            {"name": "b", "prompt": "y", "compensate": "[fail]"},
            {"name": "c", "prompt": "z"},
            {"name": "d", "prompt": "[fail]"},
        ],
    )
    body = await finished(spec.c, h, wid)
    assert body["status"] == "failed"
    assert [s["status"] for s in body["steps"]] == ["completed", "completed", "completed", "failed"]
    evs = await events(spec.c, wid, h)
    types = [e["type"] for e in evs]
    i = types.index("workflow.step_failed")
    assert types[i + 1] == "workflow.compensating" and types[-1] == "workflow.failed"
    per_step = [
        e["data"]
        for e in evs
        if e["type"] == "workflow.compensating" and e["data"].get("ok") is not None
    ]
    assert [d["step"] for d in per_step] == ["c", "b", "a"]
    assert [d.get("ok", True) for d in per_step] == [True, False, True]


async def test_running_cancelled(spec: Spec) -> None:
    """SPEC part 3 Workflow: running -> cancelled on POST cancel: compensation for completed
    steps, events workflow:compensating, workflow:cancelled."""
    h = await spec.user("p3-cancel")
    wid = await create_workflow(
        spec.c,
        h,
        name="p3-c",
        steps=[
            {"name": "a", "prompt": "x"},
            {"name": "b", "prompt": "[sleep 20]"},
            {"name": "c", "prompt": "x"},
        ],
    )

    async def b_running() -> bool:
        return bool(
            (await spec.c.get(f"/workflows/{wid}", headers=h)).json()["steps"][1]["status"]
            == "running"
        )

    await until(b_running)
    assert (await spec.c.post(f"/workflows/{wid}/cancel", headers=h)).status_code == 200
    body = await finished(spec.c, h, wid)
    assert body["status"] == "cancelled"
    types = [e["type"] for e in await events(spec.c, wid, h)]
    assert "workflow.compensating" in types and types[-1] == "workflow.cancelled"
    compensated = [
        e["data"].get("step")
        for e in await events(spec.c, wid, h)
        if e["type"] == "workflow.compensating" and e["data"].get("ok") is not None
    ]
    assert compensated == ["a"]


async def test_delete_only_completed_or_cancelled(spec: Spec) -> None:
    """SPEC part 3: "Delete is allowed for completed or cancelled workflows" (a running or
    failed one: 409, DESIGN)."""
    h = await spec.user("p3-del")
    running = await create_workflow(
        spec.c, h, name="r", steps=[{"name": "a", "prompt": "[sleep 20]"}]
    )
    failed = await create_workflow(spec.c, h, name="f", steps=[{"name": "a", "prompt": "[fail]"}])
    done = await create_workflow(spec.c, h, name="d", steps=[{"name": "a", "prompt": "x"}])
    await _status_seen(spec.c, h, running, "running")
    assert (await spec.c.delete(f"/workflows/{running}", headers=h)).status_code == 409
    assert (await finished(spec.c, h, failed))["status"] == "failed"
    assert (await spec.c.delete(f"/workflows/{failed}", headers=h)).status_code == 409
    await finished(spec.c, h, done)
    assert (await spec.c.delete(f"/workflows/{done}", headers=h)).status_code == 200
    await spec.c.post(f"/workflows/{running}/cancel", headers=h)
    await finished(spec.c, h, running)
    assert (await spec.c.delete(f"/workflows/{running}", headers=h)).status_code == 200


async def test_step_moves(spec: Spec) -> None:
    """SPEC part 3 Step: pending -> running; running -> completed, failed (or skipped)."""
    h = await spec.user("p3-step")
    wid = await create_workflow(
        spec.c,
        h,
        name="p3-s",
        steps=[{"name": "a", "prompt": "[sleep 1]"}, {"name": "b", "prompt": "[fail]"}],
    )

    async def a_running() -> Any:
        body = (await spec.c.get(f"/workflows/{wid}", headers=h)).json()
        return body if body["steps"][0]["status"] == "running" else None

    body = await until(a_running)
    assert body["steps"][1]["status"] == "pending"
    body = await finished(spec.c, h, wid)
    assert [s["status"] for s in body["steps"]] == ["completed", "failed"]
    # A running step abandoned by a cancel is skipped.
    wid = await create_workflow(
        spec.c, h, name="p3-s2", steps=[{"name": "a", "prompt": "[sleep 20]"}]
    )
    await _status_seen(spec.c, h, wid, "running")
    await spec.c.post(f"/workflows/{wid}/cancel", headers=h)
    assert (await finished(spec.c, h, wid))["steps"][0]["status"] == "skipped"


async def test_instance_moves(spec: Spec) -> None:
    """SPEC part 3 Inference instance: starting -> failed (the process exits); -> stopped
    (POST /stop). (stopped -> starting -> ready and ready <-> running need a real server:
    tests/integration/test_inference_instances.py.)"""
    await spec.c.post("/discover", headers=ADMIN)
    r = await spec.c.post("/inference", headers=ADMIN, json={"model": LOCAL_MODEL})
    iid = r.json()["id"]
    assert r.json()["state"] == "starting"

    async def failed() -> bool:
        return bool(
            (await spec.c.get(f"/inference/{iid}", headers=ADMIN)).json()["state"] == "failed"
        )

    await until(failed)
    await spec.c.post("/stop", headers=ADMIN, json={"id": iid})
    assert (await spec.c.get(f"/inference/{iid}", headers=ADMIN)).json()["state"] == "stopped"


async def test_job_pause_does_not_fire_unpause_active(spec: Spec) -> None:
    """SPEC part 3 Scheduled job: active -> paused on POST pause (admin): enabled=false and the
    job does not fire; paused -> active on POST unpause (response status `active`)."""
    r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "[answer t]", "every": 200})
    jid = r.json()["id"]

    async def fired() -> Any:
        job = (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()
        return job if job["last_run"] else None

    await until(fired)
    r = await spec.c.post(f"/schedules/{jid}/pause", headers=ADMIN)
    assert r.json()["status"] == "paused"

    async def idle() -> Any:
        job = (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()
        return job if not job["running"] else None

    job = await until(idle)
    assert job["enabled"] is False
    # Several of its intervals pass without a run (a deadline of real time, not a count).
    before = job["last_run"]
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()["last_run"] == before
        await asyncio.sleep(0.05)
    r = await spec.c.post(f"/schedules/{jid}/unpause", headers=ADMIN)
    assert r.json()["status"] == "active"
    assert (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()["enabled"] is True
    await spec.c.post(f"/schedules/{jid}/pause", headers=ADMIN)


async def test_job_auto_pause(spec: Spec) -> None:
    """SPEC part 3 Scheduled job: active -> paused automatically on 10 or more consecutive
    errors (auto-pause)."""
    r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "[fail]", "every": 50})
    jid = r.json()["id"]

    async def paused() -> Any:
        job = (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()
        return job if not job["enabled"] else None

    job = await until(paused, 60)
    assert job["consecutive_errors"] >= 10


async def test_job_run_dispatches(spec: Spec) -> None:
    """SPEC part 3 Scheduled job: any enabled -> dispatched on POST run (admin, not running):
    the task is dispatched immediately, whatever the schedule."""
    far = int(time.time() * 1000) + 86_400_000
    r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "[answer now]", "at": far})
    jid = r.json()["id"]
    r = await spec.c.post(f"/schedules/{jid}/run", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "dispatched"
    evs = await events(spec.c, str(r.json()["task_id"]))
    assert "task.created" in [e["type"] for e in evs]


async def test_circuit_breaker_values(spec: Spec) -> None:
    """SPEC part 3 Circuit breaker (metric values): 0 = closed, 1 = half-open, 2 = open (a
    provider answering is closed)."""
    h = await spec.user("p3-cb")
    r = await spec.c.post(
        "/chat/completions",
        headers=h,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200, r.text
    text = (await spec.c.get("/metrics")).text
    values = re.findall(
        r'^svc_circuit_breaker_state\{[^}]*provider="openai"[^}]*\} (\S+)$', text, re.M
    )
    assert values and float(values[0]) == 0
    for v in re.findall(r"^svc_circuit_breaker_state\{[^}]*\} (\S+)$", text, re.M):
        assert float(v) in (0, 1, 2)
