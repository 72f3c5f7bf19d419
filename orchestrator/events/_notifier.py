"""Waking the feeds: NOTIFY `orch_events` once events have committed, coalesced.

The feeds (the EventBus's `EventFeed`) LISTEN on the channel; a NOTIFY is only a wake-up
(the feed reads the store by position), so a lost one costs a feed's poll interval, never an
event, and many commits need only one.

One rule, used by every write of the writer: the statement that commits the events carries
the NOTIFY when this process has sent none for NOTIFY_COALESCE_S (`carry`): joined to an
autocommitted statement, or sent with a transaction's COMMIT in the same round trip. Its
commit then wakes the feeds and also covers what was owed before it began. A commit that
carries none owes one (`committed(None)`); the notifier's task sends what is owed
NOTIFY_LATE_S after the oldest owed commit, unless a carrier covered it by then.

Why carried, not sent after the commit: a NOTIFY of its own is a round trip (on the caller's
path, or a pool checkout elsewhere; ~40 us a store at 200 a second, issue 17). Why at most
one carrier a window: a notifying transaction holds Postgres' notify-queue lock from its
pre-commit to its end (WAL flush included), so notifying in every commit would serialise the
appenders' commits again; one a window holds it for one commit per window per process.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import asyncpg

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "orch_events"
NOTIFY_COALESCE_S = 0.005  # at most one carried NOTIFY per window, per process
NOTIFY_LATE_S = 0.01  # an owed NOTIFY is sent at most this long after it fell due
# The notifier's own NOTIFY: not flushed (it is a wake-up, not data).
NOTIFY_SQL = (
    f"SELECT set_config('synchronous_commit', 'off', true), pg_notify('{NOTIFY_CHANNEL}', '')"
)
# A NOTIFY carried by an autocommitted statement, joined to it.
CARRIED_JOIN = f" CROSS JOIN (SELECT pg_notify('{NOTIFY_CHANNEL}', '')) AS carried_notify"
# A NOTIFY carried by a transaction's COMMIT, in the same round trip.
CARRIED_COMMIT = f"SELECT pg_notify('{NOTIFY_CHANNEL}', ''); COMMIT"


class FeedNotifier:
    """The feeds' NOTIFY for one process's writes (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        # Monotonic times: the start of the last carried or sent NOTIFY; the first and the
        # last commit owed one since (None: nothing owed).
        self._sent_at = -math.inf
        self._owed_since: float | None = None
        self._owed_latest = -math.inf
        self._task: asyncio.Task[None] | None = None

    @property
    def owed(self) -> bool:
        return self._owed_since is not None

    @property
    def sender(self) -> asyncio.Task[None] | None:
        """The task sending what is owed, if one runs (tests wait for it)."""
        return self._task

    def carry(self) -> float | None:
        """Whether the statement about to commit events carries the NOTIFY: its start
        (monotonic, for `committed`) if so, None if this window's was carried already."""
        now = time.monotonic()
        if now - self._sent_at < NOTIFY_COALESCE_S:
            return None
        self._sent_at = now
        return now

    def committed(self, carried: float | None) -> None:
        """Events have committed: by a statement that carried the NOTIFY (`carried`, what
        `carry` returned for it), which also covers every commit owed before it began; or
        by one that did not, which owes one."""
        if carried is not None:
            if self._owed_since is not None and self._owed_latest <= carried:
                self._owed_since = None
            return
        now = time.monotonic()
        if self._owed_since is None:
            self._owed_since = now
        self._owed_latest = now
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._send_owed(), name="event-notify"
            )

    async def _send_owed(self) -> None:
        while self._owed_since is not None:
            # Not within the window of the last one, and NOTIFY_LATE_S after the oldest owed
            # commit: under a steady stream of writes a statement carries it by then and
            # this sends none; when carriers stall or fail, it is sent anyway.
            wake = max(self._sent_at + NOTIFY_COALESCE_S, self._owed_since + NOTIFY_LATE_S)
            now = time.monotonic()
            if now < wake:
                # Looked at again at least every NOTIFY_LATE_S: a carrier may have covered
                # it meanwhile, or more came.
                await asyncio.sleep(min(wake - now, NOTIFY_LATE_S))
                continue
            self._owed_since = None
            self._sent_at = time.monotonic()
            try:
                await self._pool.execute(NOTIFY_SQL)
            except Exception as exc:  # noqa: BLE001 - the feeds' poll timers catch up
                log.warning("cannot NOTIFY %s (feeds catch up by polling): %r", NOTIFY_CHANNEL, exc)
                return
