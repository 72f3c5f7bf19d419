"""The scheduler loop: one active instance, the holder of the claim `scheduler/leader`
(orchestrator/runtime/claims.py; renewed every third of `scheduler_lease_ttl_ms`; a second
instance waits for it and takes it over once it is released or has expired), woken by
`NOTIFY orch_scheduler` or by its timer, which never sleeps longer than `timer_clamp_ms`.
Every dispatch transaction checks the claim's epoch and re-reads its jobs under a row lock
(FOR UPDATE): a deposed scheduler dispatches nothing, and a job paused or deleted before
that transaction is not dispatched (once the pause or DELETE has answered, never again).

On start: runs a crash interrupted are recorded `error` (and counted); then catch-up: jobs
whose next run passed while nobody was scheduling are missed; up to `max_catchup_runs`, most
overdue first, are dispatched `catchup_stagger_ms` apart, however long ago they were missed
(unless `catchup_window_ms` is set: then only those missed within it; none with
`catchup_enabled` off); every other missed job moves to its next future run. Jobs with
`max_consecutive_errors` or more errors in a row are paused first (and stay paused).

A tick dispatches at most `max_dispatch_per_tick` due jobs. A job whose run is still going is
not dispatched again unless its overlap policy says so: `skip` (default: the slot is skipped),
`allow` (runs side by side), `queue` (one run waits and starts when the current one ends).
A dispatched run is an agent task (prompt, model, `opts` mode/tools/timeout) owned by the
job's creator; its outcome sets `last_result` (`ok`, `error`, `timeout`) and the errors
count; `max_consecutive_errors` in a row auto-pause the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import asyncpg

from orchestrator.agents import AgentTask, TaskDispatcher, TaskResult, created_event
from orchestrator.config import Settings
from orchestrator.events import NewEvent
from orchestrator.runtime.claims import ClaimStore, Fence, StaleClaim
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait
from orchestrator.scheduler._jobs import WAKE_CHANNEL, Job, JobStore, Slot

log = logging.getLogger(__name__)

LEASE = ("scheduler", "leader")
LEASE_RETRY_S = 1.0
# How a session ends without a bug: the lease lost, the database away.
SESSION_ENDS = (StaleClaim, OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
FINISH_ATTEMPTS = 60  # one a second: a Postgres restart is over long before
# A slot skipped for a run still going moves to a slot at least this far ahead: with a tiny
# `every` (any positive integer is allowed), the tick would otherwise rewrite the job every
# millisecond until the run ends.
SKIP_RECHECK_MS = 100


class SchedulerService:
    def __init__(
        self,
        store: JobStore,
        dispatcher: TaskDispatcher,
        settings: Settings,
        dsn: str,
        supervisor: Supervisor,
        *,
        clock: Callable[[], float] = time.time,
        name: str = "scheduler",
        run_store: JobStore | None = None,
    ) -> None:
        self._store = store
        # Where runs' ends are recorded: a pool of their own keeps a burst of them from
        # holding the connections the next tick needs (default: the tick's store).
        self._run_store = run_store or store
        self._dispatcher = dispatcher
        self._settings = settings
        self._dsn = dsn
        self._clock = clock
        self.name = name
        self._supervisor = supervisor
        self._loop: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._runs: set[asyncio.Task[None]] = set()
        self._inflight: set[int] = set()  # run ids this scheduler is waiting on
        self._conn: asyncpg.Connection | None = None
        self._claims = ClaimStore(store.pool, settings.scheduler_lease_ttl_ms)
        # Per instance: a restarted scheduler is a new owner, its predecessor fenced off.
        self.owner = f"{name}/{uuid.uuid4().hex[:12]}"
        self._fence: Fence | None = None
        self.active = False
        self.dispatched = 0

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def poke(self) -> None:
        self._wake.set()

    def start(self) -> None:
        """Run the scheduler as the task `scheduler` of the process's supervisor, its one
        restart layer: a session waits for the lease, then schedules until it ends; a lost
        lease, a lost database connection or a bug ends it (the lease given up), and the
        supervisor logs it, counts it and starts the next session after its backoff."""
        self._loop = self._supervisor.spawn("scheduler", self._session, expected=SESSION_ENDS)

    async def _session(self) -> None:
        try:
            await self._hold_lease_and_run()
        finally:
            await self._release()

    async def _release(self) -> None:
        self.active = False
        fence, self._fence = self._fence, None
        if fence is not None:
            with contextlib.suppress(Exception):
                # Shielded: a cancelled scheduler still hands the lease to a standby at once.
                await asyncio.shield(self._claims.release(fence))
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def _hold_lease_and_run(self) -> None:
        while True:
            self._fence = await self._claims.acquire(*LEASE, self.owner)
            if self._fence is not None:
                break
            await asyncio.sleep(LEASE_RETRY_S)  # another scheduler is active
        self._conn = await asyncpg.connect(self._dsn)
        await self._conn.add_listener(WAKE_CHANNEL, lambda *_: self._wake.set())
        self.active = True
        log.info("%s: active (lease epoch %d)", self.name, self._fence.epoch)
        schedule = asyncio.create_task(self._schedule(), name=f"{self.name} schedule")
        keep = asyncio.create_task(self._keep_lease(self._fence), name=f"{self.name} lease")
        try:
            # Whichever ends first (the lease lost, the loop failed) ends both.
            done, _ = await asyncio.wait({schedule, keep}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            await cancel_and_wait([schedule, keep])

    async def _schedule(self) -> None:
        assert self._conn is not None
        await self._recover()
        paused = await self._store.pause_failing(self._settings.max_consecutive_errors)
        if paused:
            log.warning("%s: paused at startup (too many errors in a row): %s", self.name, paused)
        await self._catch_up()
        while True:
            # A full tick means more may be due already: the next one goes at once, without
            # asking Postgres when that is (a backlog drains tick after tick).
            if await self.tick() < self._settings.max_dispatch_per_tick:
                await self._sleep_until_due()
            if self._conn.is_closed():
                raise OSError("the scheduler's LISTEN connection closed")

    async def _keep_lease(self, fence: Fence) -> None:
        """Renew the lease every third of its TTL. Raises StaleClaim when it was taken
        over, or when it could not be renewed before expiring (Postgres unreachable)."""
        ttl = self._claims.ttl_ms / 1000
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                await self._claims.renew(fence)
                renewed = time.monotonic()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if time.monotonic() - renewed >= ttl * 0.9:
                    raise StaleClaim(f"{self.name}: lease not renewed in time ({exc!r})") from exc
                log.warning("%s: renewing the lease failed (%r)", self.name, exc)

    async def _sleep_until_due(self) -> None:
        clamp = self._settings.timer_clamp_ms
        nxt = await self._store.next_due()
        delay_ms = clamp if nxt is None else max(0, min(clamp, nxt - self._now()))
        if delay_ms > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay_ms / 1000)

    async def _recover(self) -> None:
        for run_id, job_id, task_id in await self._store.interrupted_runs():
            if run_id in self._inflight:
                continue  # still ours: the lease came back while it ran
            log.warning("%s: run %s of job %s was interrupted", self.name, run_id, job_id)
            after = await self._store.finish_run(
                job_id,
                run_id,
                result="error",
                error="interrupted: the scheduler stopped while it ran",
                task_id=task_id,
                duration_ms=0,
                max_errors=self._settings.max_consecutive_errors,
            )
            await self._run_queued(after)

    async def _run_queued(self, after: Job | None) -> None:
        """A run that waited (overlap `queue`) for the one that just ended goes now."""
        if after is not None and after.queued and after.enabled and not after.running:
            await self._dispatch(after, keep_schedule=True)

    async def _catch_up(self) -> None:
        now = self._now()
        missed = await self._store.missed(now)
        window = self._settings.catchup_window_ms
        runnable = [
            j
            for j in missed
            if self._settings.catchup_enabled
            and j.next_run is not None
            and (window <= 0 or now - j.next_run <= window)
        ][: self._settings.max_catchup_runs]
        chosen = {j.id for j in runnable}
        for job in missed:
            if job.id not in chosen:
                await self._store.reschedule(
                    job, job.schedule.next_after(now, job.created_at), fence=self._fence
                )
        for i, job in enumerate(runnable):
            if i:
                await asyncio.sleep(self._settings.catchup_stagger_ms / 1000)
            fresh = await self._store.get(job.id)
            if fresh is not None and fresh.enabled:
                await self._dispatch(fresh, catchup=True)

    async def tick(self) -> int:
        """Handle what is due now (at most max_dispatch_per_tick jobs, dispatched or
        skipped, in one commit: `JobStore.dispatch_due`); how many jobs that was."""
        # Cleared before reading what is due: a NOTIFY from here on wakes the next sleep.
        self._wake.clear()
        if self._fence is None:
            raise StaleClaim(f"{self.name}: not the active scheduler")
        now = self._now()
        tasks: dict[str, AgentTask] = {}

        def plan(due: list[Job]) -> tuple[list[Slot], list[Slot]]:
            runs: list[Slot] = []
            skips: list[Slot] = []
            for job in due:
                if job.run_requested:
                    runs.append((job, job.next_run, False))
                    continue
                nxt = job.schedule.next_after(now, job.created_at)
                if job.running and job.overlap != "allow":
                    # Still going: this slot is skipped (or, with `queue`, waits for the end).
                    if nxt is not None and nxt - now < SKIP_RECHECK_MS:
                        nxt = job.schedule.next_after(now + SKIP_RECHECK_MS - 1, job.created_at)
                    skips.append((job, nxt, job.overlap == "queue"))
                else:
                    runs.append((job, nxt, False))
            return runs, skips

        count, started = await self._store.dispatch_due(
            now,
            self._settings.max_dispatch_per_tick,
            self._fence,
            plan,
            lambda job, task_id: self._created(job, task_id, tasks),
        )
        self._start(started, tasks)
        return count

    async def _dispatch(
        self, job: Job, *, catchup: bool = False, keep_schedule: bool = False
    ) -> None:
        """One job outside a tick (a catch-up run, a queued run after its predecessor)."""
        now = self._now()
        nxt = job.next_run if keep_schedule else job.schedule.next_after(now, job.created_at)
        tasks: dict[str, AgentTask] = {}
        if self._fence is None:
            raise StaleClaim(f"{self.name}: not the active scheduler")
        # Only a job still there and enabled under the lease check is started.
        started = await self._store.start_runs(
            [(job, nxt, catchup)],
            now,
            lambda job, task_id: self._created(job, task_id, tasks),
            self._fence,
        )
        self._start(started, tasks)

    def _created(self, job: Job, task_id: str, tasks: dict[str, AgentTask]) -> list[NewEvent]:
        """A dispatched run's task.created (committed with its dispatch), kept in `tasks`."""
        task = replace(self._task(job, task_id), announced=True)
        tasks[task_id] = task
        return [created_event(task, self._settings)]

    def _start(self, started: list[tuple[Job, int, str]], tasks: dict[str, AgentTask]) -> None:
        for job, run_id, task_id in started:
            self.dispatched += 1
            self._inflight.add(run_id)
            # The Ray hop and the run's end are off the tick's path: the next tick does not
            # wait for them.
            run = asyncio.create_task(self._run(job, run_id, tasks[task_id]))
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)

    def _task(self, job: Job, task_id: str) -> AgentTask:
        opts: dict[str, Any] = job.opts
        tools = opts.get("tools")
        return AgentTask(
            task_id=task_id,
            user_uuid=job.user_uuid,
            prompt=job.prompt,
            mode=str(opts.get("mode") or "general"),
            tools=tuple(tools) if isinstance(tools, list) else None,
            timeout_s=float(opts["timeout"]) if opts.get("timeout") else None,
            model=job.model,
        )

    async def _run(self, job: Job, run_id: int, task: AgentTask) -> None:
        started = time.monotonic()
        task_id = task.task_id
        try:
            try:
                outcome: TaskResult = await self._dispatcher.run(task)
                result = {"completed": "ok", "timeout": "timeout"}.get(outcome.status, "error")
                error = outcome.error
            except asyncio.CancelledError:
                raise  # the scheduler stops: the next one records this run as interrupted
            except Exception as exc:  # noqa: BLE001 - a dispatch failure is the run's error
                result, error = "error", f"dispatch failed: {exc!r}"
            after = await self._finish(job.id, run_id, result, error, task_id, started)
        finally:
            self._inflight.discard(run_id)
        await self._run_queued(after)

    async def _finish(
        self, job_id: int, run_id: int, result: str, error: str | None, task_id: str, t0: float
    ) -> Job | None:
        """Record the end of a run, retrying through a database outage (the run is still
        unfinished in Postgres meanwhile, so a scheduler that takes over records it)."""
        for attempt in range(FINISH_ATTEMPTS):
            try:
                return await self._run_store.finish_run(
                    job_id,
                    run_id,
                    result=result,
                    error=error,
                    task_id=task_id,
                    duration_ms=int((time.monotonic() - t0) * 1000),
                    max_errors=self._settings.max_consecutive_errors,
                )
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if attempt == FINISH_ATTEMPTS - 1:
                    raise
                log.warning("%s: recording run %s failed (%r); retrying", self.name, run_id, exc)
                await asyncio.sleep(LEASE_RETRY_S)
        return None

    async def shutdown(self) -> None:
        """Stop scheduling: the loop, then the runs in flight; the lease is given up."""
        loop, self._loop = self._loop, None
        if loop is not None:
            await cancel_and_wait([loop])  # first: it starts no run after this
        await cancel_and_wait(list(self._runs))
        await self._release()
