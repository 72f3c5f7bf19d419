"""SPEC part 1, "What the service does": the one checkable rule beyond the parts that
follow: the requesting user's `user_uuid` is carried from the HTTP request into workflow
step dispatch, scheduled job attribution and task dispatch, so results belong to the right
user. (The list of features is walked part by part in the other modules.)"""

from __future__ import annotations

import time

from tests.integration.spec._kit import ADMIN, Spec, create_workflow, events, finished, until


async def test_workflow_steps_carry_the_requester(spec: Spec) -> None:
    """SPEC part 1: user_uuid carried into workflow step dispatch: the step's task events
    are the requester's (they see them, another user does not)."""
    ann = await spec.user("p1-ann")
    bob = await spec.user("p1-bob")
    wid = await create_workflow(spec.c, ann, name="p1", steps=[{"name": "a", "prompt": "x"}])
    await finished(spec.c, ann, wid)
    task = f"{wid}:a:1"
    mine = await events(spec.c, task, ann)
    assert {"task.created", "task.completed"} <= {e["type"] for e in mine}
    assert all(e.get("user_uuid", "p1-ann") == "p1-ann" for e in mine)
    assert await events(spec.c, task, bob) == []
    by_owner = await events(spec.c, task, ADMIN, user_uuid="p1-ann")
    assert [e["id"] for e in by_owner] == [e["id"] for e in mine]


async def test_task_dispatch_carries_the_requester(spec: Spec) -> None:
    """SPEC part 1: user_uuid carried into task dispatch: what the agent writes (here a
    workspace file through its tool) lands in the requester's space."""
    ann = await spec.user("p1-ann")
    wid = await create_workflow(
        spec.c,
        ann,
        name="p1-file",
        steps=[
            {"name": "w", "prompt": '[tool workspace_write {"path": "p1.txt", "content": "mine"}]'}
        ],
    )
    assert (await finished(spec.c, ann, wid))["status"] == "completed"
    r = await spec.c.post("/workspace/read", headers=ann, json={"path": "p1.txt"})
    assert r.status_code == 200 and r.json()["content"] == "mine"
    bob = await spec.user("p1-bob")
    assert (
        await spec.c.post("/workspace/read", headers=bob, json={"path": "p1.txt"})
    ).status_code == 404


async def test_scheduled_job_attribution(spec: Spec) -> None:
    """SPEC part 1: user_uuid carried into scheduled job attribution: the job records its
    creator and the task it dispatches runs as them."""
    r = await spec.c.post(
        "/schedules", headers=ADMIN, json={"prompt": "[answer p1]", "every": 3_600_000}
    )
    jid = r.json()["id"]
    assert (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()["user_uuid"] == "admin"
    task = (await spec.c.post(f"/schedules/{jid}/run", headers=ADMIN)).json()["task_id"]

    async def done() -> list:
        evs = await events(spec.c, task, ADMIN, user_uuid="admin")
        return [e for e in evs if e["type"] == "task.completed"]

    (completed,) = await until(done)
    assert completed["data"]["status"] == "completed"
    assert time.time() * 1000 - completed["timestamp"] < 60_000
