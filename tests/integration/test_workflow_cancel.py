"""Cancelling a workflow whose children cannot be reached (their shard down or slow): the
parent is still driven to its end, and the cancel call itself does not fail."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.auth import Principal
from orchestrator.db import connect
from orchestrator.errors import Conflict
from orchestrator.events import EventStore
from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore
from tests.conftest import make_supervisor


class _Agent:
    """Agent work stands in for the model: `slow` takes a while, anything else is done."""

    async def run(self, task: AgentTask) -> TaskResult:
        if task.prompt == "slow":
            await asyncio.sleep(1.5)
        return TaskResult(task.task_id, "completed", "done", None, 1, "test")


async def _unreachable(workflow_id: str) -> str:
    raise TimeoutError(f"no answer about {workflow_id}")


async def test_cancel_survives_an_unreachable_child(make_settings: Any) -> None:
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    store = WorkflowStore(db.pool, EventStore(db.pool))
    engine = WorkflowEngine(
        store, _Agent(), settings, canceller=_unreachable, supervisor=make_supervisor()
    )
    try:
        spec = WorkflowSpec.parse(
            "parent",
            [
                {
                    "name": "fan",
                    "type": "spawn",
                    "workflows": [{"name": "child", "steps": [{"name": "s", "prompt": "slow"}]}],
                },
                {"name": "after", "prompt": "never"},
            ],
        )
        pid = await store.create(spec, "ann")
        await engine.start(pid)
        for _ in range(100):
            if await store.children(pid):
                break
            await asyncio.sleep(0.05)
        assert await store.children(pid)
        status = await engine.cancel(pid)  # the child cannot be cancelled: no exception
        assert status in ("cancelled", "running")
        final = await engine.wait(pid, within=20)
        assert str(final.status) == "cancelled"
        assert all(str(s.status) != "completed" for s in final.steps if s.name == "after")
    finally:
        await engine.shutdown()
        await db.close()


async def test_delete_waits_for_running_descendants(make_settings: Any) -> None:
    """A cancelled parent whose child still runs cannot be deleted from under that child."""
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    store = WorkflowStore(db.pool, EventStore(db.pool))
    try:
        parent = await store.create(WorkflowSpec.parse("p", [{"name": "a", "prompt": "x"}]), "ann")
        child = await store.create(
            WorkflowSpec.parse("c", [{"name": "a", "prompt": "x"}]), "ann", parent_id=parent
        )
        await db.pool.execute("UPDATE workflows SET status = 'cancelled' WHERE id = $1", parent)
        await db.pool.execute("UPDATE workflows SET status = 'running' WHERE id = $1", child)
        try:
            await store.delete(parent, Principal("ann"))
            raise AssertionError("deleted while a child ran")
        except Conflict as exc:
            assert "still running" in exc.message
        await db.pool.execute("UPDATE workflows SET status = 'cancelled' WHERE id = $1", child)
        assert await store.delete(parent, Principal("ann")) == 1
        assert await store.load(child) is None  # descendants go with it
    finally:
        await db.close()
