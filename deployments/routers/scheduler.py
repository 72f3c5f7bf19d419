"""SPEC part 4, scheduler: jobs that dispatch agent tasks on cron, interval or one-time
schedules. Mutations and the list are admin-only (a non-admin's list is empty); a job's
detail is visible to admins and to its creator. Jobs live in Postgres; the Scheduler
(an actor under Ray) is woken by NOTIFY when they change."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from deployments.deps import AdminUser, Catalog, Config, CurrentUser, Jobs
from orchestrator import wire
from orchestrator.errors import BadRequest, ServiceUnavailable, ValidationFailed
from orchestrator.scheduler import InvalidSchedule, JobSpec, Schedule, at, cron, every, natural

router = APIRouter(tags=["scheduler"])

# POST /schedules/<id>/run answers once the scheduler has dispatched the run: it polls the
# job's row this often, for at most this long (a scheduler's tick is woken by NOTIFY at once).
RUN_POLL_S = 0.05
RUN_WAIT_S = 30.0

MODES = ("build", "plan", "explore", "review", "general", "coordinate")


class JobOpts(BaseModel):
    model_config = ConfigDict(extra="allow")

    mode: Literal["build", "plan", "explore", "review", "general", "coordinate"] | None = None
    tools: list[str] | None = None
    timeout: float | None = Field(None, gt=0, le=86_400, description="Task timeout, seconds")
    tz: str | None = Field(None, description="IANA time zone of cron and phrases (UTC)")
    overlap: Literal["skip", "allow", "queue"] | None = Field(
        None, description="A due job whose run is still going (scheduler_overlap)"
    )


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str | None = Field(None, max_length=100_000, description="Required: the task")
    name: str | None = Field(None, max_length=200)
    cron: str | None = Field(None, max_length=200, description="5-field cron expression")
    every: StrictInt | None = Field(None, description="Interval in ms")
    at: StrictInt | None = Field(None, description="Unix ms, in the future")
    schedule: str | None = Field(None, max_length=200, description="Natural language")
    tz: str | None = Field(None, max_length=64, description="Same as opts.tz")
    model: str | None = Field(None, max_length=256)
    opts: JobOpts | None = None
    delete_after_run: StrictBool = Field(False, description="`at` jobs only")


class PreviewBody(BaseModel):
    """A schedule as create takes it, without the job: what would its next runs be?"""

    model_config = ConfigDict(extra="forbid")

    cron: str | None = Field(None, max_length=200, description="5-field cron expression")
    every: StrictInt | None = Field(None, description="Interval in ms")
    at: StrictInt | None = Field(None, description="Unix ms, in the future")
    schedule: str | None = Field(None, max_length=200, description="Natural language")
    tz: str | None = Field(None, max_length=64, description="IANA time zone (UTC)")
    count: int = Field(5, ge=1, le=50, description="How many next runs")


def _bad(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"{field}: {message}", extra={"fields": [{"field": field, "message": message}]}
    )


def _schedule(body: JobCreate | PreviewBody) -> Schedule:
    given = [k for k in ("cron", "every", "at", "schedule") if getattr(body, k) is not None]
    if len(given) != 1:
        raise _bad(
            "schedule",
            "invalid schedule: give exactly one of cron, every, at or schedule"
            + (f" (got {', '.join(given)})" if given else ""),
        )
    opts = body.opts if isinstance(body, JobCreate) else None
    tz = body.tz or (opts.tz if opts else None)
    try:
        if body.cron is not None:
            return cron(body.cron, tz)
        if body.every is not None:
            return every(body.every)
        if body.at is not None:
            return at(body.at)
        assert body.schedule is not None
        return natural(body.schedule, tz=tz)
    except InvalidSchedule as exc:
        field = str(exc).partition(":")[0] or "schedule"
        raise ValidationFailed(str(exc), extra={"fields": [{"field": field}]}) from exc


def _job_id(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise BadRequest(f"invalid job id {raw[:40]!r}: a positive integer")
    return int(raw)


JobId = Annotated[str, Path(max_length=40, description="The job's integer id")]


@router.post("/schedules", response_model=wire.JobCreated)
async def create_job(
    body: JobCreate, tool_catalog: Catalog, jobs: Jobs, settings: Config, caller: AdminUser
) -> wire.JobCreated:
    """Admin. `prompt` and exactly one of cron, every, at, schedule (natural language)."""
    if body.prompt is None or not body.prompt.strip():
        raise _bad("prompt", "missing prompt")
    schedule = _schedule(body)
    if body.delete_after_run and schedule.type != "at":
        raise _bad("delete_after_run", "only for at jobs")
    opts = body.opts.model_dump(exclude_none=True) if body.opts else {}
    # The job runs as its creator: the tools it names must be theirs (GET /tools).
    unknown = await tool_catalog.unknown(opts.get("tools") or (), caller.user_uuid)
    if unknown:
        raise _bad("opts.tools", f"no tool {unknown[0]!r} (GET /tools lists yours)")
    name = body.name or body.prompt.strip().splitlines()[0][:60]
    spec = JobSpec(
        name=name,
        prompt=body.prompt,
        schedule=schedule,
        model=body.model,
        opts=opts,
        overlap=opts.get("overlap") or settings.scheduler_overlap,
        delete_after_run=body.delete_after_run,
    )
    job = await jobs.create(spec, caller.user_uuid, settings.max_scheduled_jobs)
    return wire.JobCreated(id=job.id, next_run=job.next_run)


@router.post("/schedules/preview", response_model=wire.SchedulePreview)
async def preview_schedule(body: PreviewBody, _: AdminUser) -> wire.SchedulePreview:
    """Admin, as creating is. The next `count` runs of a job with this schedule created now,
    by the scheduler's own schedule code (the console's create form shows them); nothing is
    stored. A bad schedule is the 400 create would give."""
    schedule = _schedule(body)
    now = int(time.time() * 1000)
    runs: list[int] = []
    after = now
    while len(runs) < body.count:
        nxt = schedule.next_after(after, anchor_ms=now)
        if nxt is None:
            break
        runs.append(nxt)
        after = nxt
    return wire.SchedulePreview(
        schedule_type=schedule.type,
        cron_expr=schedule.cron_expr,
        interval_ms=schedule.interval_ms,
        at=schedule.at_ms,
        tz=schedule.tz,
        next_runs=runs,
    )


@router.get("/schedules", response_model=wire.JobPage)
async def list_jobs(
    settings: Config,
    store: Jobs,
    caller: CurrentUser,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per_page: Annotated[int | None, Query(ge=1, le=1000)] = None,
) -> wire.JobPage:
    """Admin: every job; anyone else: an empty list."""
    size = per_page or settings.schedules_per_page
    jobs, total = await store.page(page, size, caller)
    return wire.JobPage(
        items=[wire.Job(**j.summary()) for j in jobs], total=total, page=page, per_page=size
    )


@router.get("/schedules/{job_id}", response_model=wire.JobDetail)
async def get_job(job_id: JobId, jobs: Jobs, caller: CurrentUser) -> Any:
    """Every field of the job; admins and the job's creator (others: 404)."""
    return (await jobs.visible(_job_id(job_id), caller)).detail()


