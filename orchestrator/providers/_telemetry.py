"""`inference.*` events for gateway calls, written off the request path.

A call's outcome is appended after the answer has gone out, in a background task: the
caller never waits for a commit, and the store's group commit turns concurrent calls into
few transactions. These events are a record of traffic, not acknowledged state, so a crash
between the answer and the append may lose one; that is the trade for no commit per call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from orchestrator.errors import OrchestratorError
from orchestrator.events import EventStore, NewEvent

__all__ = ["InferenceLog"]

log = logging.getLogger("orchestrator.gateway")

MAX_PENDING = 10_000


class InferenceLog:
    def __init__(self, store: EventStore | None) -> None:
        self._store = store
        self._tasks: set[asyncio.Task[None]] = set()

    def complete(
        self,
        *,
        request_id: str,
        user_uuid: str | None,
        model: str,
        provider: str,
        tokens_in: int,
        tokens_out: int,
        duration_ms: int,
        finish_reason: str,
        stream: bool,
    ) -> None:
        self._emit(
            "inference.complete",
            user_uuid,
            request_id=request_id,
            model=model,
            provider=provider,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            duration_ms=duration_ms,
            finish_reason=finish_reason,
            stream=stream,
        )

    def error(
        self,
        *,
        request_id: str,
        user_uuid: str | None,
        model: str,
        error: str,
        status_code: int,
        interrupted: bool = False,
        tokens_out: int = 0,
    ) -> None:
        if interrupted:
            self._emit(
                "inference.interrupted",
                user_uuid,
                request_id=request_id,
                model=model,
                reason=error,
                tokens_out=tokens_out,
            )
        else:
            self._emit(
                "inference.error",
                user_uuid,
                request_id=request_id,
                model=model,
                error=error,
                status_code=status_code,
            )

    def _emit(self, type: str, user_uuid: str | None, **data: Any) -> None:
        if self._store is None:
            return
        if len(self._tasks) >= MAX_PENDING:
            log.warning("inference events backlog full; dropping %s", type)
            return
        task = asyncio.get_running_loop().create_task(
            self._append(NewEvent(type, data, user_uuid=user_uuid))
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _append(self, event: NewEvent) -> None:
        assert self._store is not None
        try:
            await self._store.append([event])
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, OrchestratorError) as exc:
            log.warning("could not record %s: %s", event.type, exc)

    async def drain(self) -> None:
        """Wait for pending appends (shutdown, tests)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
