"""Writing events: the writer, and the one way a write ends.

A state change and the events it causes commit in one transaction (the outbox rule). Every
write is such a transaction, and the writer ends it itself: it commits, then wakes the feeds
(`FeedNotifier`) and runs the post-commit hooks, so no caller can forget either; a write
that did not commit runs neither. There are two things to write and two places to write
them, nothing else:

                                  events only              a state change and its events,
                                                           in one statement
    a transaction of its own      append(events)           write(ctes, args, events)
    inside `transaction()`        await tx.append(events)  await tx.write(ctes, args, events)

`append` queues the events and returns a future (await it for the committed events, or
leave it: the write goes on); concurrent appends are committed together (`GroupCommit`).
`write` is one autocommitted statement: one round trip and one commit, as cheap as a plain
INSERT's, for a hot path such as a memory store. `transaction()` is for several statements:
BEGIN, the caller's statements on `tx.conn` with `tx.append` / `tx.write` among them, COMMIT.
There is deliberately no update or delete path; the database rejects both too (a trigger).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import asyncpg

from orchestrator._json import dumps
from orchestrator.events._batch import GroupCommit, Prepared, outcome_unknown
from orchestrator.events._catalog import (
    InvalidEventData,
    UnknownEventType,
    aggregate_of,
    validate,
)
from orchestrator.events._model import Event, EventRejected, NewEvent, SeqConflict
from orchestrator.events._notifier import CARRIED_COMMIT, CARRIED_JOIN, FeedNotifier

log = logging.getLogger(__name__)

# Runs on each event before it is written (validate or enrich): returns it, maybe enriched,
# or raises EventRejected, which fails the whole write. Synchronous, so `append` can queue
# at once and keep its callers' order.
PreCommitHook = Callable[[NewEvent], NewEvent]
# Runs after commit with the committed events; a failure is logged, never undone.
PostCommitHook = Callable[[list[Event]], Awaitable[None]]


class EventTransaction:
    """An open transaction (`EventWriter.transaction`): change state with `conn`, record
    what happened with `append` or `write`. No savepoints (`conn.transaction()`) inside."""

    def __init__(self, writer: EventWriter, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.appended: list[Event] = []
        self._writer = writer

    async def append(
        self, events: Sequence[NewEvent], *, expected_seq: int | None = None
    ) -> list[Event]:
        """Append now, in this transaction. `expected_seq`: the last seq the events'
        aggregate must be at (SeqConflict otherwise); all events of one aggregate."""
        prepared = self._writer._prepare(events)
        _, committed = await self._writer._execute(
            self.conn, prepared, expected=_expected(prepared, expected_seq)
        )
        self.appended.extend(committed)
        return committed

    async def write(
        self,
        ctes: Sequence[str],
        args: Sequence[Any],
        events: Sequence[NewEvent],
        *,
        returning: str | None = None,
    ) -> tuple[asyncpg.Record | None, list[Event]]:
        """State changes and their events in ONE statement of this transaction (see
        `EventWriter.write`)."""
        prepared = self._writer._prepare(events)
        row, committed = await self._writer._execute(
            self.conn, prepared, ctes=ctes, args=args, returning=returning
        )
        self.appended.extend(committed)
        return row, committed


class EventWriter:
    """The writing half of the store (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._pre: list[PreCommitHook] = []
        self._post: list[PostCommitHook] = []
        self.notifier = FeedNotifier(pool)
        self._group = GroupCommit(
            pool, self._insert, self.notifier.carry, self._finish, self._committed_unknown
        )
        self._detached: set[asyncio.Future[list[Event]]] = set()

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    def add_pre_commit_hook(self, hook: PreCommitHook) -> None:
        self._pre.append(hook)

    def add_post_commit_hook(self, hook: PostCommitHook) -> None:
        self._post.append(hook)

    # --- writing (the table in the module docstring) ----------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[EventTransaction]:
        """Several statements, one commit. A failure in the block rolls everything back
        (no hook, no NOTIFY). The COMMIT carries the feeds' NOTIFY when one is due (same
        round trip) and runs to its end even if the caller is cancelled meanwhile; once it
        has committed, the feeds are woken and the hooks run (also when a cancel lands while
        the connection goes back to the pool), then the cancel goes on."""
        done: list[Event] = []  # committed: the hooks are owed, whatever happens next
        try:
            async with self._pool.acquire() as conn:
                await conn.execute("BEGIN")
                tx = EventTransaction(self, conn)
                try:
                    yield tx
                except BaseException:
                    await _rollback(conn)
                    raise
                carried = self.notifier.carry() if tx.appended else None
                # Run to its end: the connection goes back to the pool when this block ends
                # (a pooled connection handed on mid-statement fails its next user's
                # statement with "another operation is in progress"), and the hooks depend
                # on it.
                commit = asyncio.ensure_future(
                    conn.execute(CARRIED_COMMIT if carried is not None else "COMMIT")
                )
                cancelled = await _wait_out(commit)
                failed = commit.exception()
                if failed is not None:
                    if tx.appended and outcome_unknown(failed):
                        self.notifier.committed(None)
                    elif not outcome_unknown(failed):
                        # The carried NOTIFY's SELECT failed in an aborted transaction, so
                        # its COMMIT never ran: end the transaction here, not in the pool.
                        await _rollback(conn)
                    raise failed
                if commit.result() != "COMMIT":  # a statement failed and the block went on
                    raise asyncpg.InFailedSQLTransactionError(
                        "the transaction was aborted by an earlier error: nothing was committed"
                    )
                done = tx.appended
                if done:
                    self.notifier.committed(carried)  # synchronous: no cancel can skip it
        finally:
            if done and self._post:
                await asyncio.shield(self._run_post_hooks(done))
        if cancelled:
            raise asyncio.CancelledError

    def append(
        self, events: Sequence[NewEvent], *, expected_seq: int | None = None
    ) -> asyncio.Future[list[Event]]:
        """Append in a transaction of their own: validated (an invalid event raises here)
        and queued now; the future gets the committed events. Batches of one aggregate
        appended one after another commit in that order (often in one transaction);
        different aggregates' may commit in either order. A caller that stops waiting does
        not undo or orphan the write. With `expected_seq`, a transaction of its own."""
        if expected_seq is not None:
            # Shielded: a caller that stops waiting leaves the transaction to commit (the
            # set keeps it referenced until then).
            task = asyncio.ensure_future(self._append_expecting(events, expected_seq))
            self._detached.add(task)
            task.add_done_callback(self._detached.discard)
            return asyncio.shield(task)
        return self._group.submit(self._prepare(events))

    async def write(
        self,
        ctes: Sequence[str],
        args: Sequence[Any],
        events: Sequence[NewEvent],
        *,
        returning: str | None = None,
    ) -> tuple[asyncpg.Record | None, list[Event]]:
        """State changes and their events in ONE autocommitted statement: one round trip and
        one commit, nothing else in it. `ctes` are the caller's data-modifying CTEs (`name
        AS (INSERT/UPDATE ... RETURNING ...)`, parameters `$1..$len(args)`), run beside the
        append; `returning` names one of them, whose first row comes back (plus the
        columns `_event_position`, `_event_seq`), with the committed events. The statement
        carries the feeds' NOTIFY when one is due.

        Cancelled while the statement runs (or the connection lost), it may or may not have
        committed: the feeds are woken anyway (a NOTIFY too many costs one read), the hooks
        do not run."""
        prepared = self._prepare(events)
        carried = self.notifier.carry() if prepared else None
        try:
            row, committed = await self._execute(
                self._pool,
                prepared,
                ctes=ctes,
                args=args,
                returning=returning,
                carried=carried is not None,
            )
        except BaseException as exc:
            if prepared and outcome_unknown(exc):
                self.notifier.committed(None)
            raise
        await self._finish(committed, carried)
        return row, committed

    # --- how a write is made and ended -------------------------------------------------

    def _prepare(self, events: Sequence[NewEvent]) -> list[Prepared]:
        """Each event through the pre-commit hooks, validated against its type, with its
        aggregate and version: EventRejected if any is not acceptable."""
        return [self._prepare_one(e) for e in events]

    def _prepare_one(self, new: NewEvent) -> Prepared:
        for hook in self._pre:
            new = hook(new)
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

    async def _execute(
        self,
        conn: asyncpg.Connection | asyncpg.Pool,
        prepared: list[Prepared],
        *,
        ctes: Sequence[str] = (),
        args: Sequence[Any] = (),
        returning: str | None = None,
        expected: tuple[str, int] | None = None,
        carried: bool = False,
    ) -> tuple[asyncpg.Record | None, list[Event]]:
        """The one statement of every write: the caller's CTEs (if any) and the append.
        Only (position, seq) come back for the events: the rest is ours already."""
        if not prepared:
            if not ctes:
                return None, []
            tail = f"SELECT * FROM {returning} LIMIT 1" if returning else "SELECT 1"
            row = await conn.fetchrow(f"WITH {', '.join(ctes)} {tail}", *args)
            return (row if returning else None), []
        call, event_args, ids, timestamp = _append_call(prepared, expected, len(args))
        sql = _statement(call, tuple(ctes), returning, carried)
        try:
            rows = await conn.fetch(sql, *args, *event_args)
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
        numbered = sorted((r["_event_position"], r["_event_seq"]) for r in rows)
        committed = [
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
        return (rows[0] if returning is not None and rows else None), committed

    async def _insert(
        self, conn: asyncpg.Connection | asyncpg.Pool, prepared: list[Prepared], carried: bool
    ) -> list[Event]:
        """Events alone, autocommitted (the group commit's statement)."""
        _, committed = await self._execute(conn, prepared, carried=carried)
        return committed

    async def _append_expecting(self, events: Sequence[NewEvent], expected_seq: int) -> list[Event]:
        async with self.transaction() as tx:
            return await tx.append(events, expected_seq=expected_seq)

    async def _finish(self, events: list[Event], carried: float | None) -> None:
        """After a commit: the feeds' wake-up (first: a caller cancelled during the hooks
        still wakes them), then the post-commit hooks, which run to their end even if the
        caller is cancelled (the events are committed)."""
        if not events:
            return
        self.notifier.committed(carried)
        if self._post:  # (a task per write only when there is a hook to run)
            await asyncio.shield(self._run_post_hooks(events))

    def _committed_unknown(self) -> None:
        """A group commit whose outcome is unknown: the feeds read in case it committed."""
        self.notifier.committed(None)

    async def _run_post_hooks(self, events: list[Event]) -> None:
        for hook in self._post:
            try:
                await hook(events)
            except Exception:
                log.exception("post-commit hook %r failed for %d event(s)", hook, len(events))


def _expected(prepared: list[Prepared], expected_seq: int | None) -> tuple[str, int] | None:
    if expected_seq is None or not prepared:
        return None
    aggregates = {aggregate for _, aggregate, _ in prepared}
    if len(aggregates) != 1:
        raise EventRejected("expected_seq needs all events to belong to one aggregate")
    return aggregates.pop(), expected_seq


@functools.lru_cache(maxsize=64)
def _marks(first: int, count: int, json_cast: str) -> str:
    """An append function's parameters after the caller's `first`; the bodies (5th) are
    JSON texts, cast on the server."""
    return ", ".join(
        f"${first + i}{json_cast}" if i == 5 else f"${first + i}" for i in range(1, count + 1)
    )


def _append_call(
    prepared: list[Prepared], expected: tuple[str, int] | None, first: int
) -> tuple[str, list[Any], list[uuid.UUID], int]:
    """The append function's call (its parameters numbered after the caller's `first`), its
    arguments, the events' ids and timestamp. One event, the common case, goes through
    `append_event` with scalar arguments (migration 0019: no arrays to encode or unpack,
    no PL/pgSQL); several, or an expected seq, through `append_events`."""
    timestamp = int(time.time() * 1000)
    if len(prepared) == 1 and expected is None:
        new, aggregate, version = prepared[0]
        event_id = uuid.uuid4()
        args = [
            event_id,
            new.type,
            version,
            aggregate,
            dumps(new.data).decode(),
            new.user_uuid,
            timestamp,
        ]
        return f"append_event({_marks(first, 7, '::jsonb')})", args, [event_id], timestamp
    ids = [uuid.uuid4() for _ in prepared]
    args = [
        ids,
        [new.type for new, _, _ in prepared],
        [version for _, _, version in prepared],
        [aggregate for _, aggregate, _ in prepared],
        [dumps(new.data).decode() for new, _, _ in prepared],
        [new.user_uuid for new, _, _ in prepared],
        timestamp,
        expected[0] if expected else None,
        expected[1] if expected else None,
    ]
    return f"append_events({_marks(first, 9, '::jsonb[]')})", args, ids, timestamp


@functools.lru_cache(maxsize=256)
def _statement(call: str, ctes: tuple[str, ...], returning: str | None, carried: bool) -> str:
    """The statement of a write. The appended rows drive it (the caller's CTEs run in full
    either way: Postgres always completes data-modifying CTEs), so every event's (position,
    seq) comes back, beside the first row of `returning`."""
    carry = CARRIED_JOIN if carried else ""
    numbered = "a.out_position AS _event_position, a.out_seq AS _event_seq"
    if not ctes:
        return f"SELECT {numbered} FROM {call} a{carry}"
    head = f"WITH {', '.join(ctes)}, appended AS (SELECT * FROM {call})"
    if returning is None:
        return f"{head} SELECT {numbered} FROM appended a{carry}"
    return (
        f"{head} SELECT {numbered}, s.* FROM appended a"
        f" LEFT JOIN (SELECT * FROM {returning} LIMIT 1) s ON true{carry}"
    )


async def _rollback(conn: asyncpg.Connection) -> None:
    """After a failure in the block. If the connection cannot roll back (it broke, or a
    cancelled statement is still winding down), the pool's reset does, or drops it."""
    try:
        await conn.execute("ROLLBACK")
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.debug("rollback failed (left to the pool): %r", exc)


async def _wait_out(task: asyncio.Future[Any]) -> bool:
    """Wait for `task` to end even if the caller is cancelled meanwhile; whether it was."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # noqa: BLE001 - the task's own error, read by the caller
            break
    return cancelled
