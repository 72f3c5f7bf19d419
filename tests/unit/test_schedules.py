"""Schedules: cron next runs against croniter, every/at arithmetic, natural language."""

from __future__ import annotations

import datetime as dt

import pytest
from croniter import croniter

from orchestrator.scheduler import InvalidSchedule, at, cron, every, natural


def ms(*args: int, tz: dt.tzinfo = dt.UTC) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp() * 1000)


def utc(value: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(value / 1000, dt.UTC)


@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        ("*/15 * * * *", (2026, 1, 1, 0, 7), (2026, 1, 1, 0, 15)),
        ("0 9 * * *", (2026, 3, 31, 9, 0), (2026, 4, 1, 9, 0)),  # strictly after
        ("0 0 31 * *", (2026, 4, 1, 0, 0), (2026, 5, 31, 0, 0)),  # skips a 30-day month
        ("0 12 29 2 *", (2026, 3, 1, 0, 0), (2028, 2, 29, 12, 0)),  # next leap day
        ("30 10 * * 0", (2026, 11, 22, 10, 30), (2026, 11, 29, 10, 30)),  # Sunday = 0
        ("30 10 * * 7", (2026, 11, 21, 0, 0), (2026, 11, 22, 10, 30)),  # 7 = Sunday too
        ("0 8-10 * * 1-5", (2026, 11, 20, 10, 0), (2026, 11, 23, 8, 0)),  # ranges: Fri->Mon
        ("5,35 * * * *", (2026, 1, 1, 0, 5), (2026, 1, 1, 0, 35)),  # lists
        ("0 0 1 */3 *", (2026, 2, 1, 0, 0), (2026, 4, 1, 0, 0)),
        ("59 23 31 12 *", (2026, 12, 31, 23, 59), (2027, 12, 31, 23, 59)),  # year end
    ],
)
def test_cron_next_run(expr: str, start: tuple[int, ...], expected: tuple[int, ...]) -> None:
    got = cron(expr).next_after(ms(*start))
    assert got == ms(*expected)
    reference = croniter(expr, dt.datetime(*start, tzinfo=dt.UTC)).get_next(dt.datetime)
    assert got == int(reference.timestamp() * 1000)


def test_cron_in_a_time_zone() -> None:
    paris = cron("0 9 * * *", "Europe/Paris")
    assert utc(paris.next_after(ms(2026, 7, 1, 0, 0))) == dt.datetime(
        2026, 7, 1, 7, 0, tzinfo=dt.UTC
    )
    assert utc(paris.next_after(ms(2026, 1, 1, 0, 0))) == dt.datetime(
        2026, 1, 1, 8, 0, tzinfo=dt.UTC
    )


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "61 * * * *",
        "* 24 * * *",
        "* * 32 * *",
        "* * * 13 *",
        "a b c d e",
        "* * * * * *",
    ],
)
def test_bad_cron(expr: str) -> None:
    with pytest.raises(InvalidSchedule, match="cron: invalid cron expression"):
        cron(expr)


def test_every_keeps_its_phase() -> None:
    job = every(60_000)
    anchor = ms(2026, 1, 1, 0, 0)
    assert job.next_after(anchor, anchor) == anchor + 60_000
    assert job.next_after(anchor + 90_000, anchor) == anchor + 120_000  # missed: next slot
    assert job.next_after(anchor + 120_000, anchor) == anchor + 180_000
    for bad in (0, -5, 1.5, "60000", True, 2**63):
        with pytest.raises(InvalidSchedule, match="every"):
            every(bad)
    # Issue 33: any positive integer (a job does not overlap itself unless `allow`).
    assert every(1).next_after(anchor + 5, anchor) == anchor + 6
    assert every(999).interval_ms == 999


def test_at() -> None:
    now = ms(2026, 1, 1)
    job = at(now + 5000, now)
    assert job.next_after(now, None) == now + 5000
    assert job.next_after(now + 5000, None) is None
    with pytest.raises(InvalidSchedule, match="at: must be in the future"):
        at(now - 1, now)
    with pytest.raises(InvalidSchedule, match="at: a Unix time"):
        at("tomorrow", now)
    with pytest.raises(InvalidSchedule, match="ten years"):
        at(2**62, now)  # would overflow a bigint once an interval is added


NOW = ms(2026, 11, 22, 14, 0)  # a Sunday


@pytest.mark.parametrize(
    ("phrase", "kind", "value"),
    [
        ("every 5 minutes", "every", 300_000),
        ("Every minute", "every", 60_000),
        ("every 2 hours", "every", 7_200_000),
        ("every day", "every", 86_400_000),
        ("every 30 seconds", "every", 30_000),
        ("every day at 9:00", "cron", "0 9 * * *"),
        ("daily at 6pm", "cron", "0 18 * * *"),
        ("every monday at 10:30", "cron", "30 10 * * 1"),
        ("every fridays at 5pm", "cron", "0 17 * * 5"),
        ("every weekday at 8:30", "cron", "30 8 * * 1-5"),
        ("every weekend at 10am", "cron", "0 10 * * 0,6"),
        ("every hour at :15", "cron", "15 * * * *"),
        ("every sun at 12am", "cron", "0 0 * * 0"),
        ("in 2 hours", "at", NOW + 7_200_000),
        ("in 10 minutes", "at", NOW + 600_000),
        ("tomorrow at 8am", "at", ms(2026, 11, 23, 8, 0)),
        ("today at 17:00", "at", ms(2026, 11, 22, 17, 0)),
        ("at 9:00", "at", ms(2026, 11, 23, 9, 0)),  # already past today: tomorrow
    ],
)
def test_natural_language(phrase: str, kind: str, value: object) -> None:
    got = natural(phrase, now_ms=NOW)
    assert got.type == kind
    assert {"every": got.interval_ms, "cron": got.cron_expr, "at": got.at_ms}[kind] == value


def test_natural_language_in_a_time_zone() -> None:
    got = natural("tomorrow at 8am", tz="America/New_York", now_ms=NOW)
    assert utc(got.at_ms or 0) == dt.datetime(2026, 11, 23, 13, 0, tzinfo=dt.UTC)
    assert natural("every day at 9:00", tz="Asia/Tokyo").tz == "Asia/Tokyo"


@pytest.mark.parametrize(
    ("phrase", "message"),
    [
        ("whenever", "cannot understand"),
        ("every 0 minutes", "positive"),
        ("every day at 25:00", "not a time"),
        ("every funday at 9:00", "unknown day"),
        ("today at 9am", "in the future"),  # 9am has passed at 14:00
        ("in 3 fortnights", "unknown unit"),
        ("in 99999999999999 days", "ten years"),
        ("", "schedule"),
    ],
)
def test_natural_language_errors(phrase: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        natural(phrase, now_ms=NOW)
    with pytest.raises(InvalidSchedule, match="tz"):
        natural("every day at 9:00", tz="Mars/Olympus")
