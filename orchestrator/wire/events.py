"""Stored events (SPEC part 2, Event; part 4, events): GET /events pages and the frames of
GET /sync-events."""

from __future__ import annotations

from typing import Any

from orchestrator.wire._base import ApiModel

__all__ = ["Event", "EventPage"]


class Event(ApiModel):
    """One stored event; `position` is its global order (the SSE `id`, the Last-Event-ID);
    `user_uuid` whose it is (None: the system's)."""

    id: str
    type: str
    version: int
    aggregate_id: str
    seq: int
    timestamp: int
    data: dict[str, Any]
    position: int
    user_uuid: str | None = None


class EventPage(ApiModel):
    ok: bool = True
    data: list[Event]
    total: int
    offset: int
    limit: int
