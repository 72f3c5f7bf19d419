"""Group commit: the writer's way of committing appends that are transactions of their own
(`EventWriter.append`). Callers never choose it; it is why appending from 8 writers beats 8
connections of plain INSERTs (docs/benchmarks.md, `events`).

A batch writer takes everything queued so far into one statement, so N callers cost one
commit (one WAL flush) instead of N, and a lone caller waits for nobody. Up to GROUP_WRITERS
batch writers run at once, each with its own connection (one commit's round trips overlap
another's), never two with the same aggregate: one aggregate's appends commit in the order
they were queued, the others do not wait behind it. A batch ends like every write: its
statement may carry the feeds' NOTIFY, and the writer's `finish` (the notifier, the
post-commit hooks) runs once it has committed, whatever became of the callers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from orchestrator.events._model import Event, NewEvent

GROUP_WRITERS = 3  # batch writers at once, per writer
WRITER_LINGER_S = 0.05  # a batch writer waits this long for more before it ends

# An event ready to write: validated (and enriched) event, its aggregate, its type's version.
Prepared = tuple[NewEvent, str, int]
_Queued = tuple[list[Prepared], asyncio.Future[list[Event]]]
# (connection or pool, events, carry the NOTIFY?) -> the committed events
Insert = Callable[[asyncpg.Connection | asyncpg.Pool, list[Prepared], bool], Awaitable[list[Event]]]
# (committed events, when their statement carried the NOTIFY) -> after-commit work
Finish = Callable[[list[Event], float | None], Awaitable[None]]


class GroupCommit:
    def __init__(
        self,
        pool: asyncpg.Pool,
        insert: Insert,
        carry: Callable[[], float | None],
        finish: Finish,
        unknown: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._insert = insert
        self._carry = carry
        self._finish = finish
        self._unknown = unknown  # a batch that may have committed: wake the feeds anyway
        self._queue: list[_Queued] = []
        self._writers: set[asyncio.Task[None]] = set()
        self._committing = 0  # writers inside a commit
        self._busy: Counter[str] = Counter()  # aggregates in flight
        self._more = asyncio.Event()  # more queued, or an aggregate freed

    def submit(self, prepared: list[Prepared]) -> asyncio.Future[list[Event]]:
        """Queue for the next batch; the future gets the committed events. Not cancelled by a
        caller that stops waiting: what is queued is written."""
        done: asyncio.Future[list[Event]] = asyncio.get_running_loop().create_future()
        if not prepared:
            done.set_result([])
            return done
        self._queue.append((prepared, done))
        self._more.set()
        # Another writer only when every writer is inside a commit: one that is lingering
        # or finishing up takes this itself, cheaper than a new one.
        if self._committing == len(self._writers) < GROUP_WRITERS:
            self._writers.add(asyncio.create_task(self._write_queued()))
        return done

    def _take(self) -> list[_Queued]:
        """The queued appends this writer may commit now: in queue order, skipping any that
        shares an aggregate with an append in flight or with one skipped before it (so one
        aggregate's appends commit in the order they were queued)."""
        taken, kept = [], []
        blocked = set(self._busy)
        for item in self._queue:
            aggregates = {aggregate for _, aggregate, _ in item[0]}
            if aggregates & blocked:
                blocked |= aggregates
                kept.append(item)
            else:
                taken.append(item)
        self._queue = kept
        self._busy.update(a for prepared, _ in taken for _, a, _ in prepared)
        return taken

    async def _write_queued(self) -> None:
        """A batch writer. It keeps its connection and lingers a little when there is nothing
        to take: a caller appending in a loop then pays neither a pool checkout nor a new
        task per commit."""
        me = asyncio.current_task()
        assert me is not None
        try:
            async with self._pool.acquire() as conn:
                while True:
                    batch = self._take()
                    if not batch:
                        self._more.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._more.wait(), WRITER_LINGER_S)
                        batch = self._take()
                        if not batch:
                            # With no await since the last look at the queue: what is
                            # queued from now on (while we release) finds us gone.
                            self._writers.discard(me)
                            return
                    self._committing += 1
                    try:
                        results, carried = await self._write_batch(conn, batch)
                    finally:
                        self._committing -= 1
                        for _, aggregate, _ in (p for prepared, _ in batch for p in prepared):
                            self._busy[aggregate] -= 1
                            if self._busy[aggregate] <= 0:
                                del self._busy[aggregate]
                        self._more.set()  # what waited behind these aggregates may go now
                    # Ended before the callers hear of it, as a transaction is: when an
                    # append's future is done, its hooks have run.
                    try:
                        await self._finish(
                            [e for r in results if not isinstance(r, BaseException) for e in r],
                            carried,
                        )
                    finally:
                        _settle(batch, results)
                    if any(isinstance(r, BaseException) for r in results):
                        self._writers.discard(me)  # maybe a broken connection: start afresh
                        break
        except Exception as exc:  # noqa: BLE001 - no connection: handed to the waiting callers
            self._writers.discard(me)
            if not self._writers:
                batch, self._queue = self._queue, []
                _settle(batch, [exc] * len(batch))
        finally:
            self._writers.discard(me)
        if self._queue and not self._writers:
            self._writers.add(asyncio.create_task(self._write_queued()))

    async def _write_batch(
        self, conn: asyncpg.Connection, batch: list[_Queued]
    ) -> tuple[list[list[Event] | BaseException], float | None]:
        """One statement for the whole batch (carrying the NOTIFY when due: its start is
        returned). If Postgres refused it, each caller's events alone (through the pool), so
        one caller's bad write fails only that caller. If its outcome is unknown (the
        connection lost while it ran), it may have committed: sent again it could write
        every event twice, so each caller gets the error and the feeds are woken."""
        everything = [p for prepared, _ in batch for p in prepared]
        carried = self._carry()
        try:
            committed = await self._insert(conn, everything, carried is not None)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting callers
            if outcome_unknown(exc):
                self._unknown()
                return [exc] * len(batch), None
            if len(batch) == 1:
                return [exc], None
            results: list[list[Event] | BaseException] = []
            for prepared, _ in batch:
                try:
                    results.append(await self._insert(self._pool, prepared, False))
                except Exception as alone:  # noqa: BLE001 - handed to its caller
                    results.append(alone)
            return results, None
        out: list[list[Event] | BaseException] = []
        start = 0
        for prepared, _ in batch:
            out.append(committed[start : start + len(prepared)])
            start += len(prepared)
        return out, carried


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a write that failed with `exc` may have committed all the same: the server
    answered with an error (PostgresError) only when it did not."""
    return not isinstance(exc, asyncpg.PostgresError)


def _settle(batch: list[_Queued], results: Sequence[list[Event] | BaseException]) -> None:
    for (_, done), result in zip(batch, results, strict=True):
        if done.done():  # its caller stopped waiting
            continue
        if isinstance(result, BaseException):
            done.set_exception(result)
        else:
            done.set_result(result)
