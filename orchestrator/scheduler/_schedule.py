"""When a job runs: `cron` (5 fields, croniter), `every` (ms), `at` (Unix ms), or a
natural-language `schedule` turned into one of those.

Cron: minute hour day-of-month month day-of-week, each a number, `*`, `*/n`, a range `a-b`
(`a-b/n`), or a list `a,b,c`; day-of-week 0-7 with 0 and 7 = Sunday; names (`mon`, `jan`)
too. When both day fields are restricted, a day matching either runs (classic cron).
Times are UTC unless the job has a `tz` (an IANA name such as `Europe/Paris`): cron
expressions and wall-clock phrases are read in that zone.

Natural language (case-insensitive; docs/api/scheduler.md lists these):
- `every N seconds|minutes|hours|days|weeks` (also `every minute`, `every hour`, `every day`)
  -> every
- `every day at 9:00`, `daily at 9am`, `every weekday at 8:30`, `every weekend at 10am`,
  `every monday at 10:30` (any day name, plural too), `every hour at :15`
  -> cron
- `in N seconds|minutes|hours|days`, `tomorrow at 8am`, `today at 17:00`, `at 14:30`
  (the next such time) -> at
"""

from __future__ import annotations

import datetime as dt
import re
import time
import zoneinfo
from dataclasses import dataclass
from typing import Literal

from croniter import CroniterBadDateError, croniter

ScheduleType = Literal["cron", "every", "at"]

# `every` takes any positive integer (SPEC part 4): a job never overlaps itself unless its
# overlap policy is `allow`, so a small interval cannot pile runs up. The ceiling only keeps
# next_run (creation + n intervals) inside a BIGINT.
MAX_EVERY_MS = 2**62
MAX_AHEAD_MS = 10 * 366 * 24 * 3600 * 1000  # an `at` this far ahead at most


class InvalidSchedule(ValueError):
    """The message names what is wrong (it becomes a 400)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    type: ScheduleType
    cron_expr: str | None = None
    interval_ms: int | None = None
    at_ms: int | None = None
    tz: str = "UTC"

    def next_after(self, after_ms: int, anchor_ms: int | None = None) -> int | None:
        """The first run strictly after `after_ms` (Unix ms); None for a past `at`.
        `every` counts from `anchor_ms` (the job's creation), so runs keep their phase."""
        if self.type == "at":
            assert self.at_ms is not None
            return self.at_ms if self.at_ms > after_ms else None
        if self.type == "every":
            assert self.interval_ms is not None
            base = anchor_ms if anchor_ms is not None else after_ms
            if after_ms < base:
                return base + self.interval_ms
            periods = (after_ms - base) // self.interval_ms + 1
            return base + periods * self.interval_ms
        assert self.cron_expr is not None
        zone = zoneinfo.ZoneInfo(self.tz)
        start = dt.datetime.fromtimestamp(after_ms / 1000, zone)
        nxt: dt.datetime = croniter(self.cron_expr, start).get_next(dt.datetime)
        return int(nxt.timestamp() * 1000)


def zone(tz: str | None) -> str:
    name = tz or "UTC"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"tz: unknown time zone {name!r}") from exc
    return name


def cron(expr: str, tz: str | None = None) -> Schedule:
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise InvalidSchedule(
            f"cron: invalid cron expression {expr!r}: 5 fields (minute hour day month weekday)"
        )
    normalised = " ".join(expr.split())
    if not croniter.is_valid(normalised):
        raise InvalidSchedule(f"cron: invalid cron expression {expr!r}")
    schedule = Schedule("cron", cron_expr=normalised, tz=zone(tz))
    try:
        # Valid field by field and still never due (`0 0 31 2 *`: 31 February).
        schedule.next_after(int(time.time() * 1000))
    except CroniterBadDateError:
        raise InvalidSchedule(f"cron: {expr!r} never fires") from None
    return schedule


def every(ms: object) -> Schedule:
    if isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
        raise InvalidSchedule("every: a positive integer of milliseconds")
    if ms > MAX_EVERY_MS:
        raise InvalidSchedule(f"every: at most {MAX_EVERY_MS} ms")
    return Schedule("every", interval_ms=ms)


