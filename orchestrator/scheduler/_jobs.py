"""Scheduled jobs in Postgres. Every change that matters commits with its event, and wakes
the scheduler (`NOTIFY orch_scheduler`) so a new, resumed or run-now job is seen at once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from orchestrator.auth import Principal
from orchestrator.errors import BadRequest, Conflict, NotFound
from orchestrator.events import EventStore, EventTransaction, NewEvent
from orchestrator.runtime.claims import Fence, StaleClaim
from orchestrator.scheduler._schedule import Schedule

WAKE_CHANNEL = "orch_scheduler"
CREATE_LOCK = 947736  # serialises creations and unpauses, so max_scheduled_jobs holds
# The jobs max_scheduled_jobs counts: those that can still run (enabled, with a run ahead or
# asked for). A fired one-time (`at`) job and a paused job do not count.
_LIVE = "enabled AND (next_run IS NOT NULL OR run_requested)"

_COLUMNS = (
    "id, name, user_uuid, prompt, model, opts, schedule_type, cron_expr, interval_ms, at_ms,"
    " tz, overlap, delete_after_run, enabled, next_run, last_run, last_result, last_error,"
    " consecutive_errors, running, queued, run_requested, paused_reason, created_at, updated_at"
)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    prompt: str
    schedule: Schedule
    model: str | None = None
    opts: dict[str, Any] | None = None
    overlap: str = "skip"
    delete_after_run: bool = False


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    name: str
    user_uuid: str
    prompt: str
    model: str | None
    opts: dict[str, Any]
    schedule: Schedule
    overlap: str
    delete_after_run: bool
    enabled: bool
    next_run: int | None
    last_run: int | None
    last_result: str | None
    last_error: str | None
    consecutive_errors: int
    running: int
    queued: bool
    run_requested: bool
    paused_reason: str | None
    created_at: int
    updated_at: int

    def summary(self) -> dict[str, Any]:
        """SPEC part 2's job fields of a list item."""
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "schedule_type": self.schedule.type,
            "enabled": self.enabled,
            "next_run": self.next_run,
            "last_run": self.last_run,
            "consecutive_errors": self.consecutive_errors,
            "created_at": self.created_at,
        }
        if self.schedule.type == "cron":
            out["cron_expr"] = self.schedule.cron_expr
        if self.schedule.type == "every":
            out["interval_ms"] = self.schedule.interval_ms
        if self.schedule.type == "at":
            out["at"] = self.schedule.at_ms
        return out

    def detail(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "prompt": self.prompt,
            "model": self.model,
            "last_result": self.last_result,
            "last_error": self.last_error,
            "user_uuid": self.user_uuid,
            "opts": self.opts,
            "tz": self.schedule.tz,
            "overlap": self.overlap,
            "delete_after_run": self.delete_after_run,
            "running": self.running > 0,
            "paused_reason": self.paused_reason,
            "updated_at": self.updated_at,
        }


