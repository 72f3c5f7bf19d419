"""SPEC part 6, "Events": the store's properties, every type of the catalog table with its
aggregate key, the data of task.completed, the workflow stream names and the emission ties.
(That each type is also emitted by some path is issue 33's catalog test.) Each case's id
names the line it checks."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest

from orchestrator.events import CATALOG
from tests.integration.spec._kit import ADMIN, Spec, create_workflow, events, until
from tests.sse import sse_frames

# SPEC part 6's table: category (aggregate key) -> types.
TABLE: list[tuple[str, list[str]]] = [
    ("task_id", ["task.created", "task.completed", "task.failed", "task.dispatched"]),
    (
        "model_name",
        [
            "model.started",
            "model.stopped",
            "model.failed",
            "model.ready",
            "model.discovered",
            "model.prepared",
            "model.start_failed",
        ],
    ),
    (
        "worker_id",
        [
            "worker.spawned",
            "worker.crashed",
            "worker.ready",
            "worker.spawn_failed",
            "worker.killed",
        ],
    ),
    ("task_id", ["worker.task_started", "worker.task_completed", "worker.task_failed"]),
    (
        "request_id",
        ["inference.request", "inference.complete", "inference.error", "inference.interrupted"],
    ),
    ("job_id", ["scheduler.job_created", "scheduler.job_executed", "scheduler.task_dispatched"]),
    (
        "workflow_id",
        ["workflow.started", "workflow.completed", "workflow.failed", "workflow.step_started"],
    ),
    (
        "task_id",
        [
            "agent.turn_started",
            "agent.turn_completed",
            "agent.context_overflow",
            "agent.diagnostic",
            "agent.loop_warning",
            "agent.loop_detected",
        ],
    ),
    (
        "task_id",
        [
            "audit.tool_executed",
            "audit.tool_denied",
            "audit.intervention_pending",
            "audit.intervention_approved",
            "audit.intervention_rejected",
        ],
    ),
    ("user_uuid", ["audit.permission_grant", "audit.permission_deny"]),
    ("request_id", ["audit.llm_decision"]),
    ("workflow_id", ["audit.workflow_override"]),
    (
        "agent_id",
        [
            "memory.stored",
            "memory.accessed",
            "memory.decayed",
            "memory.reflected",
            "memory.forgotten",
        ],
    ),
    (
        "team_id",
        [
            "team.created",
            "team.member_joined",
            "team.member_left",
            "team.mail_sent",
            "team.destroyed",
        ],
    ),
]
TYPES = [(t, key) for key, names in TABLE for t in names]


@pytest.mark.parametrize(
    ("name", "key"), [pytest.param(t, k, id=f"SPEC part 6: {t} ({k})") for t, k in TYPES]
)
async def test_catalog_type(spec: Spec, name: str, key: str) -> None:
    """Each type of the table is in the registry (the API takes it as a filter: unknown
    names are a 400), versioned, with the table's aggregate key."""
    r = await spec.c.get("/events", headers=ADMIN, params={"types": name, "limit": 1})
    assert r.status_code == 200, r.text
    assert CATALOG[name].aggregate_key == key
    assert CATALOG[name].version >= 1


def test_fifth_workflow_type() -> None:
    """SPEC part 6: "The workflow category is described as holding five types but four are
    listed; the fifth is not shown" (DESIGN: workflow.cancelled)."""
    assert "workflow.cancelled" in CATALOG


async def test_unknown_type_refused(spec: Spec) -> None:
    """SPEC part 6: "Each type is versioned and validated at ingestion" (the read filter
    knows exactly the registry)."""
    r = await spec.c.get("/events", headers=ADMIN, params={"types": "task.nonexistent"})
    assert r.status_code == 400, r.text


@pytest.fixture(scope="module")
async def flows(spec: Spec) -> dict[str, Any]:
    """One workflow of each ending, followed live on /sync-events from before they start."""
    h = await spec.user("p6-ann")
    made: dict[str, str] = {}
    names: dict[str, list[str]] = {}
    deadline = time.monotonic() + 60
    async with spec.c.stream("GET", "/sync-events", headers=h, timeout=60) as s:
        assert s.status_code == 200
        async for frame in sse_frames(s):
            assert time.monotonic() < deadline, "the stream did not show it in time"
            if not made and "comment" in frame:
                made["ok"] = await create_workflow(
                    spec.c,
                    h,
                    name="p6-ok",
                    steps=[{"name": "a", "prompt": "x"}, {"name": "b", "prompt": "y"}],
                )
                made["fail"] = await create_workflow(
                    spec.c,
                    h,
                    name="p6-fail",
                    steps=[
                        {"name": "a", "prompt": "x", "compensate": {"notify": "undo a"}},
                        {"name": "b", "prompt": "y", "compensate": {"notify": "undo b"}},
                        {"name": "c", "prompt": "[fail]"},
                    ],
                )
                made["cancel"] = await create_workflow(
                    spec.c,
                    h,
                    name="p6-cancel",
                    steps=[{"name": "a", "prompt": "x"}, {"name": "b", "prompt": "[sleep 20]"}],
                )
            if "data" in frame:
                data = json.loads(frame["data"])
                for kind, wid in made.items():
                    if data.get("aggregate_id") == wid:
                        names.setdefault(kind, []).append(frame["event"])
                        if (
                            frame["event"] == "workflow:step:started"
                            and kind == "cancel"
                            and data["data"].get("step") == "b"
                        ):
                            r = await spec.c.post(f"/workflows/{wid}/cancel", headers=h)
                            assert r.status_code == 200, r.text
            ends = ("workflow:completed", "workflow:failed", "workflow:cancelled")
            if made and all(any(n in ends for n in names.get(k, [])) for k in made):
                break
    stored = {k: await events(spec.c, wid, h) for k, wid in made.items()}
    return {"ids": made, "stream": names, "stored": stored, "h": h}


