"""The event store of one pool: what every process builds, `EventStore(pool)`.

It is the writer (`EventWriter`, orchestrator/events/_writer.py: the one way to write, which
ends every write with the feeds' NOTIFY and the post-commit hooks) and the reader
(`EventReader`, orchestrator/events/_reader.py: reads by position up to the horizon, and
pages) over the same pool; each mechanism lives in its own module.
"""

from __future__ import annotations

import asyncpg

from orchestrator.events._reader import EventReader
from orchestrator.events._writer import EventTransaction, EventWriter

__all__ = ["EventStore", "EventTransaction"]


class EventStore(EventWriter, EventReader):
    def __init__(self, pool: asyncpg.Pool) -> None:
        EventWriter.__init__(self, pool)
        EventReader.__init__(self, pool)
