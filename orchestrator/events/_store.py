"""The event store: appends (with the state change that caused them, in one transaction),
reads, pre- and post-commit hooks. There is deliberately no update or delete path; the
database rejects both too (a trigger)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg

from orchestrator._json import dumps, loads
from orchestrator.auth import Principal
from orchestrator.events._catalog import (
    InvalidEventData,
    UnknownEventType,
    aggregate_of,
    event_type,
    upcast,
    validate,
)
from orchestrator.events._model import (
    Event,
    EventPage,
    EventQuery,
    EventRejected,
    NewEvent,
    SeqConflict,
    owner_scope,
)

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "orch_events"
# Sent after commit, not inside the appending transaction: Postgres holds its notify-queue
# lock from a notifying transaction's pre-commit to its end (WAL flush included), which
# would serialise concurrent appenders' commits. Not flushed (it is a wake-up, not data),
# and coalesced: at most one per NOTIFY_COALESCE_S per process; a lost one costs a feed's
# poll interval, never an event. The exception: one autocommitted `append_with` statement
# per window carries it (`EventStore._carry_notify`), so a stream of them needs no NOTIFY
# round trips of its own.
_NOTIFY_SQL = (
    f"SELECT set_config('synchronous_commit', 'off', true), pg_notify('{NOTIFY_CHANNEL}', '')"
)
# The same NOTIFY inside an appending statement (`EventStore._carry_notify`).
_CARRIED_NOTIFY = f" CROSS JOIN (SELECT pg_notify('{NOTIFY_CHANNEL}', '')) AS carried_notify"
# When no statement has carried an owed NOTIFY by then, the notifier sends it.
NOTIFY_LATE_S = 0.01
NOTIFY_COALESCE_S = 0.005
# Appends in different transactions commit concurrently (migration 0014), so a position can
# be visible while a smaller one is still in flight. Every read that follows positions
# therefore stops at the horizon (`events_horizon()`, read in an earlier statement than the
# rows): nothing at or below it can still appear, so a reader that has seen position N never
# later finds a smaller one and following the store by position skips nothing.
GROUP_WRITERS = 3  # group-commit writers at once, per store
WRITER_LINGER_S = 0.05  # the group-commit writer waits this long for more before it ends
_COLUMNS = "position, id, type, version, aggregate_id, seq, timestamp, data, user_uuid"

# An event ready to write: validated (and enriched) event, its aggregate, its type's version.
_Prepared = tuple[NewEvent, str, int]
PreCommitHook = Callable[[NewEvent], Awaitable[NewEvent]]
PostCommitHook = Callable[[list[Event]], Awaitable[None]]


@functools.lru_cache(maxsize=64)
def _one_marks(n: int) -> str:
    """append_event's parameters after the caller's `n` (the body, 5th, a JSON text)."""
    return ", ".join(f"${n + i}::jsonb" if i == 5 else f"${n + i}" for i in range(1, 8))


def row_to_event(row: asyncpg.Record) -> Event:
    """A stored row as an Event; an older version of its type is upcast to the current one."""
    data = loads(row["data"]) if isinstance(row["data"], str) else dict(row["data"])
    version = row["version"]
    try:
        current = event_type(row["type"]).version
    except UnknownEventType:  # a type retired from the catalog: shown as stored
        current = version
    if version < current:
        data, version = upcast(row["type"], version, data), current
    return Event(
        position=row["position"],
        id=str(row["id"]),
        type=row["type"],
        version=version,
        aggregate_id=row["aggregate_id"],
        seq=row["seq"],
        timestamp=row["timestamp"],
        data=data,
        user_uuid=row["user_uuid"],
    )


@dataclass
class EventTransaction:
    """An open transaction: change state with `conn`, record what happened with `append`.
    Post-commit hooks run once the transaction has committed."""

    store: EventStore
    conn: asyncpg.Connection
    appended: list[Event] = field(default_factory=list)

    async def append(
        self, events: Sequence[NewEvent], *, expected_seq: int | None = None
    ) -> list[Event]:
        committed = await self.store.append_in(self.conn, events, expected_seq=expected_seq)
        self.appended.extend(committed)
        return committed


class EventStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._pre: list[PreCommitHook] = []
        self._post: list[PostCommitHook] = []
        self._queue: list[tuple[list[_Prepared], asyncio.Future[list[Event]]]] = []
        self._writers: set[asyncio.Task[None]] = set()
        self._committing = 0  # writers inside a commit
        self._busy: Counter[str] = Counter()  # aggregates in flight
        self._more = asyncio.Event()  # more queued, or an aggregate freed
        self._in_flight = False
        self._notify_due = False  # a NOTIFY is owed; the notifier sends it
        # Monotonic times: the last NOTIFY sent (or carried: its statement's start); the
        # oldest and the newest owed event reported committed since the last one.
        self._notified_at = -math.inf
        self._due_since = -math.inf
        self._due_at = -math.inf
        self._notifier: asyncio.Task[None] | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def in_flight(self) -> bool:
        """At the last read, some append was in flight: a position may be waiting behind it,
        and it will show without a NOTIFY if that transaction rolls back (poll soon)."""
        return self._in_flight

    def add_pre_commit_hook(self, hook: PreCommitHook) -> None:
        """Runs on each event before it is written; returns it (maybe enriched) or raises
        `EventRejected`, which aborts the whole append."""
        self._pre.append(hook)

    def add_post_commit_hook(self, hook: PostCommitHook) -> None:
        """Runs after commit with the committed events; a failure is logged, never undone."""
        self._post.append(hook)

    # --- writing -----------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[EventTransaction]:
        async with self._pool.acquire() as conn:
            tx = EventTransaction(self, conn)
            async with conn.transaction():
                yield tx
            if tx.appended:
                # Not only shielded: the connection goes back to the pool when this block
                # ends, so a cancelled caller waits here until the NOTIFY is over (a pooled
                # connection handed on mid-statement fails its next user's statement with
                # "another operation is in progress").
                await _to_the_end(self._notify_after_commit(conn))
        # Committed: the hooks run even if the caller is cancelled right now.
        await asyncio.shield(self._after_commit(tx.appended))

    async def append(
        self, events: Sequence[NewEvent], *, expected_seq: int | None = None
    ) -> list[Event]:
        """Append in a transaction of its own.

        Concurrent calls in this process are group-committed: a writer takes everything
        queued so far into one transaction, so N callers cost one commit (one WAL flush)
        instead of N, and a lone caller waits for nobody. Up to GROUP_WRITERS such
        transactions are in flight at once, never two with the same aggregate (an append
        to a busy aggregate waits; the others do not wait behind it).
        """
        if expected_seq is not None:
            async with self.transaction() as tx:
                return await tx.append(events, expected_seq=expected_seq)
        prepared = [await self._prepare(e) for e in events]
        if not prepared:
            return []
        # Shielded: a caller that goes away (a client disconnect) does not undo or orphan a
        # write that may already be committing; the writer runs the post-commit hooks.
        return await asyncio.shield(self._enqueue(prepared))

    def enqueue(self, events: Sequence[NewEvent]) -> asyncio.Future[list[Event]]:
        """Queue events for the next group commit now, without waiting: batches of one
        aggregate enqueued one after another commit in that order (often in one
        transaction); different aggregates' may commit in either order. Validation happens
        here (an invalid event raises at once). Needs no pre-commit hooks, which may await."""
        if self._pre:
            raise RuntimeError("enqueue() cannot run pre-commit hooks; use append()")
        return self._enqueue([self._prepare_now(e) for e in events])

    def _enqueue(self, prepared: list[_Prepared]) -> asyncio.Future[list[Event]]:
        done: asyncio.Future[list[Event]] = asyncio.get_running_loop().create_future()
        if not prepared:
            done.set_result([])
            return done
        self._queue.append((prepared, done))
        self._more.set()
        # Another writer only when every writer is inside a commit: one that is lingering
        # or finishing up (hooks, NOTIFY) takes this itself, cheaper than a new one.
        if self._committing == len(self._writers) < GROUP_WRITERS:
            self._writers.add(asyncio.create_task(self._write_queued()))
        return done

    def _take(self) -> list[tuple[list[_Prepared], asyncio.Future[list[Event]]]]:
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
        """A group-commit writer (up to GROUP_WRITERS at once, each with its own
        connection, so one commit's round trips overlap another's). It keeps its connection
        and lingers a little when there is nothing to take: a writer appending in a loop
        then pays neither a pool checkout nor a new task per commit."""
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
                            # enqueued from now on (while we release) finds us gone.
                            self._writers.discard(me)
                            return
                    self._committing += 1
                    try:
                        results = await self._write_batch(conn, batch)
                    finally:
                        self._committing -= 1
                        for _, aggregate, _ in (p for prepared, _ in batch for p in prepared):
                            self._busy[aggregate] -= 1
                            if self._busy[aggregate] <= 0:
                                del self._busy[aggregate]
                        self._more.set()  # what waited behind these aggregates may go now
                    self._settle(batch, results)
                    committed = [e for r in results if not isinstance(r, BaseException) for e in r]
                    await self._after_commit(committed)
                    if committed:
                        await self._notify_after_commit(conn)
                    if any(isinstance(r, BaseException) for r in results):
                        self._writers.discard(me)  # maybe a broken connection: start afresh
                        break
        except Exception as exc:  # noqa: BLE001 - no connection: handed to the waiting callers
            self._writers.discard(me)
            if not self._writers:
                batch, self._queue = self._queue, []
                self._settle(batch, [exc] * len(batch))
        finally:
            self._writers.discard(me)
        if self._queue and not self._writers:
            self._writers.add(asyncio.create_task(self._write_queued()))

    @staticmethod
    def _settle(
        batch: list[tuple[list[_Prepared], asyncio.Future[list[Event]]]],
        results: Sequence[list[Event] | BaseException],
    ) -> None:
        for (_, done), result in zip(batch, results, strict=True):
            if done.done():
                continue
            if isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(result)

    async def _write_batch(
        self,
        conn: asyncpg.Connection,
        batch: list[tuple[list[_Prepared], asyncio.Future[list[Event]]]],
    ) -> list[list[Event] | BaseException]:
        """One commit for the whole batch; if that fails, each caller's events alone (through
        the pool: `conn` may be what broke), so one caller's bad write fails only that
        caller."""
        everything = [p for prepared, _ in batch for p in prepared]
        try:
            committed = await self._insert(conn, everything, None)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting callers
            if len(batch) == 1:
                return [exc]
            results: list[list[Event] | BaseException] = []
            for prepared, _ in batch:
                try:
                    results.append(await self._insert(self._pool, prepared, None))
                except Exception as alone:  # noqa: BLE001 - handed to its caller
                    results.append(alone)
            return results
        out: list[list[Event] | BaseException] = []
        start = 0
        for prepared, _ in batch:
            out.append(committed[start : start + len(prepared)])
            start += len(prepared)
        return out

    async def append_in(
        self,
        conn: asyncpg.Connection,
        events: Sequence[NewEvent],
        *,
        expected_seq: int | None = None,
    ) -> list[Event]:
        """Append inside the caller's open transaction (which runs post-commit hooks)."""
        if not conn.is_in_transaction():
            raise RuntimeError("append_in needs an open transaction")
        prepared = [await self._prepare(e) for e in events]
        if not prepared:
            return []
        expected: tuple[str, int] | None = None
        if expected_seq is not None:
            aggregates = {aggregate for _, aggregate, _ in prepared}
            if len(aggregates) != 1:
                raise EventRejected("expected_seq needs all events to belong to one aggregate")
            expected = (aggregates.pop(), expected_seq)
        return await self._insert(conn, prepared, expected)

    async def append_with(
        self,
        conn: asyncpg.Connection | asyncpg.Pool,
        sql: str,
        args: Sequence[Any],
        events: Sequence[NewEvent],
    ) -> tuple[asyncpg.Record | None, list[Event]]:
        """A state change and its events in ONE statement (one round trip; on the pool it
        is its own transaction, so also one commit, nothing else in it).

        `sql` is one data-modifying statement with RETURNING (the caller's, with its
        parameters `$1..$len(args)`); it runs as a CTE beside `append_events`, and its
        first returned row comes back with the committed events. On the pool, the
        post-commit hooks run and the feeds are woken (coalesced, off this call's path)."""
        if self._pre:
            prepared = [await self._prepare(e) for e in events]
        else:  # no coroutine per event on the hot path
            prepared = [self._prepare_now(e) for e in events]
        if not prepared:
            raise ValueError("append_with needs at least one event")
        if isinstance(conn, asyncpg.Connection) and not conn.is_in_transaction():
            raise RuntimeError("append_with on a connection needs an open transaction")
        if len(prepared) == 1:
            # One event, the common case: append_event with scalar arguments (0019).
            ids, event_args, timestamp = self._append_one_args(prepared[0])
            append = f"append_event({_one_marks(len(args))})"
        else:
            ids, event_args, timestamp = self._append_args(prepared, None)
            append = f"append_events({self._marks(len(args), len(event_args))})"
        # On the pool the statement is its own transaction: it carries the feeds' NOTIFY
        # itself when one is due (see `_carry_notify`), no round trip of its own.
        on_pool = isinstance(conn, asyncpg.Pool)
        carried = self._carry_notify() if on_pool else None
        # Appended events drive the join (the state CTE runs in full either way: Postgres
        # always completes data-modifying CTEs), so every event's row comes back.
        rows = await conn.fetch(
            f"WITH state AS ({sql}), appended AS (SELECT * FROM {append})"
            " SELECT a.out_position AS _event_position, a.out_seq AS _event_seq, s.*"
            " FROM appended a LEFT JOIN state s ON true"
            + (_CARRIED_NOTIFY if carried is not None else ""),
            *args,
            *event_args,
        )
        committed = self._numbered(prepared, ids, timestamp, rows)
        if on_pool:
            await self.committed(committed, notified_since=carried)
        return (rows[0] if rows else None), committed

    async def append_beside(
        self,
        conn: asyncpg.Connection,
        ctes: Sequence[str],
        args: Sequence[Any],
        events: Sequence[NewEvent],
    ) -> list[Event]:
        """Events appended in ONE statement with the caller's data-modifying CTEs
        (`name AS (INSERT/UPDATE ...)`, parameters `$1..$len(args)`), inside the caller's
        open transaction: several state changes and their events in one round trip. Once
        that transaction has committed, hand the events to `committed`."""
        if not conn.is_in_transaction():
            raise RuntimeError("append_beside needs an open transaction")
        prepared = [await self._prepare(e) for e in events]
        if not prepared:
            if ctes:  # data-modifying CTEs run whether or not they are referenced
                await conn.execute(f"WITH {', '.join(ctes)} SELECT 1", *args)
            return []
        ids, event_args, timestamp = self._append_args(prepared, None)
        marks = self._marks(len(args), len(event_args))
        head = f"WITH {', '.join(ctes)}, " if ctes else "WITH "
        rows = await conn.fetch(
            f"{head}appended AS (SELECT * FROM append_events({marks}))"
            " SELECT out_position AS _event_position, out_seq AS _event_seq FROM appended",
            *args,
            *event_args,
        )
        return self._numbered(prepared, ids, timestamp, rows)

    async def committed(self, events: list[Event], *, notified_since: float | None = None) -> None:
        """The transaction that appended `events` (`append_beside`, `append_with` on a
        connection) has committed: run the post-commit hooks and wake the feeds (coalesced,
        off the caller's path). `notified_since`: that transaction NOTIFYed at its commit
        and began at that time (monotonic): the feeds are woken for what had committed by
        then (`_carry_notify`)."""
        if events:
            # First: a caller cancelled during the hooks still wakes them.
            if notified_since is None:
                self._notify_soon()
            elif self._notify_due and self._due_at <= notified_since:
                self._notify_due = False  # what was owed had committed before it began
            if self._post:  # (a task per call only when there is a hook to run)
                await asyncio.shield(self._after_commit(events))

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _marks(n: int, count: int) -> str:
        """append_events' parameters after the caller's `n`; the bodies (5th) are JSON
        texts, as in `_insert`."""
        return ", ".join(
            f"${n + i}::jsonb[]" if i == 5 else f"${n + i}" for i in range(1, count + 1)
        )

    def _notify_soon(self) -> None:
        """Wake the feeds: owed until a statement carries a NOTIFY (`_carry_notify`) or,
        failing that, the notifier task sends one (no round trip on the caller's path)."""
        now = time.monotonic()
        if not self._notify_due:
            self._due_since = now
        self._notify_due = True
        self._due_at = now
        if self._notifier is None or self._notifier.done():
            self._notifier = asyncio.create_task(self._notify_later(), name="event-notify")

    def _carry_notify(self) -> float | None:
        """Whether the autocommitted statement about to start carries the NOTIFY (at most
        one per NOTIFY_COALESCE_S per process): its start time if so, else None.

        A NOTIFY of its own cost a pool checkout and a round trip on another backend, on
        the same cores: ~40 us a store at 200 a second (issue 17). Carried by the
        statement, it is sent at that statement's commit; a notifying transaction holds
        Postgres' notify-queue lock through its commit, but only one statement in a window
        carries one, so appenders' commits do not queue behind each other for it. What was
        owed before the statement began is covered by it once it commits (`committed`);
        if it fails, the notifier sends what is owed."""
        now = time.monotonic()
        if now - self._notified_at < NOTIFY_COALESCE_S:
            return None
        self._notified_at = now
        return now

    @staticmethod
    def _append_args(
        prepared: list[_Prepared], expected: tuple[str, int] | None
    ) -> tuple[list[uuid.UUID], list[Any], int]:
        ids = [uuid.uuid4() for _ in prepared]
        timestamp = int(time.time() * 1000)
        return (
            ids,
            [
                ids,
                [new.type for new, _, _ in prepared],
                [version for _, _, version in prepared],
                [aggregate for _, aggregate, _ in prepared],
                [dumps(new.data).decode() for new, _, _ in prepared],
                [new.user_uuid for new, _, _ in prepared],
                timestamp,
                expected[0] if expected else None,
                expected[1] if expected else None,
            ],
            timestamp,
        )

    @staticmethod
    def _append_one_args(prepared: _Prepared) -> tuple[list[uuid.UUID], list[Any], int]:
        """append_event's arguments (see `_append_args` for several events)."""
        new, aggregate, version = prepared
        event_id = uuid.uuid4()
        timestamp = int(time.time() * 1000)
        return (
            [event_id],
            [
                event_id,
                new.type,
                version,
                aggregate,
                dumps(new.data).decode(),
                new.user_uuid,
                timestamp,
            ],
            timestamp,
        )

    @staticmethod
    def _numbered(
        prepared: list[_Prepared],
        ids: list[uuid.UUID],
        timestamp: int,
        rows: Sequence[asyncpg.Record],
        position: str = "_event_position",
        seq: str = "_event_seq",
    ) -> list[Event]:
        # Positions are drawn in input order, so sorted positions line up with the input.
        numbered = sorted((r[position], r[seq]) for r in rows)
        return [
            Event(
                position=pos,
                id=str(event_id),
                type=new.type,
                version=version,
                aggregate_id=aggregate,
                seq=sq,
                timestamp=timestamp,
                data=new.data,  # validate() made it: JSON types, not the caller's dict
                user_uuid=new.user_uuid,
            )
            for (pos, sq), event_id, (new, aggregate, version) in zip(
                numbered, ids, prepared, strict=True
            )
        ]

    async def _insert(
        self,
        conn: asyncpg.Connection | asyncpg.Pool,
        prepared: list[_Prepared],
        expected: tuple[str, int] | None,
    ) -> list[Event]:
        ids = [uuid.uuid4() for _ in prepared]
        bodies = [dumps(new.data).decode() for new, _, _ in prepared]
        timestamp = int(time.time() * 1000)
        try:
            # Only (position, seq) come back: the rest is ours already.
            rows = await conn.fetch(
                "SELECT * FROM append_events($1, $2, $3, $4, $5::jsonb[], $6, $7, $8, $9)",
                ids,
                [new.type for new, _, _ in prepared],
                [version for _, _, version in prepared],
                [aggregate for _, aggregate, _ in prepared],
                bodies,
                [new.user_uuid for new, _, _ in prepared],
                timestamp,
                expected[0] if expected else None,
                expected[1] if expected else None,
            )
        except asyncpg.RaiseError as exc:
            if expected is None or exc.as_dict().get("message") != "seq_conflict":
                raise
            aggregate, wanted = expected
            actual = int(exc.detail or 0)
            raise SeqConflict(
                f"aggregate {aggregate!r} is at seq {actual}, not the expected {wanted}",
                extra={"aggregate_id": aggregate, "expected_seq": wanted, "actual_seq": actual},
            ) from None
        # Positions are drawn in input order, so sorted positions line up with the input.
        numbered = sorted((r["out_position"], r["out_seq"]) for r in rows)
        return [
            Event(
                position=position,
                id=str(event_id),
                type=new.type,
                version=version,
                aggregate_id=aggregate,
                seq=seq,
                timestamp=timestamp,
                data=new.data,  # validate() made it: JSON types, not the caller's dict
                user_uuid=new.user_uuid,
            )
            for (position, seq), event_id, (new, aggregate, version) in zip(
                numbered, ids, prepared, strict=True
            )
        ]

    async def _prepare(self, new: NewEvent) -> _Prepared:
        if not self._pre:
            return self._prepare_now(new)
        for hook in self._pre:
            new = await hook(new)
        return self._prepare_now(new)

    @staticmethod
    def _prepare_now(new: NewEvent) -> _Prepared:
        try:
            kind, data = validate(new.type, new.data)
            aggregate = aggregate_of(kind, data)
        except (UnknownEventType, InvalidEventData) as exc:
            raise EventRejected(str(exc)) from exc
        if new.aggregate_id is not None and new.aggregate_id != aggregate:
            raise EventRejected(
                f"{new.type}: aggregate_id {new.aggregate_id!r} does not match "
                f"{kind.aggregate_key}={aggregate!r}"
            )
        return replace(new, data=data), aggregate, kind.version

    async def _after_commit(self, events: list[Event]) -> None:
        if not events:
            return
        for hook in self._post:
            try:
                await hook(events)
            except Exception:
                log.exception("post-commit hook %r failed for %d event(s)", hook, len(events))

    async def _notify_after_commit(self, conn: asyncpg.Connection) -> None:
        """Wake the feeds: at once on the connection that just committed (no pool checkout,
        never a new connection), unless this process sent one less than NOTIFY_COALESCE_S
        ago; then the notifier sends one when that window ends."""
        now = time.monotonic()
        if self._notify_due or now - self._notified_at < NOTIFY_COALESCE_S:
            self._notify_soon()
            return
        self._notified_at = now
        try:
            await conn.execute(_NOTIFY_SQL)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("cannot NOTIFY %s (feeds catch up by polling): %r", NOTIFY_CHANNEL, exc)

    async def _notify_later(self) -> None:
        while self._notify_due:
            # Not before the window's end, and NOTIFY_LATE_S after the oldest owed event:
            # under a steady stream of appends a statement carries it by then
            # (`_carry_notify`) and this sends none; when carriers stall or fail, it is sent
            # anyway, never later than that.
            wake = max(self._notified_at + NOTIFY_COALESCE_S, self._due_since + NOTIFY_LATE_S)
            now = time.monotonic()
            if now < wake:
                # Looked at again at least every NOTIFY_LATE_S: a statement may have carried
                # it meanwhile, or the times moved.
                await asyncio.sleep(min(wake - now, NOTIFY_LATE_S))
                continue
            self._notify_due = False
            self._notified_at = time.monotonic()
            try:
                await self._pool.execute(_NOTIFY_SQL)
            except Exception as exc:  # noqa: BLE001 - the feeds' poll timers catch up
                log.warning("cannot NOTIFY %s (feeds catch up by polling): %r", NOTIFY_CHANNEL, exc)
                return

    # --- reading -----------------------------------------------------------------------

    async def horizon(self) -> int:
        """A position no later-committing event can be at or below: read events up to it in a
        later statement (a newer snapshot) and none can be missed (migration 0014)."""
        row = await self._pool.fetchrow("SELECT horizon, allocated FROM events_horizon()")
        assert row is not None
        self._in_flight = row["allocated"] > row["horizon"]
        return int(row["horizon"])

    async def read_after(self, position: int, limit: int = 500) -> list[Event]:
        """Committed events after `position` in position order, up to the horizon."""
        horizon = await self.horizon()
        if horizon <= position:
            return []
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE position > $1 AND position <= $2"
            " ORDER BY position LIMIT $3",
            position,
            horizon,
            limit,
        )
        return [row_to_event(r) for r in rows]

    async def position_before(self, aggregate: str | None, from_seq: int) -> int:
        """Where a stream starting at `from_seq` resumes: the position just before the first
        event of `aggregate` with seq >= from_seq (for all aggregates, from_seq is a
        position); the current head when the aggregate has no such event yet."""
        if aggregate is None:
            return max(0, from_seq - 1)
        first = await self._pool.fetchval(
            "SELECT min(position) FROM events WHERE aggregate_id = $1 AND seq >= $2",
            aggregate,
            from_seq,
        )
        return await self.head() if first is None else int(first) - 1

    async def head(self) -> int:
        """Where a follower starts to see only what commits from now on: every event at or
        below it is already visible (0 for an empty store)."""
        return await self.horizon()

    async def query(self, q: EventQuery, principal: Principal) -> tuple[list[Event], int]:
        """`page` as (events, total)."""
        found = await self.page(q, principal)
        return found.events, found.total

    async def page(self, q: EventQuery, principal: Principal) -> EventPage:
        """A page of the events `principal` may read (its own; an admin's `q.user_uuid` or
        every tenant's) in position order, and how many match in all: counted exactly up to
        `q.count_limit`, the planner's estimate above it (so paging never counts the table).

        Across all aggregates `from_seq` is a position and the page stops at the horizon,
        so paging by `from_seq = last position + 1` skips nothing that commits late. Within
        one aggregate it is a seq, which is gapless: paging by seq skips nothing either."""
        owner = owner_scope(principal, q.user_uuid)
        where, args = ["true"], []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if q.aggregate is not None:
            where.append(f"aggregate_id = {arg(q.aggregate)}")
            if q.from_seq:
                where.append(f"seq >= {arg(q.from_seq)}")
        else:
            if q.from_seq:
                where.append(f"position >= {arg(q.from_seq)}")
            where.append(f"position <= {arg(await self.horizon())}")
        if owner is not None:
            where.append(f"user_uuid = {arg(owner)}")
        if q.types:
            where.append(f"type = ANY({arg(list(q.types))}::text[])")
        clause, n = " AND ".join(where), len(args)
        counted = await self._pool.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM events WHERE {clause} LIMIT ${n + 1}) AS m",
            *args,
            q.count_limit + 1,
        )
        total, exact = int(counted), True
        if total > q.count_limit:
            plan = await self._pool.fetchval(
                f"EXPLAIN (FORMAT JSON) SELECT 1 FROM events WHERE {clause}", *args
            )
            estimate = int(json.loads(plan)[0]["Plan"]["Plan Rows"])
            total, exact = max(total, estimate), False
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM events WHERE {clause} ORDER BY position"
            f" LIMIT ${n + 1} OFFSET ${n + 2}",
            *args,
            q.limit,
            q.offset,
        )
        return EventPage([row_to_event(r) for r in rows], total, exact)


async def _to_the_end(work: Awaitable[None]) -> None:
    """Run `work` to its end even if the caller is cancelled meanwhile; the cancellation is
    raised once it has ended."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            cancelled = True
            if task.done():
                break
    if cancelled:
        raise asyncio.CancelledError