def test_stream_names_success(flows: dict[str, Any]) -> None:
    """SPEC part 6: "creating and running a workflow emits workflow:started; each step emits
    step started and completed"."""
    assert flows["stream"]["ok"] == [
        "workflow:started",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:completed",
    ]


def test_stream_names_failure(flows: dict[str, Any]) -> None:
    """SPEC part 6: "a failed step emits workflow:step:failed, workflow:compensating,
    workflow:failed" (SPEC part 3: compensation for completed steps in reverse order, the
    workflow failed only after all)."""
    names = flows["stream"]["fail"]
    i = names.index("workflow:step:failed")
    assert names[:i] == [
        "workflow:started",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:step:started",
    ]
    tail = names[i + 1 :]
    assert tail[0] == "workflow:compensating" and tail[-1] == "workflow:failed"
    assert set(tail[:-1]) == {"workflow:compensating"}
    stored = flows["stored"]["fail"]
    compensated = [
        e["data"].get("step")
        for e in stored
        if e["type"] == "workflow.compensating" and e["data"].get("ok") is not None
    ]
    assert compensated == ["b", "a"]


def test_stream_names_cancel(flows: dict[str, Any]) -> None:
    """SPEC part 6: "cancel emits workflow:compensating then workflow:cancelled"."""
    names = flows["stream"]["cancel"]
    assert names[0] == "workflow:started" and names[-1] == "workflow:cancelled"
    assert names[-2] == "workflow:compensating"


def test_stream_names_colon_style(flows: dict[str, Any]) -> None:
    """SPEC part 6: the workflow stream event names (colon style) are exactly these."""
    allowed = {
        "workflow:started",
        "workflow:step:started",
        "workflow:step:completed",
        "workflow:step:failed",
        "workflow:completed",
        "workflow:failed",
        "workflow:cancelled",
        "workflow:compensating",
    }
    for names in flows["stream"].values():
        assert set(names) <= allowed


async def test_task_completed_payload(spec: Spec, flows: dict[str, Any]) -> None:
    """SPEC part 6: task.completed "data holds task_id, worker_id, status and duration_ms"."""
    wid = flows["ids"]["ok"]
    task = await events(spec.c, f"{wid}:a:1", flows["h"])
    (done,) = [e for e in task if e["type"] == "task.completed"]
    assert {"task_id", "worker_id", "status", "duration_ms"} <= set(done["data"])
    assert done["data"]["task_id"] == f"{wid}:a:1" and isinstance(done["data"]["duration_ms"], int)


def test_seq_per_aggregate(flows: dict[str, Any]) -> None:
    """SPEC part 6: "per-aggregate monotonic `seq`" (gapless here: 1, 2, 3, ...)."""
    for stored in flows["stored"].values():
        assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))


async def test_replayable(spec: Spec, flows: dict[str, Any]) -> None:
    """SPEC part 6: the store is "replayable": reading an aggregate again gives the same
    events in the same order."""
    for kind, wid in flows["ids"].items():
        again = await events(spec.c, wid, flows["h"])
        assert again == flows["stored"][kind]


async def test_append_only(spec: Spec, flows: dict[str, Any]) -> None:
    """SPEC part 6: the store is "append-only, immutable": the database refuses to change or
    remove an event."""
    conn = await asyncpg.connect(spec.settings.database_url)
    try:
        for statement in (
            "UPDATE events SET data = '{}'::jsonb WHERE aggregate_id = $1",
            "DELETE FROM events WHERE aggregate_id = $1",
        ):
            with pytest.raises(asyncpg.PostgresError):
                await conn.execute(statement, flows["ids"]["ok"])
    finally:
        await conn.close()
    assert await events(spec.c, flows["ids"]["ok"], flows["h"]) == flows["stored"]["ok"]


async def test_event_total_metric(spec: Spec, flows: dict[str, Any]) -> None:
    """SPEC part 4 Metrics / part 6: svc_event_total counts events on the bus by type."""

    async def counted() -> bool:
        text = (await spec.c.get("/metrics")).text
        return 'svc_event_total{type="workflow.started"}' in text

    await until(counted)
