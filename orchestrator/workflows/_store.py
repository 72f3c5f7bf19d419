"""Workflows in Postgres. Every transition updates the rows and appends its events in one
transaction (the state machine tables are checked first); reads are tenant-scoped: another
user's workflow is a 404, admins see every one. A user has at most
`workflow_max_live_per_user` workflows pending or running (`check_live_room`, 429)."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from orchestrator.auth import Principal
from orchestrator.errors import Conflict, NotFound, RateLimited, ValidationFailed
from orchestrator.events import EventStore, EventTransaction, NewEvent
from orchestrator.runtime.claims import ClaimStore, Fence
from orchestrator.workflows._spec import WorkflowSpec, template_variables
from orchestrator.workflows._states import (
    DELETABLE,
    FINISHED,
    StepState,
    WorkflowState,
    check_transition,
)


def now_ms() -> int:
    return int(time.time() * 1000)


# Drivers hear of a workflow's end (`done:<id>`: a parent waiting for its children, a
# cancel waiting for compensation) and of a cancel (`cancel:<id>`: its driver stops the
# running step) on this channel, sent by the transaction that commits the change.
NOTIFY_CHANNEL = "orch_workflows"
CLAIM_KIND = "workflow"
# With hashtext(user_uuid): serialises one user's creations, so the live ceiling holds
# under concurrency (other modules use 947735-947742).
LIVE_LOCK = 947744
# Live workflows end at their own pace: a client over its ceiling is told to look again
# after this many seconds.
LIVE_RETRY_AFTER_S = 10
# The longest a creation waits for its user's creation lock (then LiveLockBusy, a 429).
LIVE_LOCK_WAIT_MS = 2000


class LiveLockBusy(RateLimited):
    """The user's creation lock was not had within LIVE_LOCK_WAIT_MS (other creations of
    theirs hold it): a 429 to a client; a spawn step retries (nothing is over a limit)."""


def shard_of(workflow_id: str, shards: int) -> int:
    """The shard a new workflow is sent to first: its number modulo the shard count (any
    live shard takes it over once its claim is free; see WorkflowEngine)."""
    return int(workflow_id.removeprefix("wf-")) % max(1, shards)


@dataclass(frozen=True, slots=True)
class StepRecord:
    idx: int
    name: str
    status: StepState
    attempt: int
    key: str | None
    result: str | None
    error: str | None
    compensated: bool

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": str(self.status)}
        if self.status == StepState.COMPLETED and self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out


def _step_wire(step: StepRecord, spec: WorkflowSpec) -> dict[str, Any]:
    """A step as GET /workflows/{id} shows it: with the skills pinned for it, if any."""
    out = step.wire()
    index = spec.step_index.get(step.name)
    if index is not None and spec.steps[index].skills:
        out["skills"] = spec.steps[index].to_json()["skills"]
    return out


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    id: str
    user_uuid: str
    name: str
    status: WorkflowState
    spec: WorkflowSpec
    parent_id: str | None
    parent_step: str | None
    cursor: int
    executed: int
    ending: str | None
    error: str | None
    created_at: int
    updated_at: int
    steps: tuple[StepRecord, ...]

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def step(self, name: str) -> StepRecord | None:
        index = self.spec.step_index.get(name)
        return self.steps[index] if index is not None else None

    def lookup(self, step: str, attr: str) -> str:
        """`{{step.result}}` / `{{step.status}}`: "" for a result not there yet."""
        record = self.step(step)
        if record is None:
            return ""
        if attr == "status":
            return str(record.status)
        return record.result or "" if record.status == StepState.COMPLETED else ""

    def last_result(self) -> str | None:
        done = [s for s in self.steps if s.status == StepState.COMPLETED and s.result]
        return done[-1].result if done else None


_SELECT = (
    "SELECT w.id, w.user_uuid, w.name, w.status, w.spec::text AS spec, w.parent_id,"
    " w.parent_step, w.cursor, w.executed, w.ending, w.error, w.created_at, w.updated_at,"
    " (SELECT json_agg(json_build_array(s.idx, s.name, s.status, s.attempt,"
    " s.idempotency_key, s.result, s.error, s.compensated) ORDER BY s.idx)"
    " FROM workflow_steps s WHERE s.workflow_id = w.id)::text AS steps"
    " FROM workflows w"
)
_LOAD = _SELECT + " WHERE w.id = $1"


class WorkflowStore:
    def __init__(self, pool: asyncpg.Pool, events: EventStore) -> None:
        self._pool = pool
        self._events = events

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    # --- creating and reading ---------------------------------------------------------------

    async def check_live_room(
        self,
        conn: asyncpg.Connection,
        user_uuid: str,
        adding: int,
        ceiling: int,
        *,
        field: str = "steps",
    ) -> None:
        """Within `conn`'s transaction (which then creates them): room for `adding` more
        pending or running workflows of `user_uuid` under `ceiling`, or a 429 naming the
        setting (a 400 naming `field` when `adding` alone is over it: waiting would not
        help). Holds the user's creation lock until that transaction ends; waits at most
        LIVE_LOCK_WAIT_MS for it (LiveLockBusy), since it waits holding a pool connection."""
        if adding > ceiling:
            message = (
                f"this request starts {adding} workflows, more than the {ceiling} a user may"
                " have pending or running (workflow_max_live_per_user)"
            )
            raise ValidationFailed(
                f"{field}: {message}",
                extra={
                    "limit": "workflow_max_live_per_user",
                    "fields": [{"field": field, "error": message}],
                },
            )
        # The lock's wait is bounded (a user's creations queued behind each other would
        # each hold one of the pool's connections); the bound ends with the lock taken.
        previous = await conn.fetchval(  # (the target list is evaluated in order)
            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)",
            f"{LIVE_LOCK_WAIT_MS}ms",
        )
        try:
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))", LIVE_LOCK, user_uuid
            )
        except asyncpg.LockNotAvailableError:
            raise LiveLockBusy(
                "too many of your workflows are being created at once: try again"
                " (workflow_max_live_per_user is checked one creation at a time)",
                retry_after=1,
                extra={"limit": "workflow_max_live_per_user"},
            ) from None
        # Counted with the partial index workflows_live_user (migration 0021).
        live = await conn.fetchval(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM workflows WHERE user_uuid = $1"
            " AND status IN ('pending', 'running') LIMIT $2) t),"
            " set_config('lock_timeout', $3, true)",
            user_uuid,
            ceiling + 1,
            previous,
        )
        if live + adding > ceiling:
            raise RateLimited(
                f"{live} of your workflows are pending or running and this would start"
                f" {adding} more: at most {ceiling} (workflow_max_live_per_user)",
                retry_after=LIVE_RETRY_AFTER_S,
                extra={"limit": "workflow_max_live_per_user", "live": live},
            )

    async def create_within(
        self, spec: WorkflowSpec, user_uuid: str, *, starts: int, ceiling: int
    ) -> str:
        """Create a root workflow that will start `starts` workflows in all (its tree), if
        its user has room for them under `ceiling` (check_live_room)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self.check_live_room(conn, user_uuid, starts, ceiling)
            return await self.create(spec, user_uuid, conn=conn)

    async def create(
        self,
        spec: WorkflowSpec,
        user_uuid: str,
        *,
        parent_id: str | None = None,
        parent_step: str | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> str:
        async def insert(c: asyncpg.Connection) -> str:
            number = await c.fetchval("SELECT nextval('workflow_seq')")
            wid = f"wf-{number}"
            ts = now_ms()
            await c.execute(
                "INSERT INTO workflows (id, number, user_uuid, name, status, spec, parent_id,"
                " parent_step, created_at, updated_at)"
                " VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8, $8)",
                wid,
                number,
                user_uuid,
                spec.name,
                json.dumps(spec.to_json()),
                parent_id,
                parent_step,
                ts,
            )
            await c.executemany(
                "INSERT INTO workflow_steps (workflow_id, idx, name) VALUES ($1, $2, $3)",
                [(wid, i, s.name) for i, s in enumerate(spec.steps)],
            )
            return wid

        if conn is not None:
            return await insert(conn)
        async with self._pool.acquire() as c, c.transaction():
            return await insert(c)

    async def load(
        self, workflow_id: str, conn: Any = None, *, for_update: bool = False
    ) -> WorkflowRecord | None:
        """Unscoped (the engine's view): the workflow and its steps in one round trip."""
        c = conn or self._pool
        row = await c.fetchrow(_LOAD + (" FOR UPDATE OF w" if for_update else ""), workflow_id)
        return _record(row) if row is not None else None

    async def get(self, workflow_id: str, principal: Principal) -> WorkflowRecord:
        record = await self.load(workflow_id)
        if record is None or not (principal.is_admin or record.user_uuid == principal.user_uuid):
            raise NotFound(f"workflow {workflow_id} not found")
        return record

    async def detail(self, workflow_id: str, principal: Principal) -> dict[str, Any]:
        record = await self.get(workflow_id, principal)
        children = await self._pool.fetch(
            "SELECT id FROM workflows WHERE parent_id = $1 ORDER BY number", workflow_id
        )
        return {
            "id": record.id,
            "name": record.name,
            "status": str(record.status),
            "steps": [_step_wire(s, record.spec) for s in record.steps],
            "parent_id": record.parent_id,
            "children": [r["id"] for r in children],
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "error": record.error,
        }

    async def page(
        self,
        principal: Principal,
        *,
        status: str | None = None,
        parent: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        where = ["TRUE" if principal.is_admin else "user_uuid = $1"]
        args: list[Any] = [principal.user_uuid]
        if status is not None:
            args.append(status)
            where.append(f"status = ${len(args)}")
        if parent is not None:
            args.append(parent)
            where.append(f"parent_id = ${len(args)}")
        clause = " AND ".join(where)
        total = await self._pool.fetchval(
            f"SELECT count(*) FROM workflows WHERE {clause} AND $1::text IS NOT NULL", *args
        )
        rows = await self._pool.fetch(
            "SELECT id, name, status, created_at, updated_at, parent_id FROM workflows"
            f" WHERE {clause} AND $1::text IS NOT NULL ORDER BY number DESC"
            f" LIMIT {int(limit)} OFFSET {int(offset)}",
            *args,
        )
        return [dict(r) for r in rows], int(total)

    async def children(self, workflow_id: str) -> list[WorkflowRecord]:
        """Every child with its steps, in one query."""
        rows = await self._pool.fetch(
            _SELECT + " WHERE w.parent_id = $1 ORDER BY w.number", workflow_id
        )
        return [_record(r) for r in rows]

    async def load_many(self, ids: Sequence[str]) -> list[WorkflowRecord]:
        """The workflows of `ids` that exist, with their steps, in one query (by number)."""
        rows = await self._pool.fetch(
            _SELECT + " WHERE w.id = ANY($1::text[]) ORDER BY w.number", list(ids)
        )
        return [_record(r) for r in rows]

    async def children_of_step(self, workflow_id: str, step: str) -> list[str]:
        rows = await self._pool.fetch(
            "SELECT id FROM workflows WHERE parent_id = $1 AND parent_step = $2 ORDER BY number",
            workflow_id,
            step,
        )
        return [r["id"] for r in rows]

    async def statuses(self, ids: Sequence[str]) -> dict[str, str]:
        rows = await self._pool.fetch(
            "SELECT id, status FROM workflows WHERE id = ANY($1::text[])", list(ids)
        )
        return {r["id"]: r["status"] for r in rows}

    async def delete(self, workflow_id: str, principal: Principal) -> int:
        """Delete a completed or cancelled workflow and its descendants (all finished too)."""
        record = await self.get(workflow_id, principal)
        if record.status not in DELETABLE:
            raise Conflict(
                f"workflow {workflow_id} is {record.status}: only completed or cancelled"
                " workflows can be deleted",
                extra={"status": str(record.status)},
            )
        busy = await self._pool.fetchval(
            "WITH RECURSIVE tree(id) AS (SELECT id FROM workflows WHERE parent_id = $1"
            " UNION ALL SELECT w.id FROM workflows w JOIN tree t ON w.parent_id = t.id)"
            " SELECT count(*) FROM workflows WHERE id IN (SELECT id FROM tree)"
            " AND status NOT IN ('completed', 'failed', 'cancelled')",
            workflow_id,
        )
        if busy:
            raise Conflict(
                f"workflow {workflow_id} has {busy} descendant workflow(s) still running"
                " (compensating); delete it once they have ended",
                extra={"status": str(record.status)},
            )
        result = await self._pool.execute(
            "DELETE FROM workflows WHERE id = $1 AND status = ANY($2::text[])",
            workflow_id,
            [str(s) for s in DELETABLE],
        )
        if result.endswith(" 0"):
            raise Conflict(f"workflow {workflow_id} changed state; try again")
        return 1

    async def unfinished(self, shard_index: int, shards: int) -> list[str]:
        rows = await self._pool.fetch(
            "SELECT id FROM workflows WHERE status IN ('pending', 'running')"
            " AND number % $1 = $2 ORDER BY number",
            max(1, shards),
            shard_index,
        )
        return [r["id"] for r in rows]

    async def unclaimed(
        self, limit: int, owner: str, shard_index: int = 0, shards: int = 1
    ) -> list[str]:
        """Unfinished workflows nobody else drives (no live claim but `owner`'s): never
        started, their driver dead, an old shard layout's, or `owner`'s previous
        incarnation's. This shard's own (`number % shards`) first; within each, round-robin
        by user (each user's oldest, then each one's second oldest, ...): after a restart,
        another user's workflow does not wait behind every older one of a user's backlog."""
        rows = await self._pool.fetch(
            "SELECT id FROM (SELECT id, number, number % $1 = $2 AS own, row_number() OVER"
            " (PARTITION BY number % $1 = $2, user_uuid ORDER BY number) AS turn"
            " FROM workflows w WHERE status IN ('pending', 'running') AND "
            + ClaimStore.unclaimed_sql(CLAIM_KIND, "w.id", "$4")
            + ") t ORDER BY own DESC, turn, number LIMIT $3",
            max(1, shards),
            shard_index,
            limit,
            owner,
        )
        return [r["id"] for r in rows]

    # --- transitions (each one transaction: rows + events) ----------------------------------

    async def _tx_load(
        self, tx: EventTransaction, workflow_id: str, fence: Fence | None
    ) -> WorkflowRecord:
        """The workflow locked for this transaction; with a fence, first proof that the
        caller still drives it (StaleClaim, and nothing written, otherwise)."""
        if fence is not None:
            # One round trip: the workflow locked only if the claim is at our epoch.
            row = await tx.conn.fetchrow(
                _SELECT
                + fence.join_sql("w.id", "$2")
                + " WHERE w.id = $1 FOR UPDATE OF w FOR SHARE OF claim",
                workflow_id,
                fence.epoch,
            )
            if row is not None:
                return _record(row)
            await fence.check(tx.conn)  # raises StaleClaim, unless the workflow is gone
        record = await self.load(workflow_id, tx.conn, for_update=True)
        if record is None:
            raise NotFound(f"workflow {workflow_id} not found")
        return record

    @staticmethod
    async def _set_workflow(tx: EventTransaction, record: WorkflowRecord, **columns: Any) -> None:
        if "status" in columns:
            check_transition("workflow", record.status, columns["status"], record.id)
        columns["updated_at"] = now_ms()
        sets = ", ".join(f"{k} = ${i + 2}" for i, k in enumerate(columns))
        await tx.conn.execute(
            f"UPDATE workflows SET {sets} WHERE id = $1", record.id, *columns.values()
        )

    @staticmethod
    async def _set_both(
        tx: EventTransaction,
        record: WorkflowRecord,
        idx: int,
        step: dict[str, Any],
        workflow: dict[str, Any],
        result_status: str | None = None,
    ) -> bool:
        """`_set_step` and `_set_workflow` in one statement (one round trip). With
        `result_status`, the step's attempt result is recorded too (workflow_step_results,
        once per key): False, and nothing written, when it was recorded already."""
        current = record.steps[idx]
        if "status" in step and step["status"] != current.status:
            check_transition("step", current.status, step["status"], f"step {current.name}")
        if "status" in workflow:
            check_transition("workflow", record.status, workflow["status"], record.id)
        workflow = {**workflow, "updated_at": now_ms()}
        n = len(step)
        step_sets = ", ".join(f"{k} = ${i + 3}" for i, k in enumerate(step))
        wf_sets = ", ".join(f"{k} = ${i + 3 + n}" for i, k in enumerate(workflow))
        if result_status is None:
            await tx.conn.execute(
                f"WITH s AS (UPDATE workflow_steps SET {step_sets}"
                " WHERE workflow_id = $1 AND idx = $2 RETURNING 1)"
                f" UPDATE workflows SET {wf_sets} WHERE id = $1",
                record.id,
                idx,
                *step.values(),
                *workflow.values(),
            )
            return True
        m = n + len(workflow)
        done = await tx.conn.fetchval(
            "WITH r AS (INSERT INTO workflow_step_results (idempotency_key, workflow_id, step,"
            f" status, recorded_at) VALUES (${m + 3}, $1, ${m + 4}, ${m + 5}, ${m + 6})"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1),"
            f" s AS (UPDATE workflow_steps SET {step_sets}"
            " WHERE workflow_id = $1 AND idx = $2 AND EXISTS (SELECT 1 FROM r) RETURNING 1)"
            f" UPDATE workflows SET {wf_sets} WHERE id = $1 AND EXISTS (SELECT 1 FROM r)"
            " RETURNING 1",
            record.id,
            idx,
            *step.values(),
            *workflow.values(),
            current.key,
            current.name,
            result_status,
            now_ms(),
        )
        return done is not None

    @staticmethod
    async def _set_step(
        tx: EventTransaction, record: WorkflowRecord, idx: int, **columns: Any
    ) -> None:
        step = record.steps[idx]
        if "status" in columns and columns["status"] != step.status:
            check_transition("step", step.status, columns["status"], f"step {step.name}")
        sets = ", ".join(f"{k} = ${i + 3}" for i, k in enumerate(columns))
        await tx.conn.execute(
            f"UPDATE workflow_steps SET {sets} WHERE workflow_id = $1 AND idx = $2",
            record.id,
            idx,
            *columns.values(),
        )

    @staticmethod
    def _event(record: WorkflowRecord, type_: str, **data: Any) -> NewEvent:
        payload = {"workflow_id": record.id, **{k: v for k, v in data.items() if v is not None}}
        return NewEvent(type_, payload, record.user_uuid)

    async def mark_started(self, workflow_id: str, fence: Fence | None = None) -> WorkflowRecord:
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            if record.status == WorkflowState.PENDING:
                await self._set_workflow(tx, record, status=WorkflowState.RUNNING)
                await tx.append(
                    [
                        self._event(
                            record,
                            "workflow.started",
                            name=record.name,
                            user_uuid=record.user_uuid,
                            steps=[s.name for s in record.spec.steps],
                            parent_id=record.parent_id,
                        )
                    ]
                )
        loaded = await self.load(workflow_id)
        assert loaded is not None
        return loaded

    async def start_step(
        self,
        workflow_id: str,
        idx: int,
        with_events: Callable[[str], Sequence[NewEvent]] | None = None,
        fence: Fence | None = None,
    ) -> tuple[int, str]:
        """pending/running -> running with a new attempt; its idempotency key.
        `with_events(key)` gives events to commit with it (the step task's task.created)."""
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            attempt, key, events = await self._start_in(tx, record, idx, with_events)
            await tx.append(events)
        return attempt, key

    async def _start_in(
        self,
        tx: EventTransaction,
        record: WorkflowRecord,
        idx: int,
        with_events: Callable[[str], Sequence[NewEvent]] | None,
    ) -> tuple[int, str, list[NewEvent]]:
        step = record.steps[idx]
        attempt = step.attempt + 1
        key = f"{record.id}:{step.name}:{attempt}"
        await self._set_both(
            tx,
            record,
            idx,
            {
                "status": StepState.RUNNING,
                "attempt": attempt,
                "idempotency_key": key,
                "started_at": now_ms(),
                "error": None,
            },
            {"cursor": idx, "executed": record.executed + 1},
        )
        events = [
            self._event(record, "workflow.step_started", step=step.name, attempt=attempt),
            *(with_events(key) if with_events is not None else ()),
        ]
        return attempt, key, events

    async def finish_step(
        self,
        workflow_id: str,
        idx: int,
        key: str,
        *,
        ok: bool,
        result: str | None,
        error: str | None,
        duration_ms: int,
        next_cursor: int,
        skip: Sequence[int] = (),
        rewind: range | None = None,
        fence: Fence | None = None,
    ) -> bool:
        """Record the step attempt's outcome once. False (nothing written) when the attempt
        is not the step's current running one or its result is already recorded."""
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            events = await self._finish_in(
                tx, record, idx, key, ok, result, error, duration_ms, next_cursor, skip, rewind
            )
            if events is None:
                return False
            await tx.append(events)
        return True

    async def finish_and_start_next(
        self,
        workflow_id: str,
        idx: int,
        key: str,
        *,
        result: str | None,
        duration_ms: int,
        plan: Callable[[WorkflowRecord], tuple[int, Callable[[str], Sequence[NewEvent]]] | None],
        fence: Fence | None = None,
    ) -> tuple[bool, tuple[int, str] | None]:
        """A completed task step's result and, in the same transaction (one commit per step
        instead of two), the start of the next step that `plan(the workflow as now)`
        names with its events, if any: (recorded?, (next index, its key) or None)."""
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            events = await self._finish_in(
                tx, record, idx, key, True, result, None, duration_ms, idx + 1, (), None
            )
            if events is None:
                return False, None
            following: tuple[int, str] | None = None
            # The workflow as it is now, without reading it again: the step completed with
            # its result, the cursor past it.
            fresh = replace(
                record,
                cursor=idx + 1,
                steps=tuple(
                    replace(s, status=StepState.COMPLETED, result=result, error=None)
                    if s.idx == idx
                    else s
                    for s in record.steps
                ),
            )
            planned = plan(fresh)
            if planned is not None:
                nxt, with_events = planned
                _, next_key, started = await self._start_in(tx, fresh, nxt, with_events)
                events += started
                following = (nxt, next_key)
            await tx.append(events)
        return True, following

    async def _finish_in(
        self,
        tx: EventTransaction,
        record: WorkflowRecord,
        idx: int,
        key: str,
        ok: bool,
        result: str | None,
        error: str | None,
        duration_ms: int,
        next_cursor: int,
        skip: Sequence[int],
        rewind: range | None,
    ) -> list[NewEvent] | None:
        """The outcome's writes in `tx`; its events, or None when not recorded."""
        workflow_id = record.id
        step = record.steps[idx]
        if step.status != StepState.RUNNING or step.key != key:
            return None
        status = StepState.COMPLETED if ok else StepState.FAILED
        outcome = {
            "status": status,
            "result": result if ok else None,
            "error": None if ok else error,
            "finished_at": now_ms(),
        }
        if ok:
            # The result row, the step and the cursor in one statement.
            if not await self._set_both(
                tx, record, idx, outcome, {"cursor": next_cursor}, result_status="completed"
            ):
                return None
            # A branch's jump commits with its result: a crash cannot split them.
            for i in skip:
                if record.steps[i].status == StepState.PENDING:
                    await self._set_step(tx, record, i, status=StepState.SKIPPED)
            if rewind is not None:
                fresh = await self.load(workflow_id, tx.conn)
                assert fresh is not None
                for i in rewind:
                    if fresh.steps[i].status in (StepState.COMPLETED, StepState.SKIPPED):
                        await self._set_step(
                            tx, fresh, i, status=StepState.PENDING, result=None, error=None
                        )
            event = self._event(
                record,
                "workflow.step_completed",
                step=step.name,
                duration_ms=duration_ms,
                output=result,
                attempt=step.attempt,
            )
        else:
            inserted = await tx.conn.fetchval(
                "INSERT INTO workflow_step_results (idempotency_key, workflow_id, step, status,"
                " recorded_at) VALUES ($1, $2, $3, 'failed', $4)"
                " ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1",
                key,
                workflow_id,
                step.name,
                now_ms(),
            )
            if inserted is None:
                return None
            await self._set_step(tx, record, idx, **outcome)
            event = self._event(
                record,
                "workflow.step_failed",
                step=step.name,
                error=error,
                attempt=step.attempt,
            )
        return [event]

    async def skip_steps(
        self,
        workflow_id: str,
        idxs: Iterable[int],
        next_cursor: int,
        fence: Fence | None = None,
    ) -> None:
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            for idx in idxs:
                if record.steps[idx].status == StepState.PENDING:
                    await self._set_step(tx, record, idx, status=StepState.SKIPPED)
            await self._set_workflow(tx, record, cursor=next_cursor)

    async def begin_ending(
        self,
        workflow_id: str,
        ending: str,
        reason: str,
        step: str | None = None,
        fence: Fence | None = None,
    ) -> WorkflowRecord | None:
        """Start compensating towards failed or cancelled (once). Steps still pending or
        running are skipped. None when the workflow has finished already. Without a fence
        (a cancel request, from anywhere) its driver hears `cancel:<id>`."""
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            if record.finished:
                return None
            if record.ending is None:
                for s in record.steps:
                    if s.status in (StepState.PENDING, StepState.RUNNING):
                        await self._set_step(
                            tx,
                            record,
                            s.idx,
                            status=StepState.SKIPPED,
                            error="cancelled" if ending == "cancelled" else s.error,
                        )
                await self._set_workflow(tx, record, ending=ending, error=reason)
                to_compensate = [
                    s.name for s in reversed(record.steps) if s.status == StepState.COMPLETED
                ]
                if fence is None:
                    await tx.conn.execute(
                        "SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, f"cancel:{workflow_id}"
                    )
                await tx.append(
                    [
                        self._event(
                            record,
                            "workflow.compensating",
                            reason=reason,
                            step=step,
                            steps=to_compensate,
                            ending=ending,
                        )
                    ]
                )
        return await self.load(workflow_id)

    async def mark_compensated(
        self, workflow_id: str, idx: int, *, ok: bool, detail: str, fence: Fence | None = None
    ) -> None:
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            step = record.steps[idx]
            if step.compensated:
                return
            await self._set_step(tx, record, idx, compensated=True)
            await tx.append(
                [
                    self._event(
                        record,
                        "workflow.compensating",
                        step=step.name,
                        reason=detail,
                        ok=ok,
                    )
                ]
            )

    async def finish(
        self,
        workflow_id: str,
        status: WorkflowState,
        *,
        error: str | None = None,
        step: str | None = None,
        fence: Fence | None = None,
    ) -> bool:
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            if record.finished:
                return False
            await self._set_workflow(tx, record, status=status, error=error)
            duration = now_ms() - record.created_at
            if status == WorkflowState.COMPLETED:
                event = self._event(
                    record,
                    "workflow.completed",
                    duration_ms=duration,
                    output=record.last_result(),
                )
            elif status == WorkflowState.FAILED:
                event = self._event(record, "workflow.failed", step=step, error=error)
            else:
                event = self._event(record, "workflow.cancelled", reason=error)
            await tx.append([event])
            await tx.conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, f"done:{workflow_id}")
            if fence is not None:
                await fence.release_in(tx.conn)  # finished: nobody needs to drive it again
        return True

    # --- templates ------------------------------------------------------------------------

    async def save_template(
        self, name: str, steps: list[dict[str, Any]], principal: Principal, *, shared: bool
    ) -> list[str]:
        variables = template_variables(steps)
        ts = now_ms()
        await self._pool.execute(
            "INSERT INTO workflow_templates (owner, name, steps, variables, created_by,"
            " created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6)"
            " ON CONFLICT (owner, name) DO UPDATE SET steps = EXCLUDED.steps,"
            " variables = EXCLUDED.variables, updated_at = EXCLUDED.updated_at",
            "" if shared else principal.user_uuid,
            name,
            json.dumps(steps),
            variables,
            principal.user_uuid,
            ts,
        )
        return variables

    async def get_template(self, name: str, user_uuid: str) -> dict[str, Any] | None:
        """The user's own template of that name, else a shared one."""
        row = await self._pool.fetchrow(
            "SELECT owner, name, steps, variables, created_by, created_at FROM"
            " workflow_templates WHERE name = $1 AND owner IN ($2, '')"
            " ORDER BY owner = '' LIMIT 1",
            name,
            user_uuid,
        )
        return _template(row) if row is not None else None

    async def list_templates(self, principal: Principal) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(
            "SELECT owner, name, steps, variables, created_by, created_at FROM"
            f" workflow_templates WHERE {'TRUE' if principal.is_admin else 'owner IN ($1, %s)'}"
            " AND $1::text IS NOT NULL ORDER BY name, owner".replace("%s", "''"),
            principal.user_uuid,
        )
        return [_template(r) for r in rows]


