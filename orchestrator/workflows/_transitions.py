"""A workflow's transitions: each one transaction that checks the state machine tables
(_states.py), updates the workflow's and its steps' rows and appends the events that say
so (the outbox rule), under the driver's fence when one is given (a driver whose claim was
taken over writes nothing: StaleClaim). The end of a workflow and a cancel are also told
to drivers, by `NOTIFY orch_workflows` in the same transaction. Mixed into
`WorkflowStore` (_store.py), whose pool and event store it uses."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import asyncpg

from orchestrator.db import DB_NOW_MS
from orchestrator.errors import NotFound
from orchestrator.events import EventStore, EventTransaction, NewEvent
from orchestrator.runtime.claims import Fence
from orchestrator.teams._ending import close_open_in
from orchestrator.workflows._records import (
    _SELECT,
    WorkflowRecord,
    _record,
    load_record,
    now_ms,
)
from orchestrator.workflows._states import StepState, WorkflowState, check_transition

if TYPE_CHECKING:
    from orchestrator.interventions import Intervention, InterventionStore

# Creates a step attempt's intervention in the transaction that starts the attempt (its key).
Asker = Callable[[EventTransaction, str], Awaitable["Intervention"]]

# Drivers hear of a workflow's end (`done:<id>`: a parent waiting for its children, a
# cancel waiting for compensation) and of a cancel (`cancel:<id>`: its driver stops the
# running step) on this channel, sent by the transaction that commits the change.
NOTIFY_CHANNEL = "orch_workflows"
# Now, in Unix ms, by the database's clock (a step's retry_at).
# The error of an attempt that never answered.
LOST = "lost: no answer came (its worker or the workflow's driver stopped); not sent again"


class WorkflowTransitions:
    _pool: asyncpg.Pool
    _events: EventStore

    _intervention_store: InterventionStore | None = None

    def _interventions_of(self) -> InterventionStore:
        """The interventions this store's transitions settle (closing pending ones when a
        workflow ends): only their `*_in(tx, ...)` writes, which need no timeout setting."""
        if self._intervention_store is None:
            from orchestrator.interventions import InterventionStore

            self._intervention_store = InterventionStore(self._pool, self._events)
        return self._intervention_store

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
        record = await load_record(tx.conn, workflow_id, for_update=True)
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
        loaded = await load_record(self._pool, workflow_id)
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
        now = now_ms()
        columns: dict[str, Any] = {
            "status": StepState.RUNNING,
            "attempt": attempt,
            "idempotency_key": key,
            "started_at": now,
            "finished_at": None,
            "error": None,
        }
        # Running without a retry due: its attempt never answered (its worker died, or the
        # driver that sent it stopped). Kept as lost; it is never sent again.
        lost = step.status == StepState.RUNNING and step.retry_at is None and step.attempt > 0
        if lost:
            entry = {
                "attempt": step.attempt,
                "started_at": step.started_at,
                "ended_at": now,
                "error": LOST,
                "lost": True,
            }
            columns["attempts"] = json.dumps([*step.attempts, entry])
        elif step.status != StepState.RUNNING and step.attempts:
            columns["attempts"] = "[]"  # a run afresh (a branch jumped back to it)
        if step.retry_at is not None:
            columns["retry_at"] = None
        await self._set_both(
            tx, record, idx, columns, {"cursor": idx, "executed": record.executed + 1}
        )
        events = [
            self._event(
                record,
                "workflow.step_started",
                step=step.name,
                attempt=attempt,
                lost_attempt=step.attempt if lost else None,
            ),
            *(with_events(key) if with_events is not None else ()),
        ]
        return attempt, key, events

    async def start_and_ask(
        self, workflow_id: str, idx: int, ask: Asker, fence: Fence | None = None
    ) -> str:
        """An approval step's start (issue 32): its new attempt, the intervention `ask`
        creates for it (after the step row is running, as `create_in` requires) and the
        workflow parked on it (`waiting_for`), in one transaction; the intervention's id."""
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            _, key, events = await self._start_in(tx, record, idx, None)
            await tx.append(events)
            iv = await ask(tx, key)
            await tx.conn.execute(
                "UPDATE workflows SET waiting_for = $2 WHERE id = $1", workflow_id, iv.id
            )
        return iv.id

    async def park(self, workflow_id: str, intervention_id: str, fence: Fence | None) -> bool:
        """The workflow waits for intervention `intervention_id` (issue 32): nobody drives it
        until that is decided. False, and nothing written, when it was decided meanwhile
        (the decision locks the workflow row first too, so one of the two sees the other)."""
        async with self._events.transaction() as tx:
            await self._tx_load(tx, workflow_id, fence)
            parked = await tx.conn.fetchval(
                "UPDATE workflows SET waiting_for = $2 WHERE id = $1 AND EXISTS (SELECT 1"
                " FROM interventions WHERE id = $2 AND status = 'pending') RETURNING 1",
                workflow_id,
                intervention_id,
            )
        return parked is not None

    async def ms_until(self, due_ms: int) -> int:
        """Milliseconds from now to `due_ms`, both by the database's clock (a step's
        `retry_at`): drivers on hosts with skewed clocks wait alike."""
        left: int = await self._pool.fetchval(f"SELECT $1::bigint - {DB_NOW_MS}", due_ms)
        return left

    async def fail_attempt(
        self,
        workflow_id: str,
        idx: int,
        key: str,
        *,
        error: str,
        duration_ms: int,
        fence: Fence | None = None,
    ) -> str | None:
        """The task step's running attempt `key` failed. With attempts left under its
        `retry` policy (_retry.py): the failure is recorded once (workflow_step_results),
        kept in the step's `attempts`, and the step, still running, waits for its next
        attempt, due after the policy's backoff (`retry_at`, by the database's clock: a
        restarted driver resumes the wait), with workflow.step_retrying. Otherwise the step
        fails, as `finish_step` records it. "retrying" or "failed"; None when nothing was
        recorded (not the step's current attempt, or its outcome recorded already)."""
        async with self._events.transaction() as tx:
            record = await self._tx_load(tx, workflow_id, fence)
            step = record.steps[idx]
            policy = record.spec.steps[idx].retry
            failures = step.failures + 1
            if failures >= policy.max_attempts:
                events = await self._finish_in(
                    tx, record, idx, key, False, None, error, duration_ms, idx + 1, (), None
                )
                if events is None:
                    return None
                await tx.append(events)
                return "failed"
            if step.status != StepState.RUNNING or step.key != key or step.retry_at is not None:
                return None
            if not await self._record_result(tx, key, workflow_id, step.name, "failed"):
                return None
            delay = policy.delay_ms(failures)
            entry = {
                "attempt": step.attempt,
                "started_at": step.started_at,
                "ended_at": now_ms(),
                "error": error,
            }
            due = await tx.conn.fetchval(
                f"UPDATE workflow_steps SET retry_at = {DB_NOW_MS} + $3, error = $4,"
                " attempts = attempts || jsonb_build_array($5::jsonb)"
                " WHERE workflow_id = $1 AND idx = $2 RETURNING retry_at",
                workflow_id,
                idx,
                delay,
                error,
                json.dumps(entry),
            )
            await self._set_workflow(tx, record)
            await tx.append(
                [
                    self._event(
                        record,
                        "workflow.step_retrying",
                        step=step.name,
                        attempt=step.attempt,
                        error=error,
                        next_attempt=step.attempt + 1,
                        max_attempts=policy.max_attempts,
                        delay_ms=delay,
                        retry_at=due,
                    )
                ]
            )
        return "retrying"

    @staticmethod
    async def _record_result(
        tx: EventTransaction, key: str, workflow_id: str, step: str, status: str
    ) -> bool:
        """The attempt's outcome, once per key: False when it was recorded already."""
        inserted = await tx.conn.fetchval(
            "INSERT INTO workflow_step_results (idempotency_key, workflow_id, step, status,"
            " recorded_at) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1",
            key,
            workflow_id,
            step,
            status,
            now_ms(),
        )
        return inserted is not None

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
                fresh = await load_record(tx.conn, workflow_id)
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
            if not await self._record_result(tx, key, workflow_id, step.name, "failed"):
                return None
            await self._set_step(tx, record, idx, **outcome)
            # Its last attempt failed: its team ends with it (a lost coordinator's included).
            await close_open_in(tx, workflow_id, "step failed", step.name)
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
                # A person's pending decision is moot now: closed (via `cancel`), and the
                # workflow no longer waits for it.
                await self._interventions_of().close_pending_in(tx, workflow_id, reason)
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
        return await load_record(self._pool, workflow_id)

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
            # Teams left open (a coordinator whose worker was lost) end with the workflow.
            await close_open_in(tx, workflow_id, f"workflow {status}")
            # A question left open by an attempt that ended without it (one an override
            # abandoned while its worker was asking) is moot once the workflow has ended.
            await self._interventions_of().close_pending_in(tx, workflow_id, "the workflow ended")
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
