"""Driving one workflow, step by step: the step kinds (task, branch, spawn), conditions,
the end of a workflow (completed, or failed/cancelled after compensation). Mixed into
`WorkflowEngine` (_engine.py), which owns what is around a driver: its claim, its task,
the listener, retries of infrastructure failures and shutdown.

- A workflow starts on creation: pending -> running (workflow.started), then its steps in
  order: a false `condition` skips a step; a task step runs as an agent task (its mode,
  tools, timeout, the workflow's or step's model, the creator's user_uuid; context: the
  original prompt (the first step's) and every earlier completed result); a branch step
  jumps; a spawn step starts child workflows and waits for them: a child's end commits
  with `NOTIFY orch_workflows 'done:<id>'`, which wakes the parent (a re-check every
  CHILD_RECHECK_S covers a notification lost while the listener reconnects). Children
  that would take their user past `workflow_max_live_per_user` fail the spawn step.
- A condition or branch that searches a regular expression is evaluated off the event
  loop, metered per workflow (`PatternRunner`, _patterns.py): past
  `workflow_pattern_budget_ms` the workflow fails.
- Each step attempt has the idempotency key `<workflow>:<step>:<attempt>` (also the task's
  id); its outcome is recorded once. After a crash, the step that was running is dispatched
  again as a new attempt (at-least-once per step, at most once per attempt); a late result
  of an older attempt is dropped.
- A task step with `retry` (_retry.py) whose attempt failed (a failed or timed-out task
  result) and has attempts left stays running: the failure is recorded with
  workflow.step_retrying and the step's `retry_at` (when the next attempt is due, stored:
  a driver resumed elsewhere waits out the rest, it neither skips the wait nor starts from
  attempt 1); the driver waits without its database slot, then starts the next attempt
  under a new key. Only the last attempt's failure fails the step. An attempt that never
  answered (its worker died: the dispatcher raises, an infrastructure failure) is kept as
  lost when the step next starts, and is not counted against `max_attempts`.
- A failed step (or a branch with no match, or the step budget spent): workflow.step_failed,
  workflow.compensating, compensation of the completed steps in reverse order (each step's
  `compensate`: a prompt run as an agent task, or `{notify}`; every compensated step gets a
  `workflow.compensating` event naming it; a failing compensation is recorded there and the
  others still run), then workflow.failed. Cancel: the running step is abandoned (skipped),
  descendants are cancelled, compensation, workflow.cancelled.
- Waiting for a person (issue 32) holds nothing: a task whose tool call needs approval
  returns `waiting`; an approval step starts by asking. The driver records the wait
  (`waiting_for`, `park`) and ends, releasing the claim; the sweep skips the workflow. The
  decision (or the sweep's expiry) clears `waiting_for` and starts it again; the driver
  then finds the attempt's decided intervention (`for_attempt`) and takes its continuation
  once (`take_resume`): a task resumes its conversation under the same attempt key; an
  approval step completes (approved) or fails (rejected, expired: compensation runs, never
  a retry). A continuation lost with its worker or driver is never sent again: the step
  starts a new attempt (the lost one recorded), as after any crash. A cancel closes the
  pending intervention (`begin_ending`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.agents import AgentTask, TaskDispatcher
from orchestrator.config import Settings
from orchestrator.errors import RateLimited, ValidationFailed
from orchestrator.runtime.claims import Fence
from orchestrator.workflows._admission import DriverAdmission
from orchestrator.workflows._patterns import PatternBudgetSpent, PatternRunner, Search
from orchestrator.workflows._resolve import resolve_child
from orchestrator.workflows._spec import (
    BranchRule,
    Condition,
    StepSpec,
    branch_uses_patterns,
    choose_branch,
    fill_refs,
)
from orchestrator.workflows._states import StepState, WorkflowState
from orchestrator.workflows._store import LiveLockBusy, WorkflowRecord, WorkflowStore
from orchestrator.workflows._tasks import announcer, chainable, step_task

if TYPE_CHECKING:
    from orchestrator.events import EventTransaction
    from orchestrator.interventions import Intervention, InterventionStore

T = TypeVar("T")
Starter = Callable[[str], Awaitable[None]]


class _Parked(Exception):
    """The workflow waits for a person's decision (issue 32): its driver ends, holding no
    claim and no slot; the decision starts it again."""


class WorkflowDriving:
    """The steps of a driven workflow; the engine's state it reads is declared here."""

    _store: WorkflowStore
    _interventions: InterventionStore | None
    _dispatcher: TaskDispatcher
    _settings: Settings
    _starter: Starter
    _fences: dict[str, Fence]
    _progress: dict[str, int]
    _knows_ending: set[str]
    # Events set to wake a driver's wait (a workflow's end, a drain), by workflow id.
    _waiters: dict[str, set[asyncio.Event]]
    _patterns: PatternRunner
    _admission: DriverAdmission
    _draining: bool
    # Until every workflow of `ids` has finished (the engine hears of their ends).
    _until_finished: Callable[[Sequence[str]], Awaitable[None]]

    async def _finish(self, workflow_id: str, status: WorkflowState, **kwargs: Any) -> None:
        """The workflow's last transition, which also releases its claim: the renewer may
        find the claim gone from here on, and is told so."""
        self._fences.pop(workflow_id, None)
        await self._store.finish(workflow_id, status, **kwargs)

    async def _drive(self, workflow_id: str, fence: Fence) -> None:
        record = await self._store.load(workflow_id)
        # Its tenant known, the rest waits its turn among the shard's drivers (_admission.py).
        if record is not None and await self._admission.enter(workflow_id, record.user_uuid):
            record = await self._store.load(workflow_id)  # it waited: read it as it is now
        if record is None or record.finished or self._draining:
            return
        if record.waiting_for is not None and record.ending is None:
            raise _Parked(record.waiting_for)  # started while it waits: nothing to drive
        if record.ending is not None:
            self._knows_ending.add(workflow_id)  # compensating: a late cancel NOTIFY is old
        if record.status == WorkflowState.PENDING and record.ending is None:
            record = await self._store.mark_started(workflow_id, fence)
        while record.ending is None:
            if record.cursor >= len(record.steps):
                await self._finish(workflow_id, WorkflowState.COMPLETED, fence=fence)
                return
            if record.executed >= self._settings.workflow_max_steps:
                await self._store.begin_ending(
                    workflow_id,
                    "failed",
                    f"step budget spent: {self._settings.workflow_max_steps} steps executed"
                    " (workflow_max_steps); a branch loop?",
                    fence=fence,
                )
            else:
                await self._step(record, record.cursor, fence)
                self._progress[workflow_id] = self._progress.get(workflow_id, 0) + 1
            if self._draining:
                return  # between steps: the next generation goes on from here
            loaded = await self._store.load(workflow_id)
            assert loaded is not None
            record = loaded
        await self._compensate(record, fence)

    async def _step(self, record: WorkflowRecord, idx: int, fence: Fence) -> None:
        spec, step = record.spec.steps[idx], record.steps[idx]
        if step.status in (StepState.COMPLETED, StepState.SKIPPED):
            await self._store.skip_steps(record.id, (), idx + 1, fence)
            return
        if step.status == StepState.FAILED:
            await self._store.begin_ending(
                record.id, "failed", step.error or "step failed", fence=fence
            )
            return
        if step.status == StepState.PENDING and spec.condition is not None:
            condition = Condition(spec.condition)
            try:
                holds = (
                    await self._search(
                        record, lambda search: condition.evaluate(record.lookup, search)
                    )
                    if condition.uses_patterns
                    else condition.evaluate(record.lookup)
                )
            except PatternBudgetSpent as exc:
                await self._store.begin_ending(
                    record.id, "failed", f"step {spec.name}: {exc}", spec.name, fence
                )
                return
            if not holds:
                await self._store.skip_steps(record.id, (idx,), idx + 1, fence)
                return
        if spec.type == "branch":
            await self._branch(record, idx, spec, fence)
        elif spec.type == "spawn":
            await self._spawn(record, idx, spec, fence)
        elif spec.type == "approval":
            await self._approval(record, idx, spec, fence)
        else:
            await self._task(record, idx, spec, fence)

    async def _task(self, record: WorkflowRecord, idx: int, spec: StepSpec, fence: Fence) -> None:
        step = record.steps[idx]
        tasks: list[AgentTask] = []
        key = step.key if step.status == StepState.RUNNING and not step.waiting else None
        # A running attempt parked on a person's decision: resume it, once (issue 32).
        continuation = None if key is None else await self._continuation(record.id, idx, key, fence)
        if continuation is not None and key is not None:
            tasks.append(continuation)
        else:
            due = step.retry_at if step.waiting else None
            if due is not None and not await self._until_due(record.id, due):
                return  # draining: the wait goes on where the workflow is resumed
            # The task's task.created commits with the step's start: one transaction, not
            # two, and under the fence: a driver that lost the claim never dispatches this
            # attempt.
            _, key = await self._store.start_step(
                record.id, idx, announcer(record, spec, tasks, self._settings), fence
            )
        while True:
            task = tasks[-1]
            async with self._admission.away(record.id):
                result = await self._dispatcher.run(task)
            if result.status == "waiting":
                # Parked at a call that needs a person: the driver ends here (_Parked),
                # unless it was decided already, then its continuation goes at once.
                resumed = await self._continuation(record.id, idx, key, fence)
                if resumed is None:
                    return  # taken elsewhere: the drive loop starts a new attempt
                tasks.append(resumed)
                continue
            if result.ok:
                # The result and the next task step's start in one commit.
                _, following = await self._store.finish_and_start_next(
                    record.id,
                    idx,
                    key,
                    result=result.result or "",
                    duration_ms=result.duration_ms,
                    plan=lambda fresh: chainable(
                        fresh, tasks, self._settings, draining=self._draining
                    ),
                    fence=fence,
                )
                if following is None:
                    return
                self._progress[record.id] = self._progress.get(record.id, 0) + 1
                idx, key = following
                continue
            error = result.error or result.status
            if result.status == "timeout":
                error = f"timeout: {result.error}"
            outcome = await self._store.fail_attempt(
                record.id, idx, key, error=error, duration_ms=result.duration_ms, fence=fence
            )
            if outcome == "failed":
                name = record.spec.steps[idx].name
                await self._store.begin_ending(
                    record.id, "failed", f"step {name} failed: {error}", name, fence
                )
            # "retrying": the drive loop comes back to the step, which waits for its next
            # attempt (_until_due) and starts it.
            return

    async def _continuation(
        self, workflow_id: str, idx: int, key: str, fence: Fence
    ) -> AgentTask | None:
        """Attempt `key` of task step `idx` waits for a person: park the workflow (raises
        _Parked) while the intervention is pending; once decided, the task that continues
        the attempt, taken once (None: it waits for nothing, or its continuation was sent
        before and is lost: the caller starts a new attempt)."""
        if self._interventions is None:
            return None
        held = await self._interventions.for_attempt(key)
        if held is None:
            return None
        if held.pending and await self._store.park(workflow_id, held.id, fence):
            raise _Parked(held.id)
        # Decided (before or just now): whoever takes it sends it, once.
        if not await self._interventions.take_resume(held.id, fence):
            return None
        record = await self._store.load(workflow_id)  # as it is now (a chained step's)
        assert record is not None
        spec = record.spec.steps[idx]
        assert spec.prompt is not None
        task = step_task(record, spec, key, spec.prompt)
        return replace(task, resume=held.id, announced=True)

    async def _approval(
        self, record: WorkflowRecord, idx: int, spec: StepSpec, fence: Fence
    ) -> None:
        """An approval step: ask (the attempt's start, its intervention and the park in one
        transaction) and end the driver; once decided, complete or fail the step."""
        step = record.steps[idx]
        store = self._interventions
        if store is None:
            _, key = await self._store.start_step(record.id, idx, fence=fence)
            await self._fail_step(record, idx, key, "no one can be asked here", fence)
            return
        if step.status == StepState.RUNNING and step.key:
            held = await store.for_attempt(step.key)
            if held is not None:
                if held.pending:
                    if await self._store.park(record.id, held.id, fence):
                        raise _Parked(held.id)
                    decided = await store.load(held.id)
                    assert decided is not None
                    held = decided
                await self._decided(record, idx, step.key, held, fence)
                return
        question = fill_refs(spec.prompt or "", record.lookup)

        async def ask(tx: EventTransaction, key: str) -> Intervention:
            return await store.create_in(
                tx,
                task_id=key,
                workflow_id=record.id,
                step=spec.name,
                user_uuid=record.user_uuid,
                kind="approval",
                question=question,
                deciders=spec.approvers,
                notify_channel=spec.notify or record.spec.notify,
                timeout_s=spec.approval_timeout_s,
            )

        raise _Parked(await self._store.start_and_ask(record.id, idx, ask, fence))

    async def _decided(
        self, record: WorkflowRecord, idx: int, key: str, held: Intervention, fence: Fence
    ) -> None:
        """An approval step's outcome, as its intervention was decided (recorded once)."""
        who = held.decided_by_label or "the service"
        waited = max(0, (held.decided_at or held.created_at) - held.created_at)
        if held.status == "approved":
            await self._store.finish_step(
                record.id,
                idx,
                key,
                ok=True,
                result=f"approved by {who}" + (f": {held.note}" if held.note else ""),
                error=None,
                duration_ms=waited,
                next_cursor=idx + 1,
                fence=fence,
            )
            return
        if held.status == "expired":
            error = "approval expired: nobody decided in time"
        else:
            error = f"approval rejected by {who}: {held.reason or 'no reason given'}"
        await self._fail_step(record, idx, key, error, fence)

    async def _until_due(self, workflow_id: str, due_ms: int) -> bool:
        """Wait, without the workflow's database slot, until a step's next attempt is due
        (`due_ms`, its stored retry_at, by the database's clock). False when the engine
        drains first: the next generation resumes the wait from the row."""
        left = await self._store.ms_until(due_ms)
        deadline = time.monotonic() + max(0, left) / 1000
        woken = asyncio.Event()  # by a drain (the engine wakes every waiter)
        self._waiters.setdefault(workflow_id, set()).add(woken)
        try:
            async with self._admission.away(workflow_id):
                while not self._draining:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return True
                    woken.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), remaining)
                return False
        finally:
            waiting = self._waiters.get(workflow_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[workflow_id]

    async def _search(self, record: WorkflowRecord, evaluate: Callable[[Search], T]) -> T:
        """`evaluate` with pattern searches, off the loop (_patterns.py), without the
        workflow's database slot: the search may wait for a thread, and the slot is for
        database work (the shard's other drivers need it meanwhile)."""
        try:
            async with self._admission.away(record.id):
                return await self._patterns.run(record.id, record.user_uuid, evaluate)
        except PatternBudgetSpent:
            await self._admission.enter(record.id)  # its handler records the failure
            raise

    async def _choose(self, record: WorkflowRecord, spec: StepSpec) -> BranchRule | str:
        """The branch entry to follow, or why the branch step fails."""
        try:
            rule = (
                await self._search(
                    record, lambda search: choose_branch(spec, record.lookup, search)
                )
                if branch_uses_patterns(spec)
                else choose_branch(spec, record.lookup)
            )
        except PatternBudgetSpent as exc:
            return str(exc)
        return rule or "no branch condition matched and there is no fallback"

    async def _branch(self, record: WorkflowRecord, idx: int, spec: StepSpec, fence: Fence) -> None:
        _, key = await self._store.start_step(record.id, idx, fence=fence)
        rule = await self._choose(record, spec)
        if isinstance(rule, str):
            await self._fail_step(record, idx, key, rule, fence)
            return
        target = record.spec.step_index[rule.then]
        await self._store.finish_step(
            record.id,
            idx,
            key,
            ok=True,
            result=f"{rule.name} -> {rule.then}",
            error=None,
            duration_ms=0,
            next_cursor=target,
            skip=range(idx + 1, target) if target > idx else (),
            rewind=range(target, idx + 1) if target < idx else None,
            fence=fence,
        )

    async def _fail_step(
        self, record: WorkflowRecord, idx: int, key: str, error: str, fence: Fence
    ) -> None:
        """The running step attempt failed with `error` (recorded once): so does the workflow."""
        name = record.spec.steps[idx].name
        if await self._store.finish_step(
            record.id,
            idx,
            key,
            ok=False,
            result=None,
            error=error,
            duration_ms=0,
            next_cursor=idx,
            fence=fence,
        ):
            await self._store.begin_ending(
                record.id, "failed", f"step {name}: {error}", name, fence
            )

    async def _spawn(self, record: WorkflowRecord, idx: int, spec: StepSpec, fence: Fence) -> None:
        started = time.monotonic()
        _, key = await self._store.start_step(record.id, idx, fence=fence)
        children = await self._store.children_of_step(record.id, spec.name)
        if not children:
            specs = [
                await resolve_child(self._store, child, record.user_uuid, f"{spec.name}[{i}]")
                for i, child in enumerate(spec.workflows)
            ]
            try:
                children = await self._create_children(record, idx, spec, specs, fence)
            except LiveLockBusy:
                raise  # contention, not a limit: retried as an infrastructure failure
            except (RateLimited, ValidationFailed) as exc:
                # Past the user's live ceiling (a 400: more children than the ceiling
                # itself, say lowered since admission): the step fails, naming it.
                await self._fail_step(record, idx, key, exc.message, fence)
                return
        async with self._admission.away(record.id):  # the children need the slots
            for child_id in children:
                await self._starter(child_id)
            # Woken by each child's `done` NOTIFY (no polling); the renewer keeps our claim.
            await self._until_finished(children)
        summary = [
            {
                "id": child.id,
                "name": child.name,
                "status": str(child.status),
                "result": child.last_result(),
            }
            for child in await self._store.load_many(children)
        ]
        failed = [str(c["id"]) for c in summary if c["status"] != "completed"]
        error = f"child workflows did not complete: {', '.join(failed)}" if failed else None
        recorded = await self._store.finish_step(
            record.id,
            idx,
            key,
            ok=not failed,
            result=json.dumps({"children": summary}),
            error=error,
            duration_ms=int((time.monotonic() - started) * 1000),
            next_cursor=idx + 1,
            fence=fence,
        )
        if recorded and failed:
            await self._store.begin_ending(
                record.id, "failed", f"step {spec.name} failed: {error}", spec.name, fence
            )

    async def _create_children(
        self, record: WorkflowRecord, idx: int, spec: StepSpec, specs: list[Any], fence: Fence
    ) -> list[str]:
        async with self._store.pool.acquire() as conn, conn.transaction():
            await fence.check(conn)  # a zombie creates no children
            # Admitted with their root, but the user may have started others since.
            await self._store.check_live_room(
                conn,
                record.user_uuid,
                len(specs),
                self._settings.workflow_max_live_per_user,
                field=f"steps[{idx}].workflows",
            )
            return [
                await self._store.create(
                    s, record.user_uuid, parent_id=record.id, parent_step=spec.name, conn=conn
                )
                for s in specs
            ]

    async def _compensate(self, record: WorkflowRecord, fence: Fence) -> None:
        for step in reversed(record.steps):
            if step.status != StepState.COMPLETED or step.compensated:
                continue
            action = record.spec.steps[step.idx].compensate
            ok, detail = True, "compensated (no action)"
            if isinstance(action, dict):
                detail = f"notify: {action['notify']}"
            elif isinstance(action, str):
                spec = record.spec.steps[step.idx]
                task = step_task(record, spec, f"{step.key or record.id}:compensate", action)
                # Nobody is asked while undoing, and no team is opened again (issue 33).
                task = replace(task, can_wait=False, team=None)
                async with self._admission.away(record.id):
                    result = await self._dispatcher.run(task)
                ok = result.ok
                detail = (
                    f"compensated: {(result.result or '')[:500]}"
                    if ok
                    else f"compensation failed: {result.error}"
                )
            await self._store.mark_compensated(
                record.id, step.idx, ok=ok, detail=detail, fence=fence
            )
        failed_step = next((s.name for s in record.steps if s.status == StepState.FAILED), None)
        final = WorkflowState.FAILED if record.ending == "failed" else WorkflowState.CANCELLED
        await self._finish(record.id, final, error=record.error, step=failed_step, fence=fence)
