"""The scheduler's lease as a fenced claim (issue 16, item 1), against real Postgres: a job
paused or deleted while a tick holds it (read under its row lock) is changed only after that
tick's dispatch commits, and never dispatched after the request has answered; it costs the
scheduler nothing; a deposed scheduler dispatches nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import Database, connect
from orchestrator.errors import Conflict
from orchestrator.events import EventStore, EventTransaction
from orchestrator.runtime.claims import StaleClaim
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.scheduler import Job, JobSpec, JobStore, SchedulerService, every


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[AgentTask] = []

    async def run(self, task: AgentTask) -> TaskResult:
        self.seen.append(task)
        return TaskResult(task.task_id, "completed", "ok", None, 1, "test")


class _MidTick(JobStore):
    """The real store; `meanwhile(due)` starts (a task of its own) once the tick has read
    what is due and before it writes: a request made mid-tick. `request` is that task. The
    tick's write then waits until that request is either done or blocked on a row lock in
    Postgres, so a request that does not have to wait for the tick answers before it."""

    meanwhile: Callable[[list[Job]], Awaitable[None]] | None = None
    request: asyncio.Task[None] | None = None
    blocked: bool = False  # the request was seen waiting for a lock

    def __init__(self, pool: Any, events: EventStore) -> None:
        super().__init__(pool, events)
        self.started = asyncio.Event()  # `request` is out

    async def hold_the_write(self) -> None:
        # Postgres has no notification for a lock wait: its activity view is polled.
        deadline = time.monotonic() + 10
        while self.request is not None and not self.request.done():
            waiting = await self.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND query LIKE '%FOR UPDATE%'"
                " AND pid <> pg_backend_pid()"
            )
            if waiting:
                self.blocked = True
                return
            assert time.monotonic() < deadline, "the request neither answered nor waited"
            await asyncio.sleep(0.01)

    async def dispatch_due(  # type: ignore[override]
        self, now: int, limit: int, fence: Any, plan: Any, extra_events: Any
    ) -> tuple[int, list[tuple[Job, int, str]]]:
        def planned(due: list[Job]) -> Any:
            if self.meanwhile is not None and due:
                hook, self.meanwhile = self.meanwhile, None
                self.request = asyncio.ensure_future(hook(due))
                self.started.set()
            return plan(due)

        return await super().dispatch_due(now, limit, fence, planned, extra_events)


class _HeldEvents(EventStore):
    """The real event store; the tick's one write (`tx.write`) first waits for
    `store.hold_the_write()` when a mid-tick request is out."""

    store: _MidTick | None = None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[EventTransaction]:
        async with super().transaction() as tx:
            write = tx.write

            async def held(*args: Any, **kwargs: Any) -> Any:
                if self.store is not None and self.store.request is not None:
                    store, self.store = self.store, None
                    await store.hold_the_write()
                return await write(*args, **kwargs)

            tx.write = held  # type: ignore[method-assign]
            yield tx


@pytest.fixture
async def db(make_settings: Any) -> AsyncIterator[Database]:
    database = await connect(make_settings().database_url)
    yield database
    await database.close()


async def _due_job(store: JobStore, db: Database, name: str) -> Job:
    job = await store.create(JobSpec(name=name, prompt=name, schedule=every(3_600_000)), "a", 10)
    await _make_due(db, job)
    return job


async def _make_due(db: Database, job: Job) -> None:
    past = int(time.time() * 1000) - 1000
    await db.pool.execute("UPDATE scheduled_jobs SET next_run = $2 WHERE id = $1", job.id, past)


async def _active(service: SchedulerService) -> None:
    service.start()
    for _ in range(200):
        if service.active:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the scheduler never became active")


async def _dispatches(db: Database, job_id: int) -> int:
    return int(
        await db.pool.fetchval(
            "SELECT count(*) FROM events WHERE type = 'scheduler.task_dispatched'"
            " AND data->>'job_id' = $1",
            str(job_id),
        )
    )


@pytest.mark.parametrize("change", ["pause", "delete"])
async def test_a_job_changed_mid_tick_waits_for_that_tick(
    make_settings: Any,
    db: Database,
    change: str,
    supervisor: Supervisor,
) -> None:
    settings = make_settings(timer_clamp_ms=200)
    assert settings.database_url
    events = _HeldEvents(db.pool)
    store = _MidTick(db.pool, events)
    other = await _due_job(store, db, "other")
    recorder = _Recorder()
    service = SchedulerService(store, recorder, settings, settings.database_url, supervisor)
    await _active(service)
    try:
        await asyncio.wait_for(_seen(recorder, 1), 10)  # `other` ran: the loop is healthy
        events.store = store
        assert recorder.seen[0].prompt == "other"
        holder = await service._claims.holder("scheduler", "leader")
        # Not due yet: the hook is in place before it is (the scheduler shares this loop).
        target = await store.create(
            JobSpec(name="target", prompt="target", schedule=every(3_600_000)), "a", 10
        )
        # Dispatches of `target` committed when the request answered (or failed).
        at_answer: list[int] = []

        async def request(jobs: list[Job]) -> None:
            assert target.id in [j.id for j in jobs]
            try:
                if change == "pause":
                    await store.pause(target.id)
                else:
                    # The run the tick started may still be going: a 409, after the tick.
                    with contextlib.suppress(Conflict):
                        await store.delete(target.id)
            finally:
                at_answer.append(await _dispatches(db, target.id))

        store.meanwhile = request
        await _make_due(db, target)
        service.poke()
        await asyncio.wait_for(store.started.wait(), 10)  # the tick read `target`
        assert store.request is not None
        await asyncio.wait_for(store.request, 10)
        # The request waited for the tick's row lock (seen in Postgres), and the dispatch was
        # committed when it answered; one that could answer mid-tick would have seen none.
        assert store.blocked
        assert at_answer == [1]
        # The next due job still goes out: the scheduler kept its lease and its loop.
        third = await _due_job(store, db, "third")
        service.poke()
        await asyncio.wait_for(_seen(recorder, 3), 10)
        assert sorted(t.prompt for t in recorder.seen) == ["other", "target", "third"]
        assert service.active
        assert supervisor.restarts() == {}  # one session throughout
        assert await service._claims.holder("scheduler", "leader") == holder
        # Nothing of `target` after the answer.
        assert await _dispatches(db, target.id) == 1
        if change == "pause":
            paused = await store.get(target.id)
            assert paused is not None and not paused.enabled
        assert third.id != other.id
    finally:
        await service.shutdown()


async def _seen(recorder: _Recorder, n: int) -> None:
    while len(recorder.seen) < n:  # noqa: ASYNC110 - the recorder is a plain list
        await asyncio.sleep(0.02)


async def test_a_deposed_scheduler_dispatches_nothing(
    make_settings: Any, db: Database, supervisor: Supervisor
) -> None:
    settings = make_settings(timer_clamp_ms=200, scheduler_lease_ttl_ms=60_000)
    assert settings.database_url
    store = JobStore(db.pool, EventStore(db.pool))
    recorder = _Recorder()
    service = SchedulerService(store, recorder, settings, settings.database_url, supervisor)
    await _active(service)
    try:
        fence = service._fence
        assert fence is not None
        # Its lease expires (a paused process) and another scheduler takes it over.
        await db.pool.execute("UPDATE claims SET expires_at = 0 WHERE kind = 'scheduler'")
        usurper = await service._claims.acquire("scheduler", "leader", "other/1")
        assert usurper is not None and usurper.epoch > fence.epoch
        job = await _due_job(store, db, "late")
        with pytest.raises(StaleClaim):
            await store.start_runs([(job, None, False)], int(time.time() * 1000), None, fence)
        assert await db.pool.fetchval("SELECT count(*) FROM scheduled_runs") == 0
        service.poke()  # its next tick finds `late` due: refused, and it stands down
        for _ in range(200):
            if not service.active:
                break
            await asyncio.sleep(0.05)
        assert not service.active
        assert recorder.seen == []
        assert await db.pool.fetchval("SELECT count(*) FROM scheduled_runs") == 0
    finally:
        await service.shutdown()


class _BrokenOnce(JobStore):
    """The real store whose first look at what is due fails with a bug."""

    failed = False

    async def dispatch_due(  # type: ignore[override]
        self, now: int, limit: int, fence: Any, plan: Any, extra_events: Any
    ) -> tuple[int, list[tuple[Job, int, str]]]:
        if not self.failed:
            self.failed = True
            raise RuntimeError("a bug in the tick")
        return await super().dispatch_due(now, limit, fence, plan, extra_events)


async def test_a_failing_tick_is_restarted_and_counted(make_settings: Any, db: Database) -> None:
    settings = make_settings(timer_clamp_ms=200)
    assert settings.database_url
    store = _BrokenOnce(db.pool, EventStore(db.pool))
    restarts: list[str] = []
    recorder = _Recorder()
    supervisor = Supervisor("test", on_restart=restarts.append)
    service = SchedulerService(store, recorder, settings, settings.database_url, supervisor)
    service.start()
    try:
        # Its first tick fails: the loop is restarted (after a backoff) and counted.
        deadline = time.monotonic() + 20
        while not restarts:
            assert time.monotonic() < deadline, "no restart reported"
            await asyncio.sleep(0.02)
        await _due_job(store, db, "after")
        service.poke()
        await asyncio.wait_for(_seen(recorder, 1), 20)
        assert restarts == ["scheduler"]
        assert [t.prompt for t in recorder.seen] == ["after"]
    finally:
        await service.shutdown()
        await supervisor.aclose()
