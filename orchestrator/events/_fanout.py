"""Live streams to many clients from one upstream subscription.

An HTTP replica holds one `Fanout`: a single subscription to the EventBus (or to an
in-process feed) and any number of SSE clients, each with its own filter and bounded queue.
If the upstream breaks (the EventBus restarted) or the store fails (reading the head at the
first stream), the pump ends and its supervisor runs it again with backoff: it resubscribes from
the last position it saw, so clients lose nothing and notice nothing.

A stream that cannot start is refused before its `200` (issue 33): `admit` checks the caller
may read what it asks for (403) and that the upstream is subscribed right now, waiting a
little for it (503). The upstream says it is subscribed by yielding an empty batch first
(`EventFeed.subscribe(announce=True)`): a lazy generator or a Ray call proves nothing by
being created.

The per-event work is shared: an event's SSE frame is encoded once per replica, and the pump
hands each client only the (position, frame) pairs its filter admits, into a plain deque with
one wake-up future (no lock, no task per frame). A client's stream writes whatever has piled up
in one chunk, so a client that fell behind catches up in few writes, and never holds up others.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from orchestrator.auth import Principal
from orchestrator.errors import ServiceUnavailable
from orchestrator.events._catalog import stream_name
from orchestrator.events._feed import SubscriberTooSlow
from orchestrator.events._model import Event, owner_scope
from orchestrator.events._store import EventStore
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait

Upstream = Callable[[int], AsyncIterator[list[Event]]]

# How long `admit` waits for the upstream's subscription (the EventBus restarting, the store
# down at the first stream) before the stream is refused with 503; the pump keeps retrying.
START_TIMEOUT_S = 10.0
PING = b": ping\n\n"
# Frames a behind client gets in one write: big enough to catch up in few writes, small
# enough that one write never holds the event loop long.
COALESCE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """Which events a client sees: its tenant (None: every tenant, for admins), one
    aggregate or all, some types or all."""

    user_uuid: str | None = None
    aggregate: str | None = None
    types: frozenset[str] = frozenset()
    min_seq: int = 0  # `from_seq`: only events whose per-aggregate seq is at least this

    def matches(self, event: Event) -> bool:
        return (
            (self.user_uuid is None or event.user_uuid == self.user_uuid)
            and (self.aggregate is None or event.aggregate_id == self.aggregate)
            and event.seq >= self.min_seq
            and (
                not self.types or event.type in self.types or stream_name(event.type) in self.types
            )
        )


@dataclass(eq=False)
class _Client:
    """One stream's pending frames. Only the event loop's thread touches it: the pump appends
    and wakes, the stream's own generator drains; neither ever waits for the other."""

    filter: StreamFilter
    limit: int
    frames: deque[tuple[int, bytes]] = field(default_factory=deque)
    overflowed: bool = False
    waiter: asyncio.Future[None] | None = None
    ping_at: float = 0.0  # loop time at which a silent stream is sent a ping
    timer: asyncio.TimerHandle | None = None

    def offer(self, position: int, frame: bytes) -> None:
        if self.overflowed:
            return
        if len(self.frames) >= self.limit:
            self.overflowed = True  # what is buffered is still written, then the error
        else:
            self.frames.append((position, frame))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until a frame (or the overflow) is offered, or the stream is due a ping."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        # One timer per client, armed while it waits and moved on only when it fires (not
        # re-made for every frame): a write just pushes `ping_at` later.
        if self.timer is None:
            self.timer = loop.call_at(self.ping_at, self._ping_due)
        try:
            await self.waiter
        finally:
            self.waiter = None

    def _ping_due(self) -> None:
        self.timer = None
        loop = asyncio.get_running_loop()
        if loop.time() < self.ping_at:  # written to since: not silent long enough yet
            self.timer = loop.call_at(self.ping_at, self._ping_due)
        elif self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class FanoutStream:
    """One client's stream (see `Fanout.open`): SSE bytes, each chunk one or more whole
    frames (or a ping comment)."""

    def __init__(self, chunks: AsyncIterator[bytes], drop: Callable[[], None]) -> None:
        self._chunks = chunks
        self._drop = drop

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            self._drop()


def sse_frame(event: Event) -> bytes:
    """`id: <position>`, `event: <stream name>`, `data: {id, type, data, aggregate_id, seq,
    timestamp}` (plus version and position). On the stream an event has one name, in both
    places: the stream name (SPEC part 4's `event: <type>` with `data.type`; part 6's colon
    style for workflow types, the store name for the others)."""
    name = stream_name(event.type)
    body = json.dumps({**event.wire(), "type": name}, separators=(",", ":"))
    return f"id: {event.position}\nevent: {name}\ndata: {body}\n\n".encode()


