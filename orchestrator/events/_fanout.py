"""Live streams to many clients from one upstream subscription.

An HTTP replica holds one `Fanout`: a single subscription to the EventBus (or to an
in-process feed) and any number of SSE clients, each with its own filter and bounded queue.
If the upstream breaks (the EventBus restarted) or the store fails (reading the head at the
first stream), the pump ends and its supervisor runs it again with backoff: it resubscribes from
the last position it saw, so clients lose nothing and notice nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from orchestrator.auth import Principal
from orchestrator.errors import ServiceUnavailable
from orchestrator.events._catalog import stream_name
from orchestrator.events._feed import SubscriberTooSlow
from orchestrator.events._model import Event, owner_scope
from orchestrator.events._store import EventStore
from orchestrator.runtime.supervisor import Supervisor

Upstream = Callable[[int], AsyncIterator[list[Event]]]

# How long a stream waits for the pump's first subscription (the store down at the
# first stream) before it answers 503; the pump itself keeps retrying.
START_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """Which events a client sees: its tenant (None: every tenant, for admins), one
    aggregate or all, some types or all."""

    user_uuid: str | None = None
    aggregate: str | None = None
    types: frozenset[str] = frozenset()

    def matches(self, event: Event) -> bool:
        return (
            (self.user_uuid is None or event.user_uuid == self.user_uuid)
            and (self.aggregate is None or event.aggregate_id == self.aggregate)
            and (
                not self.types or event.type in self.types or stream_name(event.type) in self.types
            )
        )


@dataclass(eq=False)
class _Client:
    filter: StreamFilter
    limit: int
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    overflowed: bool = False

    def offer(self, event: Event) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.limit:
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(event)


class FanoutStream:
    """One client's stream (see `Fanout.open`)."""

    def __init__(self, events: AsyncIterator[Event], drop: Callable[[], None]) -> None:
        self._events = events
        self._drop = drop

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events

    async def aclose(self) -> None:
        try:
            await self._events.aclose()  # type: ignore[attr-defined]
        finally:
            self._drop()


def sse_frame(event: Event) -> bytes:
    """`id: <position>`, `event: <stream name>`, `data: {id, type, data, aggregate_id, seq,
    timestamp}` (plus version and position)."""
    body = json.dumps(event.wire(), separators=(",", ":"))
    return f"id: {event.position}\nevent: {stream_name(event.type)}\ndata: {body}\n\n".encode()


class Fanout:
    def __init__(
        self,
        upstream: Upstream,
        store: EventStore,
        *,
        client_limit: int = 10_000,
        on_clients: Callable[[int], None] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._upstream = upstream
        self._supervisor = supervisor or Supervisor("fanout")
        self._store = store
        self._client_limit = client_limit
        self._on_clients = on_clients
        self._clients: set[_Client] = set()
        self._position = 0
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._frames: OrderedDict[int, bytes] = OrderedDict()

    @property
    def clients(self) -> int:
        return len(self._clients)

    @property
    def position(self) -> int:
        return self._position

    def frame(self, event: Event) -> bytes:
        """The SSE frame of an event, encoded once however many clients receive it."""
        cached = self._frames.get(event.position)
        if cached is None:
            cached = self._frames[event.position] = sse_frame(event)
            if len(self._frames) > 4096:
                self._frames.popitem(last=False)
        return cached

    async def _ensure_started(self) -> None:
        if self._task is None:  # set before any await: concurrent first streams share one pump
            self._task = self._supervisor.spawn("event-fanout", self._pump)
        try:
            await asyncio.wait_for(self._started.wait(), START_TIMEOUT_S)
        except TimeoutError:
            raise ServiceUnavailable("the event stream is not available yet; retry") from None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _pump(self) -> None:
        """Follow the upstream from the last position seen. Any failure (the store's head,
        a broken upstream) ends this run; the supervisor logs, counts and runs it again
        after a backoff, so one error never leaves later streams waiting forever."""
        if not self._started.is_set():
            self._position = await self._store.head()
        stream = self._upstream(self._position)
        self._started.set()
        async for batch in stream:
            for event in batch:
                if event.position <= self._position:
                    continue
                for client in list(self._clients):
                    if client.filter.matches(event):
                        client.offer(event)
                self._position = event.position

    async def open(
        self, flt: StreamFilter, after: int | None, principal: Principal
    ) -> FanoutStream:
        """Register a client now and return its stream of what `principal` may read (its
        own events; an admin's `flt.user_uuid` or every tenant's): the events after `after`
        (its Last-Event-ID) from the store, then live ones. Every event committed after this
        returns is delivered. Iterating raises SubscriberTooSlow if the client falls too far
        behind; `aclose()` unregisters the client (also when it was never iterated)."""
        flt = replace(flt, user_uuid=owner_scope(principal, flt.user_uuid))
        await self._ensure_started()
        client = _Client(flt, self._client_limit)
        # As in EventFeed.subscribe: register and read the position with no await between.
        self._clients.add(client)
        live_from = self._position
        self._changed()
        return FanoutStream(self._deliver(client, after, live_from), lambda: self._drop(client))

    def _drop(self, client: _Client) -> None:
        if client in self._clients:
            self._clients.discard(client)
            self._changed()

    async def _deliver(
        self, client: _Client, after: int | None, live_from: int
    ) -> AsyncIterator[Event]:
        flt = client.filter
        try:
            position = after if after is not None else live_from
            while position < live_from:
                batch = [
                    e
                    for e in await self._store.read_after(position, 500)
                    if e.position <= live_from
                ]
                if not batch:
                    break
                for event in batch:
                    if flt.matches(event):
                        yield event
                position = batch[-1].position
            position = max(position, live_from)
            while True:
                live = await client.queue.get()
                if live is None:
                    raise SubscriberTooSlow(
                        f"this stream fell more than {self._client_limit} events behind; "
                        f"reconnect with Last-Event-ID {position}"
                    )
                if live.position > position:
                    position = live.position
                    yield live
        finally:
            self._drop(client)

    def _changed(self) -> None:
        if self._on_clients is not None:
            self._on_clients(len(self._clients))
