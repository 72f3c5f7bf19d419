"""Following the store's head and handing new events to subscribers.

One `EventFeed` per process that fans out (the EventBus actor, or an app served without
Ray). `LISTEN` wakes it when an append commits; a short timer wakes it too, so a lost
notification (or a dropped listening connection) can delay an event, never lose it.
Subscribers each get a bounded queue: one that falls behind is cut off with
`SubscriberTooSlow` instead of slowing the others, and can resubscribe from its position.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from orchestrator.errors import ServiceUnavailable
from orchestrator.events._model import Event
from orchestrator.events._notifier import NOTIFY_CHANNEL
from orchestrator.events._store import EventStore
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait

log = logging.getLogger(__name__)

BatchHook = Callable[[list[Event]], Awaitable[None]]
IN_FLIGHT_POLL_S = 0.05


class SubscriberTooSlow(ServiceUnavailable):
    """The subscriber's buffer overflowed; resubscribe from the last position it saw."""


@dataclass(eq=False)
class _Subscriber:
    limit: int
    queue: asyncio.Queue[list[Event] | None] = field(default_factory=asyncio.Queue)
    pending: int = 0
    overflowed: bool = False

    def offer(self, batch: list[Event]) -> None:
        if self.overflowed:
            return
        if self.pending + len(batch) > self.limit:
            self.overflowed = True
            self.queue.put_nowait(None)  # wakes the reader, which then raises
            return
        self.pending += len(batch)
        self.queue.put_nowait(batch)


class EventFeed:
    def __init__(
        self,
        store: EventStore,
        dsn: str,
        *,
        poll_s: float = 0.5,
        batch: int = 500,
        subscriber_limit: int = 50_000,
        on_batch: BatchHook | None = None,
        supervisor: Supervisor,
    ) -> None:
        self._store = store
        self._supervisor = supervisor
        self._dsn = dsn
        self._poll_s = poll_s
        # A store that cannot be read: twice the poll after a first failure, up to 5 s.
        self._backoff = Backoff(base=2 * poll_s, cap=5.0)
        self._batch = batch
        self._limit = subscriber_limit
        self._on_batch = on_batch
        self._subscribers: set[_Subscriber] = set()
        self._wake = asyncio.Event()
        self._head = 0
        self._listener: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def head(self) -> int:
        return self._head

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def start(self) -> None:
        self._head = await self._store.head()
        await self._listen()
        self._task = self._supervisor.spawn("event-feed", self._run)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self._listener is not None and not self._listener.is_closed():
            await self._listener.close()

    def poke(self) -> None:
        """Look for new events now (the appender knows it just committed some)."""
        self._wake.set()

    async def subscribe(self, after: int, *, announce: bool = False) -> AsyncIterator[list[Event]]:
        """Every event after position `after`, in order, in batches: first from the store,
        then live. Raises SubscriberTooSlow if this subscriber falls too far behind.
        `announce`: first an empty batch once registered, so a follower in another process
        (a replica's Fanout, through the EventBus) knows it is subscribed before any event."""
        sub = _Subscriber(self._limit)
        # Registration and reading the head happen without an await in between, so every
        # event after `live_from` reaches the queue and every one up to it is in the store.
        self._subscribers.add(sub)
        live_from = self._head
        try:
            if announce:
                yield []
            position = after
            while position < live_from:
                batch = [
                    e
                    for e in await self._store.read_after(position, self._batch)
                    if e.position <= live_from
                ]
                if not batch:
                    break
                yield batch
                position = batch[-1].position
            while True:
                live = await sub.queue.get()
                if live is None:
                    raise SubscriberTooSlow(
                        f"subscriber fell more than {self._limit} events behind; "
                        f"resubscribe after position {position}"
                    )
                sub.pending -= len(live)
                fresh = [e for e in live if e.position > position]
                if fresh:
                    yield fresh
                    position = fresh[-1].position
        finally:
            self._subscribers.discard(sub)

    async def _listen(self) -> None:
        try:
            conn = await asyncpg.connect(self._dsn, timeout=5)
            await conn.add_listener(NOTIFY_CHANNEL, self._notified)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("cannot LISTEN for events (polling meanwhile): %r", exc)
            return
        self._listener = conn

    def _notified(self, *_args: object) -> None:
        self._wake.set()

    async def _run(self) -> None:
        """Wake on NOTIFY or the poll timer and hand new events on. A store that cannot be
        read is waited out here with backoff; any other failure ends the run and the
        supervisor restarts it (logged, counted), resuming from the head already reached."""
        failures = 0
        while True:
            backoff = self._backoff.delay(failures) if failures else self._poll_s
            # An append in flight may hold committed events back; if it rolls back, no NOTIFY
            # says so: look again soon.
            wait = min(backoff, IN_FLIGHT_POLL_S) if self._store.in_flight else backoff
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            self._wake.clear()
            try:
                await self._advance()
                failures = 0
                if self._listener is None or self._listener.is_closed():
                    await self._listen()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("event feed cannot read the store: %r", exc)
                failures += 1

    async def _advance(self) -> None:
        while True:
            batch = await self._store.read_after(self._head, self._batch)
            if not batch:
                return
            # Offer and move the head with no await in between (see `subscribe`).
            for sub in list(self._subscribers):
                sub.offer(batch)
            self._head = batch[-1].position
            if self._on_batch is not None:
                try:
                    await self._on_batch(batch)
                except Exception:
                    log.exception("event feed batch hook failed")
            if len(batch) < self._batch:
                return
