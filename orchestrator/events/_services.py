"""The event machinery one fan-out process runs: the feed that follows the store and the
projections behind it (event counts, which feed svc_event_total). The EventBus actor runs
one; an app served without Ray runs its own."""

from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.events._feed import EventFeed
from orchestrator.events._model import Event
from orchestrator.events._projections import EventTypeCounts, ProjectionRunner
from orchestrator.events._store import EventStore
from orchestrator.observability import MetricsRecorder
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait

log = logging.getLogger(__name__)

# The projections catch up at most this often. Each catch-up is a transaction of its own (the
# checkpoint row locked, the events read again, the counts and the checkpoint written): run
# on every feed batch it cost more database round trips than the feed itself under load. The
# counts (svc_event_total) lag the feed by at most this much, plus the catch-up.
PROJECT_EVERY_S = 0.25
# After a catch-up failed (the store unreachable), the next try.
PROJECT_RETRY_S = 1.0
# On stop: how long a catch-up under way, then the last one, may take.
STOP_PROJECT_S = 2.0


class EventServices:
    def __init__(
        self,
        store: EventStore,
        dsn: str,
        recorder: MetricsRecorder,
        supervisor: Supervisor,
        project_every_s: float = PROJECT_EVERY_S,
    ) -> None:
        self.store = store
        self.projections = ProjectionRunner(store)
        self.projections.register(EventTypeCounts())
        self.recorder = recorder
        self.feed = EventFeed(store, dsn, on_batch=self._follow, supervisor=supervisor)
        self._project_every_s = project_every_s
        self._projected_at = -float("inf")
        self._behind = False  # events the projections have not caught up with may exist
        self._projecting: asyncio.Task[None] | None = None
        self._catching_up = False  # the task is in a catch-up, not waiting for its time
        self._stopping = False

    async def _follow(self, _batch: list[Event]) -> None:
        """The feed's batch hook: marks the projections behind and makes sure one task
        catches them up, right away or when the last catch-up is PROJECT_EVERY_S old."""
        self._behind = True
        if self._projecting is None or self._projecting.done():
            self._projecting = asyncio.create_task(self._project_while_behind())

    async def _project_while_behind(self) -> None:
        while self._behind and not self._stopping:
            due = self._projected_at + self._project_every_s - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)
            # Cleared before the catch-up reads: a batch arriving during it marks it again.
            self._behind = False
            self._projected_at = time.monotonic()
            self._catching_up = True
            try:
                await self._project()
            except Exception as exc:  # noqa: BLE001 - what it missed, a later one applies
                log.warning("event projections cannot catch up (tried again): %r", exc)
                self._behind = True
                self._projected_at = time.monotonic() + PROJECT_RETRY_S - self._project_every_s
            finally:
                self._catching_up = False

    async def _project(self) -> None:
        # Counted from the projection, not the batch: exactly once per committed event, also
        # across restarts (the checkpoint lives in Postgres, with the counts); recorded per
        # committed transaction, so a later one failing does not lose the earlier ones.
        def record(batch: list[Event]) -> None:
            for event in batch:
                self.recorder.event(event.type)

        await self.projections.catch_up(EventTypeCounts.name, record)

    async def start(self) -> None:
        await self._project()
        self._projected_at = time.monotonic()
        await self.feed.start()
        # Events committed between that catch-up and the feed's head came in no batch.
        await self._follow([])

    async def stop(self) -> None:
        try:
            await self.feed.stop()
        finally:
            await self._stop_projecting()

    async def _stop_projecting(self) -> None:
        """A catch-up under way finishes (cancelled in its COMMIT, its events could be in the
        counts and never in this process's metrics); then one last catch-up counts what came
        since, so the metrics' last flush holds every event. Each bounded by STOP_PROJECT_S."""
        self._stopping = True
        task, self._projecting = self._projecting, None
        if task is not None and not task.done():
            if self._catching_up:  # let it reach its end first, within the bound
                await asyncio.wait({task}, timeout=STOP_PROJECT_S)
            await cancel_and_wait([task], STOP_PROJECT_S)
        try:
            await asyncio.wait_for(self._project(), STOP_PROJECT_S)
        except Exception as exc:  # noqa: BLE001 - counted by the next process's start
            log.warning("event projections could not catch up on stop: %r", exc)
