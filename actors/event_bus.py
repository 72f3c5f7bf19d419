"""The EventBus actor: one LISTEN connection for the cluster, live batches to the HTTP
replicas (each holds one subscription and fans out to its own SSE clients), and the
projections that follow the store (event counts for svc_event_total)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors import Generation, lookup
from actors.metrics import ActorMetricsHub
from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.events import Event, EventServices, EventStore
from orchestrator.observability import MetricsPusher, MetricsRecorder, configure_actor_logs
from orchestrator.runtime.supervisor import Supervisor

KIND = "EventBus"
METRICS_FLUSH_S = 1.0


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000
)
class EventBus:
    def __init__(self, settings: Settings, generation: Generation) -> None:
        configure_actor_logs(settings.log_format, settings.log_level)
        self._settings = settings
        self._generation = generation
        self._services: EventServices | None = None
        self._lock = asyncio.Lock()
        self._recorder = MetricsRecorder(f"event_bus:{socket.gethostname()}:{os.getpid()}")
        # The live feed and the metrics flush; restarts reach /metrics through the flush.
        self._supervisor = Supervisor("event_bus", on_restart=self._recorder.background_restart)

    def __repr__(self) -> str:
        if self._services is None:
            return "EventBus(starting)"
        feed = self._services.feed
        return f"EventBus(head={feed.head}, subscribers={feed.subscribers})"

    async def _ready(self) -> EventServices:
        async with self._lock:  # one start, however many first calls arrive together
            if self._services is None:
                assert self._settings.database_url
                db = await connect(self._settings.database_url, min_size=1, max_size=4)
                services = EventServices(
                    EventStore(db.pool),
                    self._settings.database_url,
                    self._recorder,
                    self._supervisor,
                )
                try:
                    await services.start()
                except BaseException:
                    await services.stop()
                    await db.close()  # the next call starts over with a new pool
                    raise
                pusher = MetricsPusher(self._recorder, ActorMetricsHub(self._generation))
                self._supervisor.spawn("metrics-flush", lambda: self._flush_metrics(pusher))
                self._services = services
            return self._services

    @staticmethod
    async def _flush_metrics(pusher: MetricsPusher) -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            with contextlib.suppress(Exception):  # the Metrics actor may be restarting
                await pusher.flush()

    async def head(self) -> int:
        return (await self._ready()).feed.head

    async def poke(self) -> None:
        (await self._ready()).feed.poke()

    # Backpressure: a replica that stops consuming pauses this generator, so its feed queue
    # fills and overflows (SubscriberTooSlow) instead of Ray's object store filling up.
    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=64)
    async def subscribe(self, after: int) -> AsyncIterator[list[Event]]:
        """Every committed event after `after`, in batches (a streaming generator)."""
        services = await self._ready()
        async for batch in services.feed.subscribe(after):
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
