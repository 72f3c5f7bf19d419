"""Interventions in Postgres (migration 0027): created inside the transaction of whoever asks
(the agent runner parking a tool call, the driver starting an approval step), read
tenant-scoped, decided once, expired by the engines' sweep, taken once for resuming.

- **Scoping.** Visible to admins, the workflow's owner and its deciders; to anyone else an
  intervention does not exist (404). Deciding: admins and the deciders; a visible
  non-decider (an owner not among an approval step's approvers) gets a 403.
- **One decision.** `decide` locks the workflow row first (the lock order of every workflow
  transition and of parking), then `UPDATE ... WHERE status = 'pending' RETURNING`: the
  first decision wins, a second is a 409 naming the status and who decided; a platform's
  replayed interaction (the same `interaction_id`) is answered as decided, writing nothing.
- **Settling.** A decision, an expiry and a cancel each clear the workflow's `waiting_for`
  (when it waits for this one), drop the question's channel post if it was never sent or
  queue an outcome post that updates it, `NOTIFY orch_workflows 'decided:<workflow>'`, and
  write `audit.intervention_approved`/`_rejected`, all in the one transaction.
- **Time** is the database's clock (`expires_at`, `decided_at`), so every host agrees on
  expiry.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from orchestrator.auth import Principal
from orchestrator.db import DB_NOW_MS
from orchestrator.errors import Conflict, Forbidden, NotFound
from orchestrator.events import EventStore, EventTransaction, NewEvent
from orchestrator.interventions._model import (
    MAX_QUESTION,
    Decided,
    Decider,
    Intervention,
    Kind,
    Resume,
)
from orchestrator.observability import mask_secrets
from orchestrator.runtime.claims import Fence

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT_S", "AttemptSuperseded", "InterventionStore"]

DEFAULT_TIMEOUT_S = 86_400
# Drivers hear of a decision here (`decided:<workflow id>`), as of a workflow's end
# (orchestrator/workflows/_transitions.py NOTIFY_CHANNEL).
NOTIFY_CHANNEL = "orch_workflows"
# Every column but the sealed checkpoint, which only `for_resume` reads.
_COLUMNS = (
    "id, kind, status, user_uuid, deciders, workflow_id, step, task_id, seq, tool, arguments,"
    " question, notify_channel, expires_at, created_at, decided_at, decided_by, via, note,"
    " reason, interaction_id, resumed_at"
)
_RETURNING = " RETURNING " + ", ".join(f"i.{c.strip()}" for c in _COLUMNS.split(","))
# What a decision, an expiry or a cancel settles besides the row, in one statement: the
# workflow released if it waits for this one ($1 workflow, $2 intervention), an unsent
# question dropped, a sent one queued for its update, and drivers told.
_SETTLE = (
    "WITH w AS (UPDATE workflows SET waiting_for = NULL WHERE id = $1 AND waiting_for = $2"
    " RETURNING 1),"
    " dropped AS (UPDATE intervention_posts SET state = 'dropped'"
    " WHERE intervention_id = $2 AND kind = 'ask' AND state = 'pending' RETURNING 1),"
    " outcome AS (INSERT INTO intervention_posts (intervention_id, kind, channel_id,"
    f" next_attempt_at) SELECT intervention_id, 'outcome', channel_id, {DB_NOW_MS}"
    " FROM intervention_posts WHERE intervention_id = $2 AND kind = 'ask' AND state = 'sent'"
    " ON CONFLICT DO NOTHING RETURNING 1)"
    f" SELECT EXISTS (SELECT 1 FROM w), pg_notify('{NOTIFY_CHANNEL}', 'decided:' || $1)"
)


class AttemptSuperseded(Conflict):
    """The step attempt an intervention would wait in is no longer running (a newer attempt,
    a cancel): nothing was created."""


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _intervention(row: asyncpg.Record) -> Intervention:
    return Intervention(
        id=row["id"],
        kind=row["kind"],
        status=row["status"],
        user_uuid=row["user_uuid"],
        deciders=tuple(row["deciders"]),
        workflow_id=row["workflow_id"],
        step=row["step"],
        task_id=row["task_id"],
        seq=row["seq"],
        question=row["question"],
        expires_at=row["expires_at"],
        created_at=row["created_at"],
        tool=row["tool"],
        arguments=_json(row["arguments"]),
        notify_channel=row["notify_channel"],
        decided_at=row["decided_at"],
        decided_by=_json(row["decided_by"]),
        via=row["via"],
        note=row["note"],
        reason=row["reason"],
        interaction_id=row["interaction_id"],
        resumed_at=row["resumed_at"],
    )


def _base(iv: Intervention) -> dict[str, Any]:
    """The fields every intervention event carries."""
    return {
        "task_id": iv.task_id,
        "intervention_id": iv.id,
        "kind": iv.kind,
        "workflow_id": iv.workflow_id,
        "step": iv.step,
        "tool": iv.tool,
        "user_uuid": iv.user_uuid,
    }


def _outcome_event(iv: Intervention) -> NewEvent:
    data = {**_base(iv), "decided_by": iv.decided_by_label, "via": iv.via}
    if iv.status == "approved":
        return NewEvent("audit.intervention_approved", {**data, "note": iv.note}, iv.user_uuid)
    return NewEvent("audit.intervention_rejected", {**data, "reason": iv.reason}, iv.user_uuid)


class InterventionStore:
    """Interventions over one pool and event store. `default_timeout_s`: how long one waits
    for a decision when its creator gives no timeout (settings.intervention_timeout_s)."""

    def __init__(
        self, pool: asyncpg.Pool, events: EventStore, *, default_timeout_s: int = DEFAULT_TIMEOUT_S
    ) -> None:
        self._pool = pool
        self._events = events
        self.default_timeout_s = default_timeout_s

    # --- creating ----------------------------------------------------------------------------

    async def create_in(
        self,
        tx: EventTransaction,
        *,
        task_id: str,
        workflow_id: str,
        step: str,
        user_uuid: str,
        kind: Kind,
        question: str,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        deciders: Sequence[str] | None = None,
        notify_channel: str | None = None,
        timeout_s: float | None = None,
        checkpoint: bytes | None = None,
        approvers: dict[str, Any] | None = None,
    ) -> Intervention:
        """A pending intervention of step attempt `task_id` (its key), in `tx`, with its
        `audit.intervention_pending` event and, with `notify_channel`, the question's post.
        Only while that attempt is running (`workflow_steps.idempotency_key = task_id`,
        locked FOR SHARE until `tx` ends): else AttemptSuperseded and nothing is created.
        `deciders`: who decides besides admins (default: the owner); `arguments` are masked
        here; `checkpoint`: the sealed conversation (never shown); `approvers`: the channel's
        platform approvers, for the event only (default: read from the channel).

        A `notify_channel` deleted since the workflow named it is dropped: the question is
        still asked (API, console), only not posted; failing here would fail the step."""
        masked = mask_secrets(arguments) if arguments is not None else None
        if notify_channel is not None:
            channel = await tx.conn.fetchrow(
                "SELECT type, config->'approvers' AS ids FROM channels WHERE id = $1",
                notify_channel,
            )
            if channel is None:
                log.warning(
                    "workflow %s step %s: notify channel %s is gone; the question is not posted",
                    workflow_id,
                    step,
                    notify_channel,
                )
                notify_channel = None
            elif approvers is None:
                ids = json.loads(channel["ids"]) if channel["ids"] else []
                approvers = {"channel_id": notify_channel, "platform": channel["type"], "ids": ids}
        timeout_ms = int((self.default_timeout_s if timeout_s is None else timeout_s) * 1000)
        row = await tx.conn.fetchrow(
            # The attempt still runs: not superseded, not waiting for its next attempt, and
            # no outcome taken for its key (an override abandons it by recording one).
            "WITH attempt AS (SELECT 1 FROM workflow_steps WHERE workflow_id = $2"
            " AND idempotency_key = $1 AND status = 'running' AND retry_at IS NULL"
            " AND NOT EXISTS (SELECT 1 FROM workflow_step_results r"
            " WHERE r.idempotency_key = $1) FOR SHARE),"
            " n AS (SELECT nextval('intervention_seq') AS number)"
            " INSERT INTO interventions AS i (id, number, kind, user_uuid, deciders,"
            " workflow_id, step, task_id, seq, tool, arguments, question, checkpoint,"
            " notify_channel, expires_at, created_at)"
            " SELECT 'iv-' || n.number, n.number, $3, $4, $5, $2, $6, $1,"
            " COALESCE((SELECT max(seq) FROM interventions WHERE task_id = $1), 0) + 1,"
            f" $7, $8::jsonb, $9, $10, $11, {DB_NOW_MS} + $12, {DB_NOW_MS}"
            " FROM n WHERE EXISTS (SELECT 1 FROM attempt)" + _RETURNING,
            task_id,
            workflow_id,
            kind,
            user_uuid,
            list(deciders) if deciders else [user_uuid],
            step,
            tool,
            None if masked is None else json.dumps(masked),
            question[:MAX_QUESTION],
            checkpoint,
            notify_channel,
            timeout_ms,
        )
        if row is None:
            raise AttemptSuperseded(
                f"step attempt {task_id} of {workflow_id} is not running: attempt superseded"
            )
        iv = _intervention(row)
        if notify_channel is not None:
            await tx.conn.execute(
                "INSERT INTO intervention_posts (intervention_id, kind, channel_id,"
                f" next_attempt_at) VALUES ($1, 'ask', $2, {DB_NOW_MS})",
                iv.id,
                notify_channel,
            )
        data = {
            **_base(iv),
            "arguments": iv.arguments,
            "question": iv.question,
            "deciders": list(iv.deciders),
            "approvers": approvers,
            "expires_at": iv.expires_at,
        }
        await tx.append([NewEvent("audit.intervention_pending", data, user_uuid)])
        return iv

    # --- reading (tenant-scoped) -------------------------------------------------------------

    async def get(self, intervention_id: str, principal: Principal) -> Intervention:
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM interventions WHERE id = $1", intervention_id
        )
        if row is None or not (iv := _intervention(row)).visible_to(principal):
            raise NotFound(f"intervention {intervention_id} not found")
        return iv

    async def page(
        self,
        principal: Principal,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[Intervention], int]:
        """Newest first: the caller's (as owner or decider), every one for admins; of one
        workflow with `workflow_id`."""
        where = (
            "($2 OR user_uuid = $1 OR deciders @> ARRAY[$1]::text[])"
            " AND ($3::text IS NULL OR status = $3)"
            " AND ($4::text IS NULL OR workflow_id = $4)"
        )
        args = (principal.user_uuid, principal.is_admin, status, workflow_id)
        total = await self._pool.fetchval(
            f"SELECT count(*) FROM interventions WHERE {where}", *args
        )
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM interventions WHERE {where}"
            f" ORDER BY number DESC LIMIT {int(limit)} OFFSET {int(offset)}",
            *args,
        )
        return [_intervention(r) for r in rows], int(total)

    # --- deciding ----------------------------------------------------------------------------

    async def decide(
        self,
        intervention_id: str,
        decider: Decider,
        *,
        approve: bool,
        note: str | None = None,
        reason: str | None = None,
        interaction_id: str | None = None,
    ) -> Decided:
        """Approve or reject a pending intervention, once. NotFound when the decider may not
        see it (an API caller) or it does not exist; Forbidden for a visible non-decider or
        a press in another channel than its own; Conflict (409, `status`, `decided_by`) once
        decided or expired, unless `interaction_id` is the one that decided it (a replay:
        `Decided.replayed`, nothing written)."""
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM interventions WHERE id = $1", intervention_id
        )
        if row is None:
            raise NotFound(f"intervention {intervention_id} not found")
        current = _intervention(row)
        self._check_decider(current, decider)
        if not current.pending:
            return self._already(current, interaction_id)
        decided: Decided | None = None
        async with self._events.transaction() as tx:
            await tx.conn.execute(
                "SELECT 1 FROM workflows WHERE id = $1 FOR UPDATE", current.workflow_id
            )
            row = await tx.conn.fetchrow(
                f"UPDATE interventions AS i SET status = $2, decided_at = {DB_NOW_MS},"
                " decided_by = $3::jsonb, via = $4, note = $5, reason = $6, interaction_id = $7"
                " WHERE id = $1 AND status = 'pending'" + _RETURNING,
                intervention_id,
                "approved" if approve else "rejected",
                json.dumps(decider.record()),
                decider.via,
                note if approve else None,
                None if approve else reason,
                interaction_id,
            )
            if row is not None:
                iv = _intervention(row)
                decided = Decided(iv, woke=await self._settle_in(tx, iv))
        if decided is None:  # decided meanwhile, by another: nothing was written here
            return self._already(await self._reread(intervention_id, current), interaction_id)
        return decided

    @staticmethod
    def _check_decider(iv: Intervention, decider: Decider) -> None:
        if decider.platform is not None:
            if iv.notify_channel is None or iv.notify_channel != decider.channel_id:
                raise Forbidden(f"intervention {iv.id} is not decided in this channel")
            return
        principal = Principal(decider.user_uuid or "", is_admin=decider.is_admin)
        if not iv.visible_to(principal):
            raise NotFound(f"intervention {iv.id} not found")
        if not (decider.is_admin or decider.user_uuid in iv.deciders):
            raise Forbidden(
                f"intervention {iv.id} is decided by {', '.join(iv.deciders)} or an admin"
            )

    async def _reread(self, intervention_id: str, before: Intervention) -> Intervention:
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM interventions WHERE id = $1", intervention_id
        )
        return before if row is None else _intervention(row)

    @staticmethod
    def _already(iv: Intervention, interaction_id: str | None) -> Decided:
        if interaction_id is not None and iv.interaction_id == interaction_id:
            return Decided(iv, replayed=True)
        who = iv.decided_by_label
        raise Conflict(
            f"intervention {iv.id} is already {iv.status}" + (f" (by {who})" if who else ""),
            extra={"status": iv.status, "decided_by": who},
        )

    async def _settle_in(self, tx: EventTransaction, iv: Intervention) -> bool:
        """Everything a decision settles besides its row (see the module docstring); whether
        the workflow was waiting for it (now released: start it)."""
        row = await tx.conn.fetchrow(_SETTLE, iv.workflow_id, iv.id)
        await tx.append([_outcome_event(iv)])
        return bool(row is not None and row[0])

    # --- the service's own decisions ---------------------------------------------------------

    async def expire_due(self, limit: int = 100) -> list[str]:
        """Reject (status `expired`, reason `expired`, via `timeout`) up to `limit` pending
        interventions past `expires_at`; the ids of the workflows this released (to start).
        Safe to run in every engine at once: a workflow another transaction holds is left
        for the next round."""
        due = await self._pool.fetch(
            "SELECT id, workflow_id FROM interventions WHERE status = 'pending'"
            f" AND expires_at <= {DB_NOW_MS} ORDER BY expires_at LIMIT $1",
            limit,
        )
        if not due:
            return []
        released: list[str] = []
        async with self._events.transaction() as tx:
            locked = await tx.conn.fetch(
                "SELECT id FROM workflows WHERE id = ANY($1::text[]) ORDER BY id"
                " FOR UPDATE SKIP LOCKED",
                list({r["workflow_id"] for r in due}),
            )
            rows = await tx.conn.fetch(
                f"UPDATE interventions AS i SET status = 'expired', decided_at = {DB_NOW_MS},"
                " via = 'timeout', reason = 'expired'"
                " WHERE id = ANY($1::text[]) AND workflow_id = ANY($2::text[])"
                f" AND status = 'pending' AND expires_at <= {DB_NOW_MS}" + _RETURNING,
                [r["id"] for r in due],
                [r["id"] for r in locked],
            )
            for row in rows:
                iv = _intervention(row)
                if await self._settle_in(tx, iv):
                    released.append(iv.workflow_id)
        return list(dict.fromkeys(released))

    async def close_pending_in(
        self, tx: EventTransaction, workflow_id: str, reason: str
    ) -> list[Intervention]:
        """In the transaction that ends or cancels workflow `workflow_id` (its row locked
        there first): reject its pending interventions (via `cancel`, `reason`)."""
        rows = await tx.conn.fetch(
            f"UPDATE interventions AS i SET status = 'rejected', decided_at = {DB_NOW_MS},"
            " via = 'cancel', reason = $2 WHERE workflow_id = $1 AND status = 'pending'"
            + _RETURNING,
            workflow_id,
            reason,
        )
        closed = [_intervention(r) for r in rows]
        for iv in closed:
            await self._settle_in(tx, iv)
        return closed

    # --- resuming (the engine and the runner) ------------------------------------------------

    async def for_attempt(self, task_id: str) -> Intervention | None:
        """The newest intervention of step attempt `task_id`, unless its continuation was
        sent already (`resumed_at`): None when the attempt waits for nothing."""
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM interventions WHERE task_id = $1 ORDER BY seq DESC LIMIT 1",
            task_id,
        )
        if row is None or row["resumed_at"] is not None:
            return None
        return _intervention(row)

    async def take_resume(self, intervention_id: str, fence: Fence | None = None) -> bool:
        """Mark a decided intervention's continuation as sent, once: True for the one caller
        that may dispatch it, False when it is pending or was taken before (then the step
        starts a new attempt). With `fence`, only while its driver holds the workflow's claim
        (StaleClaim otherwise)."""
        async with self._pool.acquire() as conn, conn.transaction():
            if fence is not None:
                await fence.check(conn)
            taken = await conn.fetchval(
                f"UPDATE interventions SET resumed_at = {DB_NOW_MS} WHERE id = $1"
                " AND status <> 'pending' AND resumed_at IS NULL RETURNING 1",
                intervention_id,
            )
        return taken is not None

    async def for_resume(self, intervention_id: str, task_id: str) -> Resume:
        """The decided intervention of attempt `task_id` with its sealed checkpoint, for the
        run that continues it: only once `take_resume` took it (Conflict otherwise)."""
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS}, checkpoint FROM interventions WHERE id = $1 AND task_id = $2",
            intervention_id,
            task_id,
        )
        if row is None:
            raise NotFound(f"intervention {intervention_id} of task {task_id} not found")
        iv = _intervention(row)
        if iv.pending or iv.resumed_at is None:
            raise Conflict(
                f"intervention {intervention_id} was not taken for resuming",
                extra={"status": iv.status},
            )
        return Resume(iv, row["checkpoint"])

    # --- tests and tools ---------------------------------------------------------------------

    async def load(self, intervention_id: str) -> Intervention | None:
        """Unscoped (the engine's view)."""
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM interventions WHERE id = $1", intervention_id
        )
        return None if row is None else _intervention(row)
