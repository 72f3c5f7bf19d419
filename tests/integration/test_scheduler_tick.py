"""A scheduler tick against real Postgres (issue 17): everything one tick does to the jobs it
found due (the runs it starts and the slots it skips for runs still going) commits in one
transaction, under the lease check and the jobs' row locks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import Database, connect
from orchestrator.events import EventStore
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.scheduler import JobSpec, JobStore, SchedulerService, every


class _Held:
    """A dispatcher whose runs go on until released: the rows the tick wrote stay as it
    left them (a run's end would write them again)."""

    def __init__(self) -> None:
        self.seen: list[AgentTask] = []
        self.release = asyncio.Event()

    async def run(self, task: AgentTask) -> TaskResult:
        self.seen.append(task)
        await self.release.wait()
        return TaskResult(task.task_id, "completed", "ok", None, 1, "test")


@pytest.fixture
async def db(make_settings: Any) -> AsyncIterator[Database]:
    database = await connect(make_settings().database_url)
    yield database
    await database.close()


async def _seen(held: _Held, n: int) -> None:
    while len(held.seen) < n:  # noqa: ASYNC110 - the dispatcher is a plain list
        await asyncio.sleep(0.02)


async def test_a_tick_commits_its_dispatches_and_skips_at_once(
    make_settings: Any, db: Database, supervisor: Supervisor
) -> None:
    settings = make_settings(timer_clamp_ms=60_000, max_dispatch_per_tick=5)
    assert settings.database_url
    store = JobStore(db.pool, EventStore(db.pool))
    held = _Held()
    service = SchedulerService(store, held, settings, settings.database_url, supervisor)
    service.start()
    try:
        for _ in range(200):
            if service.active:
                break
            await asyncio.sleep(0.05)
        assert service.active
        jobs = [
            await store.create(
                JobSpec(name=n, prompt=n, schedule=every(3_600_000), overlap=o), "a", 10
            )
            for n, o in [("busy", "skip"), ("queued", "queue"), ("one", "skip"), ("two", "skip")]
        ]
        busy, queued = jobs[0].id, jobs[1].id
        ids = [j.id for j in jobs]
        # All four due at once (one statement), two of them with a run still going.
        past = int(time.time() * 1000) - 1000
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE scheduled_jobs SET next_run = $2,"
                " running = CASE WHEN id = ANY($3::bigint[]) THEN 1 ELSE 0 END"
                " WHERE id = ANY($1::bigint[])",
                ids,
                past,
                [busy, queued],
            )
            await conn.execute("NOTIFY orch_scheduler")
        await asyncio.wait_for(_seen(held, 2), 15)
        assert sorted(t.prompt for t in held.seen) == ["one", "two"]
        rows = await db.pool.fetch(
            "SELECT id, next_run, queued, xmin::text AS tx FROM scheduled_jobs"
            " WHERE id = ANY($1::bigint[])",
            ids,
        )
        by_id = {r["id"]: r for r in rows}
        # The skipped slots moved on (the queue job keeps a run waiting), not dispatched.
        assert by_id[busy]["next_run"] > past and not by_id[busy]["queued"]
        assert by_id[queued]["next_run"] > past and by_id[queued]["queued"]
        started = await db.pool.fetch(
            "SELECT id, job_id, task_id, xmin::text AS tx FROM scheduled_runs"
            " WHERE job_id = ANY($1::bigint[])",
            ids,
        )
        assert sorted(r["job_id"] for r in started) == sorted(ids[2:])
        assert all(r["task_id"] == f"job-{r['job_id']}-run-{r['id']}" for r in started)
        assert sorted(t.task_id for t in held.seen) == sorted(r["task_id"] for r in started)
        # One transaction wrote every job row and every run of the tick.
        assert {r["tx"] for r in rows} | {r["tx"] for r in started} == {rows[0]["tx"]}
    finally:
        held.release.set()
        await service.shutdown()
