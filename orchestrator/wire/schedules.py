"""Scheduled jobs (SPEC parts 2 and 4, scheduler)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from orchestrator.wire._base import ApiModel, left_out_when_none

__all__ = ["Job", "JobCreated", "JobDetail", "JobPage", "JobStatus", "SchedulePreview"]


def _detail_only() -> Any:
    """SPEC part 2's "detail view only" fields: None in a list item, and then not sent."""
    return Field(None, exclude_if=left_out_when_none)


class JobCreated(ApiModel):
    status: Literal["ok"] = "ok"
    id: int
    next_run: int | None


class Job(ApiModel):
    """A scheduled job (SPEC part 2). A list item carries the summary fields: the detail-view
    fields (`prompt`, `model`, `last_result`, `last_error`, `user_uuid`, `running`) are None
    there, and not sent. Jobs carry more fields than these (`at`, `opts`, `tz`, ...)."""

    model_config = ConfigDict(extra="allow")

    id: int
    name: str
    schedule_type: str
    enabled: bool
    next_run: int | None
    last_run: int | None
    consecutive_errors: int
    created_at: int
    cron_expr: str | None = None
    interval_ms: int | None = None
    prompt: str | None = _detail_only()
    model: str | None = _detail_only()
    last_result: str | None = _detail_only()
    last_error: str | None = _detail_only()
    user_uuid: str | None = _detail_only()
    running: bool | None = _detail_only()


class JobDetail(Job):
    """GET /schedules/{id}: every field of the job, the detail-view ones always sent."""

    prompt: str
    model: str | None
    last_result: str | None
    last_error: str | None
    user_uuid: str
    running: bool


class JobPage(ApiModel):
    items: list[Job]
    total: int
    page: int
    per_page: int


class JobStatus(ApiModel):
    status: str
    id: int
    next_run: int | None = None
    task_id: str | None = None  # run: the dispatched run's task


class SchedulePreview(ApiModel):
    """The next runs a job with a schedule would have if created now (nothing stored)."""

    status: Literal["ok"] = "ok"
    schedule_type: str
    cron_expr: str | None = None
    interval_ms: int | None = None
    at: int | None = None
    tz: str
    next_runs: list[int] = Field(description="Unix ms, soonest first; fewer for an `at` job")