class Fanout:
    def __init__(
        self,
        upstream: Upstream,
        store: EventStore,
        *,
        client_limit: int = 10_000,
        on_clients: Callable[[int], None] | None = None,
        supervisor: Supervisor,
    ) -> None:
        self._upstream = upstream
        self._supervisor = supervisor
        self._store = store
        self._client_limit = client_limit
        self._on_clients = on_clients
        # Clients by the tenant they follow (None: an admin's every tenant): an event is
        # matched against its owner's clients and the admins' only.
        self._clients: dict[str | None, set[_Client]] = {}
        self._count = 0
        self._position = 0
        self._task: asyncio.Task[None] | None = None
        self._positioned = asyncio.Event()  # the store's head read: `_position` is meaningful
        self._live = asyncio.Event()  # a pump run is subscribed upstream right now
        self._frames: OrderedDict[int, bytes] = OrderedDict()

    @property
    def clients(self) -> int:
        return self._count

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

    @property
    def live(self) -> bool:
        """Subscribed upstream now (False while the EventBus is down or restarting)."""
        return self._live.is_set()

    def _spawn(self) -> None:
        if self._task is None:  # set before any await: concurrent first streams share one pump
            self._task = self._supervisor.spawn("event-fanout", self._pump)

    async def admit(
        self, flt: StreamFilter, principal: Principal, *, wait_s: float = START_TIMEOUT_S
    ) -> StreamFilter:
        """Whether a stream may start now, asked before its `200` is sent: `flt` scoped to
        what `principal` may read (another tenant's, for a non-admin: Forbidden), once the
        upstream is subscribed (waits up to `wait_s` for it, then ServiceUnavailable)."""
        scoped = replace(flt, user_uuid=owner_scope(principal, flt.user_uuid))
        self._spawn()
        if not self._live.is_set():
            try:
                await asyncio.wait_for(self._live.wait(), wait_s)
            except TimeoutError:
                raise ServiceUnavailable(
                    "the event stream cannot start: the event bus is not available; retry",
                    headers={"Retry-After": "1"},
                ) from None
        return scoped

    async def _ensure_positioned(self) -> None:
        self._spawn()
        try:
            await asyncio.wait_for(self._positioned.wait(), START_TIMEOUT_S)
        except TimeoutError:
            raise ServiceUnavailable("the event stream is not available yet; retry") from None

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _pump(self) -> None:
        """Follow the upstream from the last position seen. Any failure (the store's head,
        a broken upstream) ends this run; the supervisor logs, counts and runs it again
        after a backoff, so one error never leaves later streams waiting forever. It is
        `live` from the upstream's first batch (its announcement) to the run's end."""
        try:
            if not self._positioned.is_set():
                self._position = await self._store.head()
                self._positioned.set()
            async for batch in self._upstream(self._position):
                self._live.set()
                self._dispatch(batch)
        finally:
            self._live.clear()

    def _dispatch(self, batch: list[Event]) -> None:
        """Offer a batch to the clients that may see each event (no await: a client's
        registration sees either all of it or none)."""
        admins = self._clients.get(None, ())
        for event in batch:
            if event.position <= self._position:
                continue
            self._position = event.position
            owners = self._clients.get(event.user_uuid, ()) if event.user_uuid is not None else ()
            frame: bytes | None = None
            for clients in (owners, admins):
                for client in clients:
                    if client.filter.matches(event):
                        if frame is None:
                            frame = self.frame(event)
                        client.offer(event.position, frame)

    async def open(
        self, flt: StreamFilter, after: int | None, principal: Principal, *, ping_s: float = 15.0
    ) -> FanoutStream:
        """Register a client now and return its stream of what `principal` may read (its
        own events; an admin's `flt.user_uuid` or every tenant's) as SSE bytes: the events
        after `after` (its Last-Event-ID) from the store, then live ones, with a ping comment
        after `ping_s` of silence. Every event committed after this returns is delivered.
        Iterating raises SubscriberTooSlow (after writing what was buffered) if the client
        falls too far behind; `aclose()` unregisters the client (also when never iterated).
        It does not wait for the upstream (see `admit`): a client registered while the
        EventBus restarts gets what commits meanwhile once the pump has resubscribed."""
        flt = replace(flt, user_uuid=owner_scope(principal, flt.user_uuid))
        await self._ensure_positioned()
        client = _Client(flt, self._client_limit)
        # As in EventFeed.subscribe: register and read the position with no await between.
        self._clients.setdefault(flt.user_uuid, set()).add(client)
        self._count += 1
        live_from = self._position
        self._changed()
        return FanoutStream(
            self._deliver(client, after, live_from, ping_s), lambda: self._drop(client)
        )

    def _drop(self, client: _Client) -> None:
        key = client.filter.user_uuid
        clients = self._clients.get(key)
        if clients is not None and client in clients:
            clients.discard(client)
            if not clients:
                del self._clients[key]
            self._count -= 1
            self._changed()

    async def _deliver(
        self, client: _Client, after: int | None, live_from: int, ping_s: float
    ) -> AsyncIterator[bytes]:
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
                frames = [self.frame(e) for e in batch if flt.matches(e)]
                position = batch[-1].position
                if frames:
                    yield b"".join(frames)
            position = max(position, live_from)
            pending = client.frames
            loop = asyncio.get_running_loop()
            client.ping_at = loop.time() + ping_s
            while True:
                if not pending:
                    if client.overflowed:
                        raise SubscriberTooSlow(
                            f"this stream fell more than {self._client_limit} events behind; "
                            f"reconnect with Last-Event-ID {position}"
                        )
                    await client.wait()
                    if not pending and not client.overflowed and loop.time() >= client.ping_at:
                        yield PING
                        client.ping_at = loop.time() + ping_s
                    continue
                # Everything that piled up since the last write, in one write (bounded).
                parts: list[bytes] = []
                size = 0
                while pending and size < COALESCE_BYTES:
                    at, frame = pending.popleft()
                    if at > position:  # the store's catch-up may have sent it already
                        position = at
                        parts.append(frame)
                        size += len(frame)
                if parts:
                    yield parts[0] if len(parts) == 1 else b"".join(parts)
                    client.ping_at = loop.time() + ping_s
        finally:
            client.close()
            self._drop(client)

    def _changed(self) -> None:
        if self._on_clients is not None:
            self._on_clients(self._count)
