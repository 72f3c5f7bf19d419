"""`inference.*` events for gateway calls, recorded in batches after the response.

A call's start (`inference.request`) and its outcome are queued in memory (a list append, no
task, no validation on the request path); `run()`, a supervised loop, waits `flush_s` after
the first queued record so the records of that window go out together, then appends them in
one transaction (the store's group commit). One commit, one NOTIFY and one feed/projection
pass per batch instead of per call: at a few hundred calls a second the per-call append cost
as much CPU as the gateway.

Nothing acknowledged is dropped while the process lives: a batch the database refuses
(down, failing over) goes back to the head of the queue and is retried with backoff;
`drain()` (shutdown) writes whatever is queued or in flight. The queue is bounded
(`max_pending`): past it new records are dropped with a warning, as a log that cannot be
written must not grow without limit. A crash of the process loses the queued records (at
most `flush_s` of traffic, or the backlog of an outage): they are a record of traffic, not
acknowledged state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from orchestrator.errors import OrchestratorError
from orchestrator.events import EventRejected, EventStore, NewEvent
from orchestrator.observability import MetricsRecorder
from orchestrator.runtime.backoff import Backoff

__all__ = ["InferenceLog"]

log = logging.getLogger("orchestrator.gateway")

MAX_PENDING = 10_000
MAX_BATCH = 500  # records per transaction
RETRY_MAX_S = 5.0
# At shutdown: three more tries, 0.1, 0.2 and 0.4 s apart.
DRAIN_TRIES = 3
DRAIN_BACKOFF = Backoff(base=0.1, cap=0.4, jitter=0)
_STORE_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, OrchestratorError)


class InferenceLog:
    def __init__(
        self,
        store: EventStore | None,
        *,
        flush_s: float = 0.05,
        max_pending: int = MAX_PENDING,
        recorder: MetricsRecorder | None = None,
    ) -> None:
        self._store = store
        # Token and time-to-first-token metrics ride the same batches: the request path
        # only appends a tuple; the flusher adds them to the recorder.
        self._recorder = recorder
        self._calls: list[tuple[str, str, int, int, float | None]] = []
        self._flush_s = flush_s
        # While the store refuses batches: twice the flush window, doubling, up to 5 s.
        self._retry_backoff = Backoff(base=2 * flush_s, cap=RETRY_MAX_S)
        self._max_pending = max_pending
        self._pending: list[NewEvent] = []
        self._queued = asyncio.Event()
        # The batch being written: a task of its own, so cancelling the loop (shutdown)
        # never abandons a write halfway; `drain()` awaits it.
        self._writing: asyncio.Task[bool] | None = None
        self._dropped = 0

    @property
    def pending(self) -> int:
        """Records queued, not yet taken into a batch."""
        return len(self._pending)

    def request(
        self, *, request_id: str, user_uuid: str | None, model: str, stream: bool, messages: int
    ) -> None:
        """A call starts (`inference.request`): queued like the outcomes, so it costs the
        request path a list append and reaches the store in the same batch as its end."""
        self._emit(
            "inference.request",
            user_uuid,
            request_id=request_id,
            model=model,
            stream=stream,
            messages=messages,
        )

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
        ttft_s: float | None = None,
    ) -> None:
        if self._recorder is not None:
            self._calls.append((model, provider, tokens_in, tokens_out, ttft_s))
            self._queued.set()
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
        if len(self._pending) >= self._max_pending:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.warning("inference events backlog full; %d dropped", self._dropped)
            return
        self._pending.append(NewEvent(type, data, user_uuid=user_uuid))
        self._queued.set()

    async def run(self) -> None:
        """The flusher (run it under the process's Supervisor): a batch at most every
        `flush_s`, retried with backoff while the store refuses it."""
        failures = 0
        while True:
            await self._queued.wait()
            await asyncio.sleep(self._flush_s)  # let this window's records join the batch
            self._record_calls()
            while self._pending:
                self._record_calls()  # a store that is down must not hold metrics back
                if await self._write_next():
                    failures = 0
                    continue
                failures += 1
                await asyncio.sleep(self._retry_backoff.delay(failures))
            self._record_calls()  # those that came while the batch was written
            self._queued.clear()

    def _record_calls(self) -> None:
        calls, self._calls = self._calls, []
        if self._recorder is not None:
            for model, provider, tokens_in, tokens_out, ttft_s in calls:
                self._recorder.gateway_call(model, provider, tokens_in, tokens_out, ttft_s)

    async def _write_next(self) -> bool:
        """Write the next batch; False when it went back to the queue (store unavailable)."""
        if self._writing is None or self._writing.done():
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self._writing = asyncio.get_running_loop().create_task(self._write(batch))
        return await asyncio.shield(self._writing)

    async def _write(self, batch: list[NewEvent]) -> bool:
        """One transaction for the batch; if the store rejects it (an invalid record), each
        record alone, so one bad record does not take the others with it. What could not
        be written goes back to the head of the queue."""
        assert self._store is not None
        try:
            await self._store.append(batch)
            return True
        except EventRejected:
            pass
        except Exception as exc:  # noqa: BLE001 - kept and retried, whatever the cause
            self._requeue(batch, exc)
            return False
        for i, event in enumerate(batch):
            try:
                await self._store.append([event])
            except EventRejected as exc:
                log.warning("inference event %s rejected: %s", event.type, exc)
            except Exception as exc:  # noqa: BLE001 - kept and retried, whatever the cause
                self._requeue(batch[i:], exc)
                return False
        return True

    def _requeue(self, batch: list[NewEvent], exc: Exception) -> None:
        if isinstance(exc, _STORE_ERRORS):
            log.warning("could not record %d inference event(s), retrying: %s", len(batch), exc)
        else:
            log.error("could not record %d inference event(s), retrying", len(batch), exc_info=exc)
        self._pending[:0] = batch

    async def drain(self) -> None:
        """Write everything queued or in flight (shutdown, tests); a store that stays
        unavailable is given up on after a few attempts (logged)."""
        self._record_calls()
        if self._writing is not None:
            await self._writing  # never raises: a failed batch is back in the queue
        for failures in range(1, DRAIN_TRIES + 1):
            while self._pending:
                if not await self._write_next():
                    break
            if not self._pending:
                return
            await asyncio.sleep(DRAIN_BACKOFF.delay(failures))
        log.warning("shutdown: %d inference event(s) not recorded", len(self._pending))