def _job(row: asyncpg.Record) -> Job:
    return Job(
        id=row["id"],
        name=row["name"],
        user_uuid=row["user_uuid"],
        prompt=row["prompt"],
        model=row["model"],
        opts=json.loads(row["opts"]) if isinstance(row["opts"], str) else dict(row["opts"]),
        schedule=Schedule(
            row["schedule_type"],
            cron_expr=row["cron_expr"],
            interval_ms=row["interval_ms"],
            at_ms=row["at_ms"],
            tz=row["tz"],
        ),
        overlap=row["overlap"],
        delete_after_run=row["delete_after_run"],
        enabled=row["enabled"],
        next_run=row["next_run"],
        last_run=row["last_run"],
        last_result=row["last_result"],
        last_error=row["last_error"],
        consecutive_errors=row["consecutive_errors"],
        running=row["running"],
        queued=row["queued"],
        run_requested=row["run_requested"],
        paused_reason=row["paused_reason"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _event(job_id: int, type_: str, user: str, **data: Any) -> NewEvent:
    return NewEvent(
        type_, {"job_id": job_id, **{k: v for k, v in data.items() if v is not None}}, user
    )


# A tick's due jobs (`dispatch_due`), read under their row locks in the statement that checks
# the scheduler's claim ($3 kind, $4 key, $5 epoch) and locks it FOR SHARE: no row at all
# when the claim is not at that epoch, one row of NULLs when nothing is due. The run ids
# for them are drawn here (an InitPlan, evaluated once, only when a job is due), so the
# dispatch events can name their tasks in the one statement that writes everything.
_DUE_LOCKED = (
    "SELECT j.*, CASE WHEN j.id IS NULL THEN NULL ELSE"
    " (SELECT array_agg(nextval(pg_get_serial_sequence('scheduled_runs', 'id')))"
    "  FROM generate_series(1, $2)) END AS _run_ids"
    " FROM claims claim LEFT JOIN LATERAL ("
    f"  SELECT {_COLUMNS} FROM scheduled_jobs WHERE enabled AND"
    "  (run_requested OR (next_run IS NOT NULL AND next_run <= $1))"
    "  ORDER BY run_requested DESC, next_run LIMIT $2 FOR UPDATE"
    " ) j ON true"
    " WHERE claim.kind = $3 AND claim.key = $4 AND claim.epoch = $5 FOR SHARE OF claim"
)
# Everything a tick changes, beside its events ($1 now; skips $2-$4; runs $5-$9).
_TICK_CTES = (
    "skipped AS (UPDATE scheduled_jobs SET next_run = x.n, queued = queued OR x.q,"
    " updated_at = $1 FROM unnest($2::bigint[], $3::bigint[], $4::boolean[]) AS x(j, n, q)"
    " WHERE id = x.j RETURNING 1)",
    "runs AS (INSERT INTO scheduled_runs (id, job_id, task_id, catchup, started_at)"
    " SELECT r, j, t, c, $1 FROM unnest($5::bigint[], $6::bigint[], $7::text[], $8::boolean[])"
    " AS x(r, j, t, c) RETURNING 1)",
    "started AS (UPDATE scheduled_jobs SET running = running + 1, last_run = $1,"
    " next_run = x.n, run_requested = false, queued = false, updated_at = $1"
    " FROM unnest($6::bigint[], $9::bigint[]) AS x(j, n) WHERE id = x.j RETURNING 1)",
)
# (job, its next run, catch-up? for a run / queue? for a skip)
Slot = tuple["Job", int | None, bool]


def _dispatched(job: Job, task_id: str, next_run: int | None, catchup: bool) -> NewEvent:
    return _event(
        job.id,
        "scheduler.task_dispatched",
        job.user_uuid,
        task_id=task_id,
        catchup=catchup,
        user_uuid=job.user_uuid,
        scheduled_for=None if job.run_requested else job.next_run,
        next_run=next_run,
    )


class JobStore:
    def __init__(self, pool: asyncpg.Pool, events: EventStore) -> None:
        self._pool = pool
        self._events = events

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    # --- the API's side -------------------------------------------------------------------

    async def create(self, spec: JobSpec, user_uuid: str, max_active: int) -> Job:
        ts = now_ms()
        first = spec.schedule.next_after(ts, ts)
        async with self._events.transaction() as tx:
            await self._check_limit(tx, max_active)
            s = spec.schedule
            row = await tx.conn.fetchrow(
                "INSERT INTO scheduled_jobs (name, user_uuid, prompt, model, opts, schedule_type,"
                " cron_expr, interval_ms, at_ms, tz, overlap, delete_after_run, next_run,"
                " created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,"
                f" $12, $13, $14, $14) RETURNING {_COLUMNS}",
                spec.name,
                user_uuid,
                spec.prompt,
                spec.model,
                json.dumps(spec.opts or {}),
                s.type,
                s.cron_expr,
                s.interval_ms,
                s.at_ms,
                s.tz,
                spec.overlap,
                spec.delete_after_run,
                first,
                ts,
            )
            job = _job(row)
            await tx.append(
                [
                    _event(
                        job.id,
                        "scheduler.job_created",
                        user_uuid,
                        name=job.name,
                        schedule_type=s.type,
                        next_run=first,
                        user_uuid=user_uuid,
                    )
                ]
            )
            await self._wake(tx)
        return job

    @staticmethod
    async def _check_limit(tx: EventTransaction, max_active: int) -> None:
        """409 when `max_active` jobs that can still run exist (under CREATE_LOCK)."""
        await tx.conn.execute("SELECT pg_advisory_xact_lock($1)", CREATE_LOCK)
        active = await tx.conn.fetchval(f"SELECT count(*) FROM scheduled_jobs WHERE {_LIVE}")
        if active >= max_active:
            raise Conflict(
                f"max_scheduled_jobs reached: {active} active jobs (the limit is "
                f"{max_active}); delete or pause some first",
                extra={"active": int(active), "limit": max_active},
            )

    async def get(self, job_id: int, conn: Any = None) -> Job | None:
        row = await (conn or self._pool).fetchrow(
            f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE id = $1", job_id
        )
        return _job(row) if row is not None else None

    async def require(self, job_id: int, conn: Any = None) -> Job:
        job = await self.get(job_id, conn)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    async def visible(self, job_id: int, principal: Principal) -> Job:
        """The job as `principal` may see it: admins any, others only a job they created
        (anything else is not there: 404)."""
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE id = $1 AND ($2 OR user_uuid = $3)",
            job_id,
            principal.is_admin,
            principal.user_uuid,
        )
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return _job(row)

    async def page(self, page: int, per_page: int, principal: Principal) -> tuple[list[Job], int]:
        """Admins: every job. Anyone else: an empty list (SPEC part 5 rule 3), decided here
        so no caller can list jobs by forgetting a check."""
        total = await self._pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE $1", principal.is_admin
        )
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE $3 ORDER BY id LIMIT $1 OFFSET $2",
            per_page,
            (page - 1) * per_page,
            principal.is_admin,
        )
        return [_job(r) for r in rows], int(total)

    async def _locked(self, tx: EventTransaction, job_id: int) -> Job:
        row = await tx.conn.fetchrow(
            f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE id = $1 FOR UPDATE", job_id
        )
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return _job(row)

    @staticmethod
    async def _wake(tx: EventTransaction) -> None:
        await tx.conn.execute(f"NOTIFY {WAKE_CHANNEL}")

    async def delete(self, job_id: int) -> None:
        async with self._events.transaction() as tx:
            job = await self._locked(tx, job_id)
            if job.running:
                raise Conflict(f"job {job_id} is running; try again when it has finished")
            await tx.conn.execute("DELETE FROM scheduled_jobs WHERE id = $1", job_id)
            await self._wake(tx)

    async def pause(self, job_id: int, reason: str = "paused by an admin") -> None:
        async with self._events.transaction() as tx:
            await self._locked(tx, job_id)
            await tx.conn.execute(
                "UPDATE scheduled_jobs SET enabled = false, paused_reason = $2, updated_at = $3,"
                " run_requested = false, queued = false WHERE id = $1",
                job_id,
                reason,
                now_ms(),
            )
            await self._wake(tx)

    async def unpause(self, job_id: int, max_active: int) -> Job:
        """Active again, with its next run computed from now (an errors count starts over);
        409 when that would exceed `max_active` (max_scheduled_jobs). An active job is left
        as it is (same next run, same errors count)."""
        ts = now_ms()
        async with self._events.transaction() as tx:
            job = await self._locked(tx, job_id)
            if job.enabled:
                return job
            nxt = job.schedule.next_after(ts, job.created_at)
            if nxt is not None:  # a fired `at` job comes back with nothing to run: not counted
                await self._check_limit(tx, max_active)
            await tx.conn.execute(
                "UPDATE scheduled_jobs SET enabled = true, paused_reason = NULL, next_run = $2,"
                " consecutive_errors = 0, updated_at = $3 WHERE id = $1",
                job_id,
                nxt,
                ts,
            )
            await self._wake(tx)
        return await self.require(job_id)

    async def request_run(self, job_id: int) -> int:
        """Ask the scheduler for a run now (its next tick dispatches it: `dispatched`). The
        id of the job's last run before this one (0: none), for `dispatched`."""
        async with self._events.transaction() as tx:
            job = await self._locked(tx, job_id)
            if not job.enabled:
                raise BadRequest(f"job {job_id} is disabled (paused); unpause it first")
            if job.running or job.run_requested:
                raise Conflict(f"job {job_id} is already running")
            last = await tx.conn.fetchval(
                "UPDATE scheduled_jobs SET run_requested = true, updated_at = $2 WHERE id = $1"
                " RETURNING (SELECT coalesce(max(id), 0) FROM scheduled_runs WHERE job_id = $1)",
                job_id,
                now_ms(),
            )
            await self._wake(tx)
        return int(last)

    async def dispatched(self, job_id: int, after_run: int) -> str | None:
        """After `request_run`: the task id of the run it became once the scheduler has
        dispatched it (None while it waits). A job deleted or paused before its dispatch:
        NotFound / BadRequest, as the request would have been answered then."""
        row = await self._pool.fetchrow(
            "SELECT j.enabled, j.run_requested, (SELECT task_id FROM scheduled_runs"
            " WHERE job_id = j.id AND id > $2 ORDER BY id LIMIT 1) AS task_id"
            " FROM scheduled_jobs j WHERE j.id = $1",
            job_id,
            after_run,
        )
        if row is None:
            raise NotFound(f"job {job_id} not found")
        if row["task_id"] is not None:
            return str(row["task_id"])
        if not row["enabled"]:
            raise BadRequest(f"job {job_id} is disabled (paused); unpause it first")
        return None

    # --- the scheduler's side -------------------------------------------------------------

    async def due(self, now: int, limit: int) -> list[Job]:
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE enabled AND"
            " (run_requested OR (next_run IS NOT NULL AND next_run <= $1))"
            " ORDER BY run_requested DESC, next_run LIMIT $2",
            now,
            limit,
        )
        return [_job(r) for r in rows]

    async def dispatch_due(
        self,
        now: int,
        limit: int,
        fence: Fence,
        plan: Callable[[list[Job]], tuple[Sequence[Slot], Sequence[Slot]]],
        extra_events: Callable[[Job, str], Sequence[NewEvent]],
    ) -> tuple[int, list[tuple[Job, int, str]]]:
        """One tick in one transaction of four round trips: BEGIN; the claim checked and
        up to `limit` due jobs read under their row locks (with run ids drawn for them) in
        one statement; every change and event in one more (`EventTransaction.write`);
        COMMIT. `plan(due)` splits what was read into runs (job, its next run, catch-up?)
        and skips (job, its next run, queue?), as `start_runs` takes them. A pause or
        DELETE waits for the row lock, so one that has answered is never followed by a
        dispatch. StaleClaim when the claim is not at `fence`'s epoch. How many jobs were
        due, and (job, run id, task id) of each started."""
        async with self._events.transaction() as tx:
            rows = await tx.conn.fetch(_DUE_LOCKED, now, limit, fence.kind, fence.key, fence.epoch)
            if not rows:
                raise StaleClaim(f"{fence.kind} {fence.key}: epoch {fence.epoch} is stale")
            due = [_job(r) for r in rows if r["id"] is not None]
            if not due:
                return 0, []
            runs, skips = plan(due)
            out = await self._write_runs(
                tx, now, runs, list(rows[0]["_run_ids"]), skips, extra_events
            )
        return len(due), out

    async def pause_failing(self, max_errors: int) -> list[int]:
        """On start (SPEC part 4): enabled jobs with `max_errors` or more consecutive errors
        (left so by an older version, or by a lowered setting) are paused, as a pause by an
        admin is (no event); their ids."""
        rows = await self._pool.fetch(
            "UPDATE scheduled_jobs SET enabled = false, run_requested = false,"
            " queued = false, paused_reason = 'auto-paused at startup after '"
            " || consecutive_errors || ' consecutive errors', updated_at = $2"
            " WHERE enabled AND consecutive_errors >= $1 RETURNING id",
            max_errors,
            now_ms(),
        )
        return [r["id"] for r in rows]

    async def next_due(self) -> int | None:
        value = await self._pool.fetchval(
            "SELECT min(CASE WHEN run_requested THEN 0 ELSE next_run END) FROM scheduled_jobs"
            " WHERE enabled AND (run_requested OR next_run IS NOT NULL)"
        )
        return int(value) if value is not None else None

    async def missed(self, now: int) -> list[Job]:
        """Enabled jobs whose next run is past, most overdue first."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE enabled AND next_run < $1"
            " ORDER BY next_run",
            now,
        )
        return [_job(r) for r in rows]

    async def start_runs(
        self,
        runs: Sequence[Slot],
        now: int,
        extra_events: Callable[[Job, str], Sequence[NewEvent]] | None = None,
        fence: Fence | None = None,
    ) -> list[tuple[Job, int, str]]:
        """Record dispatches outside a tick (a catch-up run, a queued run) — (job, its next
        run, catch-up?) each — in one transaction; (job, run id, task id) of each started.
        Under `fence` (the scheduler's lease; StaleClaim if lost) and the jobs' row locks, a
        job deleted or disabled since it was read is left out: a pause or DELETE that has
        answered is never followed by a dispatch. `extra_events(job, task_id)` commit with
        them (the task's task.created)."""
        if not runs:
            return []
        async with self._events.transaction() as tx:
            if fence is not None:
                await fence.check(tx.conn)
            live = {
                r["id"]: r["run_id"]
                for r in await tx.conn.fetch(
                    "SELECT id, nextval(pg_get_serial_sequence('scheduled_runs', 'id'))"
                    " AS run_id FROM scheduled_jobs WHERE id = ANY($1::bigint[]) AND enabled"
                    " ORDER BY id FOR UPDATE",
                    sorted({job.id for job, _, _ in runs}),
                )
            }
            runs = [run for run in runs if run[0].id in live]
            return await self._write_runs(
                tx, now, runs, [live[job.id] for job, _, _ in runs], (), extra_events
            )

    async def _write_runs(
        self,
        tx: EventTransaction,
        now: int,
        runs: Sequence[Slot],
        run_ids: Sequence[int],
        skips: Sequence[Slot],
        extra_events: Callable[[Job, str], Sequence[NewEvent]] | None,
    ) -> list[tuple[Job, int, str]]:
        """In the caller's transaction, holding the jobs' row locks: the runs (with their
        drawn ids) inserted, their jobs moved on, the skipped slots passed, and the
        dispatch events (plus `extra_events`) appended, in one statement (`_TICK_CTES`)."""
        if not runs and not skips:
            return []
        out = [
            (job, run_id, f"job-{job.id}-run-{run_id}")
            for (job, _, _), run_id in zip(runs, run_ids, strict=False)
        ]
        events: list[NewEvent] = []
        for (job, next_run, catchup), (_, _, task_id) in zip(runs, out, strict=True):
            events.append(_dispatched(job, task_id, next_run, catchup))
            if extra_events is not None:
                events.extend(extra_events(job, task_id))
        await tx.write(
            _TICK_CTES,
            [
                now,
                [job.id for job, _, _ in skips],
                [nxt for _, nxt, _ in skips],
                [queue for _, _, queue in skips],
                [run_id for _, run_id, _ in out],
                [job.id for job, _, _ in out],
                [task_id for _, _, task_id in out],
                [catchup for _, _, catchup in runs],
                [nxt for _, nxt, _ in runs],
            ],
            events,
        )
        return out

    async def reschedule(
        self, job: Job, next_run: int | None, *, queue: bool = False, fence: Fence | None = None
    ) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            if fence is not None:
                await fence.check(conn)
            await conn.execute(
                "UPDATE scheduled_jobs SET next_run = $2, queued = queued OR $3, updated_at = $4"
                " WHERE id = $1 AND enabled",
                job.id,
                next_run,
                queue,
                now_ms(),
            )

    async def finish_run(
        self,
        job_id: int,
        run_id: int,
        *,
        result: str,
        error: str | None,
        task_id: str,
        duration_ms: int,
        max_errors: int,
    ) -> Job | None:
        """Record how a run ended; auto-pause after `max_errors` in a row; delete an `at`
        job marked delete_after_run. The job as it is now (None: deleted or gone). Four
        round trips: BEGIN; the run ended and its job read under its row lock in one
        statement; the job's change and its event in one more; COMMIT."""
        ts = now_ms()
        async with self._events.transaction() as tx:
            row = await tx.conn.fetchrow(
                "WITH ended AS (UPDATE scheduled_runs SET finished_at = $3, result = $4,"
                " error = $5 WHERE id = $2 AND finished_at IS NULL RETURNING id)"
                f" SELECT {_COLUMNS}, EXISTS (SELECT 1 FROM ended) AS _ended"
                " FROM scheduled_jobs WHERE id = $1 FOR UPDATE",
                job_id,
                run_id,
                ts,
                result,
                error,
            )
            if row is None:
                return None
            job = _job(row)
            if not row["_ended"]:
                return job  # already recorded (e.g. as interrupted): count it once
            errors = 0 if result == "ok" else job.consecutive_errors + 1
            pause = job.enabled and errors >= max_errors
            reason = (
                f"auto-paused after {errors} consecutive errors (last: {error})" if pause else None
            )
            # As this commit leaves it (under its row lock): no read after it.
            updated = replace(
                job,
                running=max(job.running - 1, 0),
                last_result=result,
                last_error=error,
                consecutive_errors=errors,
                enabled=job.enabled and not pause,
                paused_reason=reason or job.paused_reason,
                updated_at=ts,
            )
            # An `at` job marked delete_after_run goes with its run's end.
            gone = job.delete_after_run and job.schedule.type == "at" and job.next_run is None
            change = (
                ("state AS (DELETE FROM scheduled_jobs WHERE id = $1 RETURNING 1)", [job_id])
                if gone
                else (
                    "state AS (UPDATE scheduled_jobs SET running = $2, last_result = $3,"
                    " last_error = $4, consecutive_errors = $5, enabled = $6,"
                    " paused_reason = $7, updated_at = $8 WHERE id = $1 RETURNING 1)",
                    [
                        job_id,
                        updated.running,
                        result,
                        error,
                        errors,
                        updated.enabled,
                        updated.paused_reason,
                        ts,
                    ],
                )
            )
            await tx.write(
                [change[0]],
                change[1],
                [
                    _event(
                        job_id,
                        "scheduler.job_executed",
                        job.user_uuid,
                        result=result,
                        error=error,
                        task_id=task_id,
                        duration_ms=duration_ms,
                        consecutive_errors=errors,
                        auto_paused=pause or None,
                        reason=reason,
                    )
                ],
            )
        return None if gone else updated

    async def interrupted_runs(self) -> list[tuple[int, int, str]]:
        """(run id, job id, task id) of runs that never finished: their scheduler died."""
        rows = await self._pool.fetch(
            "SELECT id, job_id, task_id FROM scheduled_runs WHERE finished_at IS NULL ORDER BY id"
        )
        return [(r["id"], r["job_id"], r["task_id"]) for r in rows]
