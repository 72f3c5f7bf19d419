"""The EventBus actor: one LISTEN connection for the cluster, live batches to the HTTP
replicas (each holds one subscription and fans out to its own SSE clients), and the
projections that follow the store (event counts for svc_event_total)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors import Generation, lookup
from actors.host import ActorHost
from orchestrator.config import Settings
from orchestrator.events import Event, EventServices
from orchestrator.services import EventBusServices, build_services

KIND = "EventBus"


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000
)
class EventBus(ActorHost):
    def __init__(self, settings: Settings, generation: Generation) -> None:
        super().__init__("event_bus", settings, generation)
        self._services: EventServices | None = None
        # The live feed (under the supervisor: restarts reach /metrics through the flush).
        self._booted = self._boot(self._start)

    def __repr__(self) -> str:
        if self._services is None:
            return "EventBus(starting)"
        feed = self._services.feed
        return f"EventBus(head={feed.head}, subscribers={feed.subscribers})"

    async def _start(self, opened: contextlib.AsyncExitStack) -> EventServices:
        # A failed try's pool is closed with `opened`: the next makes a new one.
        core = await build_services(
            self._settings, EventBusServices, opened, recorder=self._recorder
        )
        dsn = self._settings.database_url or ""
        services = EventServices(core.events, dsn, self._recorder, self._supervisor)
        opened.push_async_callback(services.stop)
        await services.start()
        self._services = services
        return services

    async def head(self) -> int:
        return (await self._booted).feed.head

    async def poke(self) -> None:
        (await self._booted).feed.poke()

    # Backpressure: a replica that stops consuming pauses this generator, so its feed queue
    # fills and overflows (SubscriberTooSlow) instead of Ray's object store filling up.
    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=64)
    async def subscribe(self, after: int) -> AsyncIterator[list[Event]]:
        """Every committed event after `after`, in batches (a streaming generator), after
        an empty first batch that says the subscription is made (the replica's readiness)."""
        services = await self._booted
        async for batch in services.feed.subscribe(after, announce=True):
            yield batch


class ActorEventSource:
    """A replica's upstream: its generation's EventBus's `subscribe`, as an async iterator of
    batches. Ray restarts a killed bus under the same handle; one not (yet) running is looked
    up again on the next subscription."""

    def __init__(self, generation: Generation) -> None:
        self._generation = generation
        self._actor: Any = None

    def start(self) -> None:
        self._actor = lookup(self._generation.name(KIND))

    async def subscribe(self, after: int) -> AsyncIterator[list[Event]]:
        if self._actor is None:
            self.start()
        try:
            async for ref in self._actor.subscribe.remote(after):
                yield await ref
        except RayActorError:
            self._actor = None  # dead for good, or restarting: look it up again next time
            raise
