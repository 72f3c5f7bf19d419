"""A task's events on their way to the store, batched in order (the agent loop's only writer
of events: one commit per batch keeps fsyncs off the loop's critical path)."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.agents._task import AgentTask, task_payload
from orchestrator.events import EventStore, NewEvent


class Emitter:
    """A task's events, in order, batched: `add` queues one, `flush_soon` starts appending
    what is queued (after the previous batch, so order holds) without waiting, `flush` waits
    for everything. One commit per batch instead of one per event keeps the store's fsyncs
    off the agent loop's critical path, while the stream still sees each turn as it happens."""

    def __init__(self, events: EventStore, task: AgentTask) -> None:
        self._events = events
        self._task = task
        self._pending: list[NewEvent] = []
        self._written: list[asyncio.Future[Any]] = []

    def add(self, type_: str, **data: Any) -> None:
        self._pending.append(
            NewEvent(type_, task_payload(self._task, type_, data), self._task.user_uuid)
        )

    def flush_soon(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        # Queued at once (one aggregate's batches commit in the order they were appended),
        # not awaited here: no task per batch.
        self._written.append(self._events.append(batch))

    async def flush(self) -> None:
        self.flush_soon()
        written, self._written = self._written, []
        for future in written:
            await asyncio.shield(future)

    def abandon(self) -> None:
        """Cancelled: what was queued still goes out, in the background."""
        self.flush_soon()
