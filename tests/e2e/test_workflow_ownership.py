"""Workflow ownership through the real runtime (`scripts/serve`: Serve, WorkflowShard and
AgentWorker actors, embedded Postgres; issue 16, item 1): while the service's shards drive
workflows, a second driver (an engine of another generation, in this process, over the
same database) is told to drive them too and drives nothing; then the service restarts
with another `workflow_shards` mid-run. Every workflow completes, each step completes once,
each attempt's agent task is dispatched once."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.workflows import WorkflowEngine, WorkflowStore
from tests.conftest import make_supervisor
from tests.e2e.test_workflows import _events, _wait_all, agent_config, llm, running

pytestmark = pytest.mark.e2e
__all__ = ["llm"]  # the module-scoped loopback model fixture


class _Zombie:
    """The other generation's agent pool: counts what it was asked to run."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(self, task: AgentTask) -> TaskResult:
        self.calls.append(task.task_id)
        return TaskResult(task.task_id, "completed", "zombie", None, 1, "zombie")


async def _compete(database_url: str, ids: list[str]) -> list[str]:
    """Another driver asked to drive every workflow (start and resume): what it ran."""
    db = await connect(database_url, migrate=False)
    zombie = _Zombie()
    settings = Settings.load(environ={}, database_url=database_url)
    engine = WorkflowEngine(
        WorkflowStore(db.pool, EventStore(db.pool)), zombie, settings, supervisor=make_supervisor()
    )
    try:
        for wid in ids:
            await engine.start(wid)
        await engine.resume_unfinished(0, 1)
        deadline = time.monotonic() + 30
        while engine.running_count():  # each of its drivers finds the claim taken and ends
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        return zombie.calls
    finally:
        await engine.shutdown()
        await db.close()


async def _duplicates(database_url: str) -> dict[str, Any]:
    db = await connect(database_url, migrate=False)
    try:
        rows = await db.pool.fetch(
            "SELECT data->>'task_id' AS task, count(*) AS n FROM events"
            " WHERE type = 'task.dispatched' GROUP BY 1 HAVING count(*) > 1"
        )
        return {r["task"]: r["n"] for r in rows}
    finally:
        await db.close()


def test_a_second_driver_and_resharding_mid_run_duplicate_nothing(tmp_path: Path, llm: Any) -> None:
    steps = [{"name": f"s{i}", "prompt": f"[sleep 1] part {i}"} for i in range(3)]
    settings = agent_config(llm, provider_retries=0, agent_workers=2, workflow_shards=2)
    with running(tmp_path, settings) as orch:
        runtime = json.loads((tmp_path / "data" / "runtime.json").read_text())
        database_url = runtime["database_url"]
        with orch.client() as c:
            ids = [
                c.post("/workflows", json={"name": f"own-{n}", "steps": steps}).json()["id"]
                for n in range(8)
            ]
            deadline = time.monotonic() + 60
            while not all(c.get(f"/workflows/{i}").json()["status"] == "running" for i in ids):
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert asyncio.run(_compete(database_url, ids)) == []
        # Re-sharding mid-run: the same data, three shards instead of two.
        orch.stop()
        (tmp_path / "orchestrator.yaml").write_text(json.dumps({**settings, "workflow_shards": 3}))
        orch.start()
        with orch.client() as c:
            bodies = _wait_all(c, ids, 180)
            assert {b["status"] for b in bodies.values()} == {"completed"}, bodies
            for wid in ids:
                got = _events(c, wid)
                done = collections.Counter(
                    e["data"]["step"] for e in got if e["type"] == "workflow.step_completed"
                )
                assert done == {"s0": 1, "s1": 1, "s2": 1}, (wid, done)
                assert sum(e["type"] == "workflow.completed" for e in got) == 1
        assert asyncio.run(_duplicates(database_url)) == {}