def at(ms: object, now_ms: int | None = None) -> Schedule:
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    if isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
        raise InvalidSchedule("at: a Unix time in milliseconds (an integer)")
    if ms <= now:
        raise InvalidSchedule("at: must be in the future")
    if ms > now + MAX_AHEAD_MS:
        raise InvalidSchedule("at: at most ten years ahead")
    return Schedule("at", at_ms=ms)


# --- natural language ----------------------------------------------------------------------

_UNITS_MS = {
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
}
_DAYS = {
    "sunday": 0,
    "monday": 1,
    "tuesday": 2,
    "wednesday": 3,
    "thursday": 4,
    "friday": 5,
    "saturday": 6,
}
_DAY_ALIASES = {d[:3]: n for d, n in _DAYS.items()} | _DAYS
_TIME = r"(?P<h>\d{1,2})(?::(?P<m>\d{2}))?\s*(?P<ampm>am|pm)?"


def _unit(word: str) -> int:
    key = word.rstrip("s")
    if key not in _UNITS_MS:
        raise InvalidSchedule(f"schedule: unknown unit {word!r}")
    return _UNITS_MS[key]


def _clock(h: str, m: str | None, ampm: str | None) -> tuple[int, int]:
    hour, minute = int(h), int(m or 0)
    if ampm:
        if not 1 <= hour <= 12:
            raise InvalidSchedule(f"schedule: {h}{ampm} is not a time")
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        raise InvalidSchedule(f"schedule: {h}:{m or '00'} is not a time")
    return hour, minute


def natural(text: str, *, tz: str | None = None, now_ms: int | None = None) -> Schedule:
    """A phrase of the documented list, as a Schedule (or InvalidSchedule saying why)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchedule("schedule: a phrase such as 'every 5 minutes'")
    tz_name = zone(tz)
    phrase = " ".join(text.lower().replace(",", " ").split())
    now = now_ms if now_ms is not None else int(time.time() * 1000)

    if found := re.fullmatch(r"every (?:(?P<n>\d+) )?(?P<unit>[a-z]+)", phrase):
        unit = found.group("unit")
        if unit.rstrip("s") in _UNITS_MS:
            n = int(found.group("n") or 1)
            if n <= 0:
                raise InvalidSchedule("schedule: the interval must be positive")
            return every(n * _unit(unit))
    if found := re.fullmatch(r"every hour at :(?P<m>\d{2})", phrase):
        minute = int(found.group("m"))
        if minute > 59:
            raise InvalidSchedule("schedule: minute must be 0-59")
        return cron(f"{minute} * * * *", tz_name)
    if found := re.fullmatch(
        rf"(?:every (?P<what>day|weekday|weekend|[a-z]+?)s?|daily) at {_TIME}", phrase
    ):
        hour, minute = _clock(found.group("h"), found.group("m"), found.group("ampm"))
        what = found.group("what") or "day"
        if what == "day":
            days = "*"
        elif what == "weekday":
            days = "1-5"
        elif what == "weekend":
            days = "0,6"
        elif what in _DAY_ALIASES:
            days = str(_DAY_ALIASES[what])
        else:
            raise InvalidSchedule(f"schedule: unknown day {what!r}")
        return cron(f"{minute} {hour} * * {days}", tz_name)
    if found := re.fullmatch(r"in (?P<n>\d+) (?P<unit>[a-z]+)", phrase):
        n = int(found.group("n"))
        if n <= 0:
            raise InvalidSchedule("schedule: 'in' needs a positive amount")
        return at(now + n * _unit(found.group("unit")), now)
    if found := re.fullmatch(rf"(?:(?P<day>today|tomorrow) )?at {_TIME}", phrase):
        hour, minute = _clock(found.group("h"), found.group("m"), found.group("ampm"))
        local_now = dt.datetime.fromtimestamp(now / 1000, zoneinfo.ZoneInfo(tz_name))
        when = local_now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        day = found.group("day")
        if day == "tomorrow":
            when += dt.timedelta(days=1)
        elif day is None and when <= local_now:
            when += dt.timedelta(days=1)
        return at(int(when.timestamp() * 1000), now)
    raise InvalidSchedule(
        f"schedule: cannot understand {text!r}; try 'every 5 minutes', 'every day at 9:00', "
        "'every monday at 10:30', 'in 2 hours' or 'tomorrow at 8am'"
    )