@router.delete("/schedules/{job_id}", response_model=wire.JobStatus)
async def delete_job(job_id: JobId, jobs: Jobs, _: AdminUser) -> wire.JobStatus:
    jid = _job_id(job_id)
    await jobs.delete(jid)
    return wire.JobStatus(status="deleted", id=jid)


@router.post("/schedules/{job_id}/pause", response_model=wire.JobStatus)
async def pause_job(job_id: JobId, jobs: Jobs, _: AdminUser) -> wire.JobStatus:
    jid = _job_id(job_id)
    await jobs.pause(jid)
    return wire.JobStatus(status="paused", id=jid)


@router.post("/schedules/{job_id}/unpause", response_model=wire.JobStatus)
async def unpause_job(job_id: JobId, jobs: Jobs, settings: Config, _: AdminUser) -> wire.JobStatus:
    """409 when max_scheduled_jobs jobs can already run; an active job is left as it is."""
    jid = _job_id(job_id)
    job = await jobs.unpause(jid, settings.max_scheduled_jobs)
    return wire.JobStatus(status="active", id=jid, next_run=job.next_run)


@router.post("/schedules/{job_id}/run", response_model=wire.JobStatus)
async def run_job(job_id: JobId, jobs: Jobs, _: AdminUser) -> wire.JobStatus:
    """Dispatch now, whatever the schedule (400 paused, 409 running). Answers once the
    scheduler has dispatched the run (its task created), with the run's task id; the
    request is durable, so a scheduler that is away dispatches it when it is back: 503
    after RUN_WAIT_S without a dispatch (the run stays asked for)."""
    jid = _job_id(job_id)
    last = await jobs.request_run(jid)
    deadline = time.monotonic() + RUN_WAIT_S
    while (task_id := await jobs.dispatched(jid, last)) is None:
        if time.monotonic() >= deadline:
            raise ServiceUnavailable(
                f"job {jid}: the run is asked for but no scheduler has dispatched it within"
                f" {RUN_WAIT_S:.0f} s; it will be dispatched when the scheduler is back",
                extra={"retry_after": 5},
            )
        await asyncio.sleep(RUN_POLL_S)
    return wire.JobStatus(status="dispatched", id=jid, task_id=task_id)
