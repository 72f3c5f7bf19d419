"""The event machinery one fan-out process runs: the feed that follows the store and the
projections behind it (event counts, which feed svc_event_total). The EventBus actor runs
one; an app served without Ray runs its own."""

from __future__ import annotations

from orchestrator.events._feed import EventFeed
from orchestrator.events._model import Event
from orchestrator.events._projections import EventTypeCounts, ProjectionRunner
from orchestrator.events._store import EventStore
from orchestrator.observability import MetricsRecorder
from orchestrator.runtime.supervisor import Supervisor


class EventServices:
    def __init__(
        self,
        store: EventStore,
        dsn: str,
        recorder: MetricsRecorder,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.store = store
        self.projections = ProjectionRunner(store)
        self.projections.register(EventTypeCounts())
        self.recorder = recorder
        self.feed = EventFeed(store, dsn, on_batch=self._follow, supervisor=supervisor)

    async def _follow(self, _batch: list[Event]) -> None:
        # Counted from the projection, not the batch: exactly once per committed event, also
        # across restarts (the checkpoint lives in Postgres, with the counts).
        for event in await self.projections.catch_up(EventTypeCounts.name):
            self.recorder.event(event.type)

    async def start(self) -> None:
        await self._follow([])
        await self.feed.start()

    async def stop(self) -> None:
        await self.feed.stop()