def _template(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "name": row["name"],
        "steps": json.loads(row["steps"]),
        "variables": list(row["variables"]),
        "shared": row["owner"] == "",
        "owner": row["owner"] or None,
        "created_at": row["created_at"],
    }


class _SpecCache:
    """Parsed specs by their text. A workflow's spec never changes after creation: parse
    (and check) it once. Bounded by characters, not entries: a tenant's large specs (up to
    workflow_max_spec_chars each) cannot grow a shard past `max_chars`."""

    def __init__(self, max_chars: int) -> None:
        self._max = max_chars
        self._chars = 0
        self._items: OrderedDict[str, WorkflowSpec] = OrderedDict()

    def get(self, text: str) -> WorkflowSpec:
        spec = self._items.get(text)
        if spec is not None:
            self._items.move_to_end(text)
            return spec
        spec = WorkflowSpec.from_json(json.loads(text))
        if len(text) <= self._max // 8:
            self._items[text] = spec
            self._chars += len(text)
            while self._chars > self._max:
                old, _ = self._items.popitem(last=False)
                self._chars -= len(old)
        return spec


_SPECS = _SpecCache(64 << 20)


def _record(row: asyncpg.Record) -> WorkflowRecord:
    spec = _SPECS.get(row["spec"])
    steps = json.loads(row["steps"] or "[]")
    return WorkflowRecord(
        id=row["id"],
        user_uuid=row["user_uuid"],
        name=row["name"],
        status=WorkflowState(row["status"]),
        spec=spec,
        parent_id=row["parent_id"],
        parent_step=row["parent_step"],
        cursor=row["cursor"],
        executed=row["executed"],
        ending=row["ending"],
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        steps=tuple(
            StepRecord(
                idx=idx,
                name=name,
                status=StepState(status),
                attempt=attempt,
                key=key,
                result=result,
                error=error,
                compensated=compensated,
            )
            for idx, name, status, attempt, key, result, error, compensated in steps
        ),
    )
