"""The scheduler: schedules (cron, every, at, natural language), jobs in Postgres, and the
service that fires them as agent tasks."""

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

__all__ = [
    "InvalidSchedule",
    "Schedule",
    "ScheduleType",
    "at",
    "cron",
    "every",
    "natural",
    "zone",
]
