"""Workflows in Postgres: the store. Here, creating, reading and deleting them: reads are
tenant-scoped (another user's workflow is a 404, admins see every one), and a user has at
most `workflow_max_live_per_user` workflows pending or running (`check_live_room`, 429).
The rows as records are in _records.py, the transitions (each one transaction: rows and
events) in _transitions.py, templates in _templates.py; `WorkflowStore` is all three."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from orchestrator.auth import Principal
from orchestrator.errors import Conflict, NotFound, RateLimited, ValidationFailed
from orchestrator.events import EventStore
from orchestrator.runtime.claims import ClaimStore
from orchestrator.workflows._records import (
    _SELECT,
    StepRecord,
    WorkflowRecord,
    _record,
    _step_wire,
    load_record,
    now_ms,
)
from orchestrator.workflows._spec import WorkflowSpec
from orchestrator.workflows._states import DELETABLE
from orchestrator.workflows._templates import WorkflowTemplates
from orchestrator.workflows._transitions import NOTIFY_CHANNEL, WorkflowTransitions

# Re-exported: imported from here by the package and the engine.
__all__ = [
    "CLAIM_KIND",
    "LIVE_LOCK",
    "NOTIFY_CHANNEL",
    "LiveLockBusy",
    "StepRecord",
    "WorkflowRecord",
    "WorkflowStore",
    "shard_of",
]

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


class WorkflowStore(WorkflowTransitions, WorkflowTemplates):
    """Creating, reading and deleting workflows (here), their transitions
    (_transitions.py) and templates (_templates.py), over one pool and event store."""

    def __init__(self, pool: asyncpg.Pool, events: EventStore) -> None:
        self._pool = pool
        self._events = events

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def events(self) -> EventStore:
        return self._events

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
                    "fields": [{"field": field, "message": message}],
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
        self,
        spec: WorkflowSpec,
        user_uuid: str,
        *,
        starts: int,
        ceiling: int,
        before_commit: Callable[[asyncpg.Connection, str], Awaitable[None]] | None = None,
    ) -> str:
        """Create a root workflow that will start `starts` workflows in all (its tree), if
        its user has room for them under `ceiling` (check_live_room). `before_commit(conn,
        workflow_id)` runs in the creation's transaction (an idempotency key's answer,
        orchestrator/idempotency.py): if it raises, nothing is created."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self.check_live_room(conn, user_uuid, starts, ceiling)
            workflow_id = await self.create(spec, user_uuid, conn=conn)
            if before_commit is not None:
                await before_commit(conn, workflow_id)
            return workflow_id

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
        return await load_record(conn or self._pool, workflow_id, for_update=for_update)

    async def get(self, workflow_id: str, principal: Principal) -> WorkflowRecord:
        record = await self.load(workflow_id)
        if record is None or not (principal.is_admin or record.user_uuid == principal.user_uuid):
            raise NotFound(f"workflow {workflow_id} not found")
        return record

    async def detail(self, workflow_id: str, principal: Principal) -> dict[str, Any]:
        record = await self.get(workflow_id, principal)
        # Its children, what it re-runs (migration 0028) and its steps' agent teams (0031,
        # issue 33) in one round trip.
        row = await self._pool.fetchrow(
            "SELECT array(SELECT id FROM workflows WHERE parent_id = $1 ORDER BY number)"
            " AS children, (SELECT rerun_of FROM workflows WHERE id = $1) AS rerun_of,"
            " array(SELECT ARRAY[step, id] FROM teams WHERE workflow_id = $1) AS teams",
            workflow_id,
        )
        steps = [_step_wire(s, record.spec) for s in record.steps]
        for step_name, team_id in row["teams"] or ():
            index = record.spec.step_index.get(step_name)
            if index is not None:
                steps[index]["team_id"] = team_id
        if record.waiting_for is not None:
            # The running step waits for a person (issue 32): which decision, shown on it.
            held = await self._pool.fetchrow(
                "SELECT id, kind, status, tool, step FROM interventions WHERE id = $1",
                record.waiting_for,
            )
            index = record.spec.step_index.get(held["step"]) if held is not None else None
            if held is not None and index is not None:
                shown = {k: held[k] for k in ("id", "kind", "status", "tool") if held[k]}
                steps[index]["intervention"] = shown
        return {
            "id": record.id,
            "name": record.name,
            "status": str(record.status),
            "steps": steps,
            "parent_id": record.parent_id,
            "children": list(row["children"]),
            "rerun_of": row["rerun_of"],
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
        incarnation's; not those parked waiting for a person (`waiting_for`: the decision
        starts them). This shard's own (`number % shards`) first; within each, round-robin
        by user (each user's oldest, then each one's second oldest, ...): after a restart,
        another user's workflow does not wait behind every older one of a user's backlog."""
        rows = await self._pool.fetch(
            "SELECT id FROM (SELECT id, number, number % $1 = $2 AS own, row_number() OVER"
            " (PARTITION BY number % $1 = $2, user_uuid ORDER BY number) AS turn"
            " FROM workflows w WHERE status IN ('pending', 'running')"
            " AND w.waiting_for IS NULL AND "
            + ClaimStore.unclaimed_sql(CLAIM_KIND, "w.id", "$4")
            + ") t ORDER BY own DESC, turn, number LIMIT $3",
            max(1, shards),
            shard_index,
            limit,
            owner,
        )
        return [r["id"] for r in rows]
