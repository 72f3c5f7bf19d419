"""Uptime measured from heartbeats: one row per minute in which some process was serving."""

from __future__ import annotations

import time

import asyncpg

WEEK_MINUTES = 7 * 24 * 60


async def heartbeat(pool: asyncpg.Pool, now: float | None = None) -> None:
    minute = int((time.time() if now is None else now) // 60)
    await pool.execute(
        "INSERT INTO service_heartbeats (minute) VALUES ($1) ON CONFLICT DO NOTHING", minute
    )


async def uptime_ratio(pool: asyncpg.Pool, now: float | None = None) -> float | None:
    """Share of the completed minutes of the last 7 days (since the first heartbeat) that had a
    heartbeat; None while no minute has completed yet."""
    # The current minute is excluded: its heartbeat may simply not have been written yet.
    current = int((time.time() if now is None else now) // 60) - 1
    start = current - WEEK_MINUTES + 1
    row = await pool.fetchrow(
        "SELECT min(minute) AS first, count(*) AS beats FROM service_heartbeats"
        " WHERE minute BETWEEN $1 AND $2",
        start,
        current,
    )
    if row is None or row["first"] is None or row["first"] > current:
        return None
    span = current - max(start, int(row["first"])) + 1
    return min(1.0, int(row["beats"]) / span)


async def prune_heartbeats(pool: asyncpg.Pool, now: float | None = None) -> None:
    current = int((time.time() if now is None else now) // 60)
    await pool.execute(
        "DELETE FROM service_heartbeats WHERE minute < $1", current - 2 * WEEK_MINUTES
    )
