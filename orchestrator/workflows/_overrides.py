"""Overrides and re-runs of a workflow (issue 32): a person (the workflow's owner or an
admin) acts on a stuck or failed workflow: `retry` a step, `skip` it, `resume` the
workflow, or `rerun` it from a step as a new workflow.

Why here and not in the driver: an override comes from the API, from any replica, while a
driver (in some shard, maybe a zombie) may be driving the workflow. So each action is one
transaction that

- locks the workflow's row (FOR UPDATE, as every driver transition does: the two are
  serialised, and the action sees the state the driver last committed);
- checks that the action applies to that state (else a 409 with the workflow's `status`,
  and the step's `step_status`), and writes the new state of the workflow and its steps;
- revokes the workflow's claim when a driver may hold it (a running workflow): the driver's
  next transition fails its fence (StaleClaim) and writes nothing, its renewer stops it,
  and `NOTIFY orch_workflows 'override:<id>:<epoch>'` makes the engine holding that claim
  (epoch) stop it at once and drive the workflow again (_engine.py); an engine that drives
  it under a newer claim ignores the notice. A running attempt's key is recorded as
  `abandoned` in workflow_step_results: its late answer is never recorded (the attempt is
  not sent again either);
- appends `audit.workflow_override` (aggregate: the workflow) with the action, the step and
  who acted (`user_uuid`), in the same commit.

The caller then starts the workflow on its shard (`WorkflowRunner.start`); the shards'
sweep takes it up anyway, since nobody holds its claim.

Decisions (docs/design-notes.md, "Workflow overrides and re-run (issue 32)"):

- On a failed workflow only the step it stopped at (its failed step, or the step at its
  cursor when it failed otherwise) can be retried or skipped; earlier steps are re-run with
  `rerun`. Its later steps, skipped when it failed, are pending again.
- A retried failed step starts a new run of the step: its `retry` policy counts its
  attempts afresh, its attempt numbers (and so its task ids) go on from the last one, never
  reused. A retried running step keeps its run: the abandoned attempt is listed as `lost`
  (not counted against max_attempts) and the next attempt starts at once.
- Compensation that ran when the workflow failed is not undone and does not run again for
  the same results (`compensated` stays set, also on a re-run's copied steps).
- A skipped step's `{{step.result}}` is "" and its `{{step.status}}` is `skipped`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from orchestrator.auth import Principal
from orchestrator.config import Settings
from orchestrator.db import DB_NOW_MS
from orchestrator.errors import Conflict, NotFound
from orchestrator.events import EventTransaction, NewEvent
from orchestrator.runtime.claims import ClaimStore
from orchestrator.workflows._invalid import _bad
from orchestrator.workflows._records import WorkflowRecord, load_record, now_ms
from orchestrator.workflows._resolve import tree_size
from orchestrator.workflows._states import StepState, WorkflowState
from orchestrator.workflows._store import CLAIM_KIND, NOTIFY_CHANNEL, WorkflowStore

__all__ = ["OVERRIDE_TRANSITIONS", "Override", "WorkflowOverrides"]

Action = Literal["retry", "skip", "resume", "rerun"]
W, S = WorkflowState, StepState

# What an override may do beyond the engine's own tables (_states.py), which keep `failed`
# final for drivers: only a person's action brings a failed workflow back.
OVERRIDE_TRANSITIONS: dict[str, frozenset[tuple[str, str]]] = {
    "workflow": frozenset({(W.FAILED, W.RUNNING), (W.RUNNING, W.RUNNING)}),
    "step": frozenset(
        {
            (S.FAILED, S.PENDING),  # retried, resumed
            (S.SKIPPED, S.PENDING),  # stopped at (failed otherwise), or after the stop
            (S.FAILED, S.SKIPPED),  # skipped
            (S.SKIPPED, S.SKIPPED),
            (S.RUNNING, S.RUNNING),  # a new attempt replaces the running one
            (S.RUNNING, S.SKIPPED),
        }
    ),
}
# Why an abandoned attempt's answer never counts (kept in the step's attempts, `lost`).
ABANDONED = "abandoned by an override ({action}): not sent again, its answer is ignored"


@dataclass(frozen=True, slots=True)
class Override:
    """What an action did: the workflow acted on, its status now, and the step."""

    workflow_id: str
    status: str
    action: Action
    step: str | None
    rerun_id: str | None = None


def _check(kind: str, current: str, target: str, what: str, record: WorkflowRecord) -> None:
    """A 409 (with the workflow's status, and the step's for a step) unless the override
    may move `what` from `current` to `target`."""
    if (current, target) not in OVERRIDE_TRANSITIONS[kind]:
        extra = {"status": str(record.status)}
        if kind == "step":
            extra["step_status"] = str(current)
        raise Conflict(f"{what} cannot go from {current} to {target} by an override", extra=extra)


class WorkflowOverrides:
    """The four actions, over the workflow store's pool and event store."""

    def __init__(self, store: WorkflowStore, settings: Settings) -> None:
        self._store = store
        self._settings = settings

    # --- the actions ------------------------------------------------------------------------

    async def retry(
        self, workflow_id: str, step: str, principal: Principal, *, reason: str | None = None
    ) -> Override:
        """A new attempt of `step`: the failed step of a failed workflow (which runs again
        from it), or the running step of a running one (its attempt abandoned)."""
        return await self._act(workflow_id, principal, "retry", step, reason)

    async def skip(
        self, workflow_id: str, step: str, principal: Principal, *, reason: str | None = None
    ) -> Override:
        """`step` becomes skipped and the next one starts: the failed step of a failed
        workflow, or the running step of a running one."""
        return await self._act(workflow_id, principal, "skip", step, reason)

    async def resume(
        self, workflow_id: str, principal: Principal, *, reason: str | None = None
    ) -> Override:
        """A failed workflow, or a stuck running one, goes on from where it stopped: that
        step gets a new attempt."""
        return await self._act(workflow_id, principal, "resume", None, reason)

    async def rerun(
        self,
        workflow_id: str,
        from_step: str,
        principal: Principal,
        *,
        reason: str | None = None,
    ) -> Override:
        """A new workflow, same spec and owner, whose steps before `from_step` hold the
        original's results (not run again); the original is finished."""
        async with self._transaction() as tx:
            record = await self._locked(tx, workflow_id, principal)
            idx = record.spec.step_index.get(from_step)
            if idx is None:
                raise _bad("from_step", f"workflow {workflow_id} has no step {from_step!r}")
            if not record.finished:
                raise Conflict(
                    f"workflow {workflow_id} is {record.status}: only a completed, failed or"
                    " cancelled workflow can be re-run",
                    extra={"status": str(record.status)},
                )
            for kept in record.steps[:idx]:
                if kept.status not in (S.COMPLETED, S.SKIPPED):
                    raise Conflict(
                        f"step {kept.name} of {workflow_id} is {kept.status}, so it has no"
                        f" result to keep: re-run from {kept.name} or an earlier step",
                        extra={"status": str(record.status), "step_status": str(kept.status)},
                    )
            # The new workflow is live: within its owner's ceiling, like a creation.
            await self._store.check_live_room(
                tx.conn,
                record.user_uuid,
                tree_size(record.spec),
                self._settings.workflow_max_live_per_user,
            )
            new_id = await self._store.create(record.spec, record.user_uuid, conn=tx.conn)
            await tx.conn.execute(
                "WITH s AS (UPDATE workflow_steps n SET status = o.status, result = o.result,"
                " compensated = o.compensated FROM workflow_steps o"
                " WHERE n.workflow_id = $1 AND o.workflow_id = $2 AND o.idx = n.idx"
                " AND n.idx < $3 RETURNING 1)"
                " UPDATE workflows SET rerun_of = $2, cursor = $3 WHERE id = $1",
                new_id,
                workflow_id,
                idx,
            )
            audit = self._audit(
                record, principal, "rerun", from_step, rerun_id=new_id, reason=reason
            )
            await tx.append([audit])
        return Override(workflow_id, str(record.status), "rerun", from_step, new_id)

    # --- retry, skip, resume ----------------------------------------------------------------

    async def _act(
        self,
        workflow_id: str,
        principal: Principal,
        action: Action,
        name: str | None,
        reason: str | None,
    ) -> Override:
        async with self._transaction() as tx:
            record = await self._locked(tx, workflow_id, principal)
            idx = None
            if name is not None:
                idx = record.spec.step_index.get(name)
                if idx is None:
                    raise NotFound(f"workflow {workflow_id} has no step {name!r}")
            if record.status == W.FAILED:
                step = await self._on_failed(tx, record, action, idx)
            elif record.status == W.RUNNING and record.ending is None:
                step = await self._on_running(tx, record, action, idx)
            else:
                doing = "compensating" if record.status == W.RUNNING else str(record.status)
                raise Conflict(
                    f"workflow {workflow_id} is {doing}: {action} applies to a failed or a"
                    " running workflow"
                    + (" (a cancelled one cannot be resumed)" if doing == "cancelled" else ""),
                    extra={"status": str(record.status)},
                )
            await tx.append([self._audit(record, principal, action, step, reason=reason)])
        return Override(workflow_id, str(W.RUNNING), action, step)

    async def _on_failed(
        self, tx: EventTransaction, record: WorkflowRecord, action: Action, idx: int | None
    ) -> str:
        """Back to running from the step it stopped at: that step pending again (retry,
        resume) or skipped (skip); the steps after it, skipped when it failed, pending."""
        stop = next((s.idx for s in record.steps if s.status == S.FAILED), record.cursor)
        if stop >= len(record.steps):
            stop = len(record.steps) - 1
        if idx is None:
            idx = stop
        elif idx != stop:
            step = record.steps[idx]
            raise Conflict(
                f"step {step.name} is {step.status}: workflow {record.id} failed at step"
                f" {record.steps[stop].name}, the only one that can be retried or skipped"
                " (re-run the workflow from an earlier step: POST /workflows/{id}/rerun)",
                extra={"status": str(record.status), "step_status": str(step.status)},
            )
        step = record.steps[idx]
        target = S.SKIPPED if action == "skip" else S.PENDING
        _check("step", step.status, target, f"step {step.name}", record)
        _check("workflow", record.status, W.RUNNING, record.id, record)
        # Nobody drives a failed workflow, but the user's ceiling counts it live again.
        await self._store.check_live_room(
            tx.conn, record.user_uuid, 1, self._settings.workflow_max_live_per_user
        )
        await tx.conn.execute(
            "UPDATE workflow_steps SET status = $3, retry_at = NULL,"
            " error = CASE WHEN $3 = 'skipped' THEN error END"
            " WHERE workflow_id = $1 AND idx = $2",
            record.id,
            idx,
            str(target),
        )
        await tx.conn.execute(
            "UPDATE workflow_steps SET status = 'pending', error = NULL, retry_at = NULL"
            " WHERE workflow_id = $1 AND idx > $2 AND status = 'skipped'",
            record.id,
            idx,
        )
        await self._set_running(tx, record, idx + 1 if action == "skip" else idx)
        await self._revoke(tx, record.id)
        return step.name

    async def _on_running(
        self, tx: EventTransaction, record: WorkflowRecord, action: Action, idx: int | None
    ) -> str:
        """The step at the cursor: its attempt in flight (or its wait for the next one)
        abandoned, then a new attempt at once (retry, resume) or skipped (skip)."""
        current = min(record.cursor, len(record.steps) - 1)
        step = record.steps[current if idx is None else idx]
        spec = record.spec.steps[step.idx]
        if action == "resume" and step.idx == current and step.status == S.PENDING:
            # About to start: only stuck when nobody drives it.
            if await self._driven(tx.conn, record.id):
                raise Conflict(
                    f"workflow {record.id} is running (step {step.name} is about to start):"
                    " nothing to resume",
                    extra={"status": str(record.status), "step_status": str(step.status)},
                )
            await self._set_running(tx, record, current)
            await self._revoke(tx, record.id)
            return step.name
        if step.idx != current or step.status != S.RUNNING:
            raise Conflict(
                f"step {step.name} is {step.status}: on a running workflow only its running"
                f" step ({record.steps[current].name}, {record.steps[current].status}) can"
                f" be {'retried' if action != 'skip' else 'skipped'}",
                extra={"status": str(record.status), "step_status": str(step.status)},
            )
        if spec.type == "approval" and action != "skip":
            raise Conflict(
                f"step {step.name} is an approval step: a person decides it (approve or reject"
                f" its intervention{' ' + record.waiting_for if record.waiting_for else ''}),"
                " or skip it",
                extra={"status": str(record.status), "step_status": str(step.status)},
            )
        if record.waiting_for is not None and action == "resume":
            raise Conflict(
                f"workflow {record.id} waits for a decision on intervention"
                f" {record.waiting_for}: approve or reject it (or retry or skip step"
                f" {step.name})",
                extra={"status": str(record.status), "intervention_id": record.waiting_for},
            )
        # Any question of the attempt is moot (parked, or asked by a worker that has not
        # answered yet): closed (rejected via `cancel`), the workflow no longer waits, and
        # the attempt is abandoned below like any attempt in flight.
        await self._store._interventions_of().close_pending_in(
            tx, record.id, f"overridden: step {step.name} {action}"
        )
        if spec.type == "branch" or (spec.type == "spawn" and action != "resume"):
            raise Conflict(
                f"step {step.name} is a running {spec.type} step: act on its child workflows"
                " (or cancel the workflow); a spawn step's wait goes on with resume",
                extra={"status": str(record.status), "step_status": str(step.status)},
            )
        if spec.type in ("task", "approval"):  # a spawn's new driver lists its wait as lost
            await self._abandon(tx, record, step.idx, action)
        if action == "skip":
            _check("step", step.status, S.SKIPPED, f"step {step.name}", record)
            await tx.conn.execute(
                "UPDATE workflow_steps SET status = 'skipped', retry_at = NULL, finished_at = $3"
                " WHERE workflow_id = $1 AND idx = $2",
                record.id,
                step.idx,
                now_ms(),
            )
            await self._set_running(tx, record, step.idx + 1)
        elif spec.type == "task":
            # Due now: the driver (this one, restarted) starts the next attempt at once.
            _check("step", step.status, S.RUNNING, f"step {step.name}", record)
            await tx.conn.execute(
                f"UPDATE workflow_steps SET retry_at = {DB_NOW_MS}"
                " WHERE workflow_id = $1 AND idx = $2",
                record.id,
                step.idx,
            )
            await self._set_running(tx, record, step.idx)
        else:
            await self._set_running(tx, record, step.idx)  # a spawn's wait, by a new driver
        await self._revoke(tx, record.id)
        return step.name

    # --- the writes -------------------------------------------------------------------------

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[EventTransaction]:
        """The action's transaction. It locks the workflow's row, then its claim's (to
        delete it), the order of a driver's fenced read; should Postgres still find a
        deadlock with a driver (and abort this side), the caller is told to try again."""
        try:
            async with self._store.events.transaction() as tx:
                yield tx
        except asyncpg.DeadlockDetectedError:
            raise Conflict("the workflow changed while this was applied: try again") from None

    async def _locked(
        self, tx: EventTransaction, workflow_id: str, principal: Principal
    ) -> WorkflowRecord:
        """The workflow, locked, if the caller may act on it (its owner, an admin): the
        same 404 as a read otherwise."""
        record = await load_record(tx.conn, workflow_id, for_update=True)
        if record is None or not (principal.is_admin or record.user_uuid == principal.user_uuid):
            raise NotFound(f"workflow {workflow_id} not found")
        return record

    @staticmethod
    async def _set_running(tx: EventTransaction, record: WorkflowRecord, cursor: int) -> None:
        await tx.conn.execute(
            "UPDATE workflows SET status = 'running', ending = NULL, error = NULL, cursor = $2,"
            " updated_at = $3 WHERE id = $1",
            record.id,
            cursor,
            now_ms(),
        )

    @staticmethod
    async def _abandon(
        tx: EventTransaction, record: WorkflowRecord, idx: int, action: Action
    ) -> None:
        """The step's attempt in flight (if any) never counts: its key's outcome is taken
        (`abandoned`, so a late answer is refused), and it is listed as lost (not counted
        against max_attempts). A step waiting for its next attempt has none in flight."""
        step = record.steps[idx]
        if step.key is None or step.waiting:
            return
        await WorkflowStore._record_result(tx, step.key, record.id, step.name, "abandoned")
        entry = {
            "attempt": step.attempt,
            "started_at": step.started_at,
            "ended_at": now_ms(),
            "error": ABANDONED.format(action=action),
            "lost": True,
        }
        await tx.conn.execute(
            "UPDATE workflow_steps SET attempts = attempts || jsonb_build_array($3::jsonb),"
            " error = $4 WHERE workflow_id = $1 AND idx = $2",
            record.id,
            idx,
            json.dumps(entry),
            entry["error"],
        )

    @staticmethod
    async def _driven(conn: asyncpg.Connection, workflow_id: str) -> bool:
        """A live claim on the workflow: a driver holds it."""
        unclaimed = await conn.fetchval(
            "SELECT " + ClaimStore.unclaimed_sql(CLAIM_KIND, "$1"), workflow_id
        )
        return not unclaimed

    @staticmethod
    async def _revoke(tx: EventTransaction, workflow_id: str) -> None:
        """Take the claim from whoever drives the workflow (its fence fails from now on)
        and tell its engine to stop that driver and drive the workflow again."""
        epoch = await ClaimStore.revoke_in(tx.conn, CLAIM_KIND, workflow_id)
        if epoch is not None:
            await tx.conn.execute(
                "SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, f"override:{workflow_id}:{epoch}"
            )

    @staticmethod
    def _audit(
        record: WorkflowRecord, principal: Principal, action: Action, step: str | None, **more: Any
    ) -> NewEvent:
        """Owned by the workflow's owner (they see who acted on it), `user_uuid`: who did."""
        data: dict[str, Any] = {
            "workflow_id": record.id,
            "action": action,
            "step": step,
            "user_uuid": principal.user_uuid,
            "previous_status": str(record.status),
            **more,
        }
        return NewEvent(
            "audit.workflow_override",
            {k: v for k, v in data.items() if v is not None},
            record.user_uuid,
        )
