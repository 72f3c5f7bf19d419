"""Events a process writes when its services are not running: an AgentWorker whose start
failed (its store went with the failed try), the Runtime replica that has no store at all
(an actor Ray has not placed). They go out on a connection of their own, bounded in time,
and a failure to write is logged, never raised: recording must not hold a start's retry or
a drain back, nor break them."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence

import asyncpg

from orchestrator.events import EventStore, NewEvent
from orchestrator.observability import redact

__all__ = ["RECORD_S", "append_now", "error_text"]

log = logging.getLogger(__name__)

# How long recording may hold its caller (a start's retry, a drain).
RECORD_S = 10.0
# A password in a connection string an error may quote (postgresql://user:pw@host).
_DSN_PASSWORD = re.compile(r"(://[^/\s:@]+):[^@\s/]+@")


def error_text(exc: BaseException | str) -> str:
    """An error as an event or a log line may show it: its type and message, credentials
    masked, at most 500 characters."""
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return _DSN_PASSWORD.sub(r"\1:***@", redact(text))[:500]


async def append_now(
    database_url: str | None, events: Sequence[NewEvent], store: EventStore | None = None
) -> bool:
    """Append `events` within RECORD_S, through `store` when the caller has one running,
    else a connection of their own. False (logged) when they could not be written."""
    try:
        async with asyncio.timeout(RECORD_S):
            if store is not None:
                await store.append(events)
                return True
            if not database_url:
                return False
            pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
            try:
                await EventStore(pool).append(events)
            finally:
                await pool.close()
    except Exception as exc:  # noqa: BLE001 - a record lost is logged, never fatal
        log.warning("could not record %s (%s)", events[-1].type, error_text(exc))
        return False
    return True
