"""Waiting for team mail (`team_receive`): woken by a NOTIFY of the mail itself, with a poll
fallback.

A mail's transaction sends `pg_notify('orch_team_mail', '<team id>:<recipient>')` (the
store's `_mail`), delivered at its commit. One LISTEN connection per process (opened on
the first wait) hears them and wakes only the waiters of that mailbox, each of which then
takes its mail (one indexed UPDATE). Listening on the events' channel instead woke every
waiter on every event of the system, ~50 UPDATEs/s per waiter on a busy one. A mail sent
from this process wakes its mailbox's waiters at once (`poke`). A lost notification, or no
listening connection, costs at most `team_receive_poll_s`, never a mail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

log = logging.getLogger(__name__)

__all__ = ["MAIL_CHANNEL", "MailWaker", "mailbox"]

T = TypeVar("T")
MAIL_CHANNEL = "orch_team_mail"


def mailbox(team_id: str, recipient: str) -> str:
    """The key of `recipient`'s mailbox in team `team_id` (the NOTIFY payload)."""
    return f"{team_id}:{recipient}"


class MailWaker:
    """This process's wake-ups for mail waiters (see the module docstring)."""

    def __init__(self, dsn: str | None, poll_s: float) -> None:
        self._dsn = dsn
        self._poll_s = poll_s
        self._wake: dict[str, asyncio.Event] = {}  # a mailbox's waiters' event
        self._waiting: Counter[str] = Counter()
        self._listener: asyncpg.Connection | None = None
        self._connecting = asyncio.Lock()

    def poke(self, box: str | None = None) -> None:
        """Mail came to mailbox `box` (None: to any): its waiters in this process look now."""
        for key in list(self._wake) if box is None else [box]:
            woken = self._wake.get(key)
            if woken is not None:
                woken.set()
                self._wake[key] = asyncio.Event()

    async def close(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            with contextlib.suppress(Exception):
                await self._listener.close()
        self._listener = None

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.poke(payload)

    async def _listen(self) -> None:
        if self._dsn is None or (self._listener is not None and not self._listener.is_closed()):
            return
        async with self._connecting:  # one connection, however many waiters start at once
            if self._listener is not None and not self._listener.is_closed():
                return
            try:
                conn = await asyncpg.connect(self._dsn, timeout=5)
                await conn.add_listener(MAIL_CHANNEL, self._heard)
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("team mail: cannot LISTEN (polling meanwhile): %r", exc)
                return
            self._listener = conn

    async def wait_for(
        self, box: str, look: Callable[[], Awaitable[T | None]], timeout_s: float
    ) -> T | None:
        """`look()` (for mail in mailbox `box`) until it finds something or `timeout_s` has
        passed (None then)."""
        await self._listen()
        deadline = time.monotonic() + timeout_s
        self._waiting[box] += 1
        self._wake.setdefault(box, asyncio.Event())
        try:
            while True:
                woken = self._wake[box]  # before looking: a poke during the look is not missed
                found = await look()
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=min(left, self._poll_s))
        finally:
            self._waiting[box] -= 1
            if self._waiting[box] <= 0:
                del self._waiting[box]
                self._wake.pop(box, None)
