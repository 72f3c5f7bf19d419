"""The scheduler: schedules (cron, every, at, natural language), jobs in Postgres, and the
service that fires them as agent tasks."""

from orchestrator.scheduler._jobs import WAKE_CHANNEL, Job, JobSpec, JobStore
from orchestrator.scheduler._schedule import (
    InvalidSchedule,
    Schedule,
    ScheduleType,
    at,
    cron,
    every,
    natural,
    zone,
)
from orchestrator.scheduler._service import SchedulerService

__all__ = [
    "WAKE_CHANNEL",
    "InvalidSchedule",
    "Job",
    "JobSpec",
    "JobStore",
    "Schedule",
    "ScheduleType",
    "SchedulerService",
    "at",
    "cron",
    "every",
    "natural",
    "zone",
]
