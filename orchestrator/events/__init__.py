"""The event store (SPEC part 6): append-only, versioned types, hooks, projections, and
live fan-out."""

from orchestrator.events._catalog import (
    CATALOG,
    EventType,
    InvalidEventData,
    UnknownEventType,
    stream_name,
)
from orchestrator.events._fanout import Fanout, StreamFilter, sse_frame
from orchestrator.events._feed import EventFeed, SubscriberTooSlow
from orchestrator.events._model import (
    Event,
    EventPage,
    EventQuery,
    EventRejected,
    NewEvent,
    SeqConflict,
)
from orchestrator.events._projections import EventTypeCounts, Projection, ProjectionRunner
from orchestrator.events._services import EventServices
from orchestrator.events._store import NOTIFY_CHANNEL, EventStore, EventTransaction

__all__ = [
    "CATALOG",
    "NOTIFY_CHANNEL",
    "Event",
    "EventFeed",
    "EventPage",
    "EventQuery",
    "EventRejected",
    "EventServices",
    "EventStore",
    "EventTransaction",
    "EventType",
    "EventTypeCounts",
    "Fanout",
    "InvalidEventData",
    "NewEvent",
    "Projection",
    "ProjectionRunner",
    "SeqConflict",
    "StreamFilter",
    "SubscriberTooSlow",
    "UnknownEventType",
    "sse_frame",
    "stream_name",
]
