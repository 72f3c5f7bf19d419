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
from orchestrator.events._notifier import NOTIFY_CHANNEL, FeedNotifier
from orchestrator.events._projections import EventTypeCounts, Projection, ProjectionRunner
from orchestrator.events._reader import EventReader
from orchestrator.events._services import EventServices
from orchestrator.events._store import EventStore
from orchestrator.events._writer import EventTransaction, EventWriter

__all__ = [
    "CATALOG",
    "NOTIFY_CHANNEL",
    "Event",
    "EventFeed",
    "EventPage",
    "EventQuery",
    "EventReader",
    "EventRejected",
    "EventServices",
    "EventStore",
    "EventTransaction",
    "EventType",
    "EventTypeCounts",
    "EventWriter",
    "Fanout",
    "FeedNotifier",
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
