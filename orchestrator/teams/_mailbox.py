"""Waiting for team mail (`team_receive`): woken by the events' NOTIFY, with a poll fallback.

No second mechanism: a mail commits with its `team.mail_sent` event, and every commit of
events carries or owes the store's NOTIFY on `orch_events` (orchestrator/events/_notifier.py).
One LISTEN connection per process (opened on the first wait) wakes every waiter of the
process, each of which then looks for its own mail (one indexed UPDATE). A mail sent from
this process wakes its waiters at once (`poke`). A lost notification, or no listening
connection, costs at most `team_receive_poll_s`, never a mail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from orchestrator.events import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

__all__ = ["MailWaker"]

T = TypeVar("T")
# Waiters woken by a burst of unrelated events look again at most this often.
MIN_RECHECK_S = 0.02


class MailWaker:
    """This process's wake-ups for mail waiters (see the module docstring)."""

    def __init__(self, dsn: str | None, poll_s: float) -> None:
        self._dsn = dsn
        self._poll_s = poll_s
        self._wake = asyncio.Event()
        self._listener: asyncpg.Connection | None = None
        self._connecting = asyncio.Lock()
        self._waiters = 0

    def poke(self) -> None:
        """Mail was sent from here: waiters look now."""
        self._wake.set()
        self._wake = asyncio.Event()

    async def close(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            with contextlib.suppress(Exception):
                await self._listener.close()
        self._listener = None

    async def _listen(self) -> None:
        if self._dsn is None or (self._listener is not None and not self._listener.is_closed()):
            return
        async with self._connecting:  # one connection, however many waiters start at once
            if self._listener is not None and not self._listener.is_closed():
                return
            try:
                conn = await asyncpg.connect(self._dsn, timeout=5)
                await conn.add_listener(NOTIFY_CHANNEL, lambda *_: self.poke())
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("team mail: cannot LISTEN (polling meanwhile): %r", exc)
                return
            self._listener = conn

    async def wait_for(self, look: Callable[[], Awaitable[T | None]], timeout_s: float) -> T | None:
        """`look()` until it finds something or `timeout_s` has passed (None then)."""
        await self._listen()
        deadline = time.monotonic() + timeout_s
        self._waiters += 1
        try:
            while True:
                woken = self._wake  # before looking: a poke during the look is not missed
                found = await look()
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=min(left, self._poll_s))
                await asyncio.sleep(MIN_RECHECK_S)
        finally:
            self._waiters -= 1
