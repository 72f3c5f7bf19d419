"""The workflow engine: drives workflows (each an asyncio task), step by step, through the
store's transitions, and runs each task step on the agent runtime (a `TaskDispatcher`).

- A workflow starts on creation: pending -> running (workflow.started), then its steps in
  order: a false `condition` skips a step; a task step runs as an agent task (its mode,
  tools, timeout, the workflow's or step's model, the creator's user_uuid; context: the
  original prompt (the first step's) and every earlier completed result); a branch step
  jumps; a spawn step starts child workflows and waits for them.
- Each step attempt has the idempotency key `<workflow>:<step>:<attempt>` (also the task's
  id); its outcome is recorded once. After a crash, the step that was running is dispatched
  again as a new attempt (at-least-once); a late result of an older attempt is dropped.
- A failed step (or a branch with no match, or the step budget spent): workflow.step_failed,
  workflow.compensating, compensation of the completed steps in reverse order (each step's
  `compensate`: a prompt run as an agent task, or `{notify}`; every compensated step gets a
  `workflow.compensating` event naming it; a failing compensation is recorded there and the
  others still run), then workflow.failed. Cancel: the running step is abandoned (skipped),
  descendants are cancelled, compensation, workflow.cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from orchestrator.agents import AgentTask, TaskDispatcher, created_event
from orchestrator.config import Settings
from orchestrator.errors import Conflict, NotFound
from orchestrator.events import NewEvent
from orchestrator.workflows._resolve import resolve_child
from orchestrator.workflows._spec import Condition, StepSpec, choose_branch, fill_refs
from orchestrator.workflows._states import StepState, WorkflowState
from orchestrator.workflows._store import WorkflowRecord, WorkflowStore

log = logging.getLogger(__name__)

Starter = Callable[[str], Awaitable[None]]
Canceller = Callable[[str], Awaitable[str]]
CHILD_POLL_S = 0.25
CANCEL_WAIT_S = 30.0


class WorkflowEngine:
    def __init__(
        self,
        store: WorkflowStore,
        dispatcher: TaskDispatcher,
        settings: Settings,
        *,
        starter: Starter | None = None,
        canceller: Canceller | None = None,
    ) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._settings = settings
        self._starter = starter or self.start
        self._canceller = canceller or self.cancel
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    @property
    def store(self) -> WorkflowStore:
        return self._store

    def running_count(self) -> int:
        return sum(1 for t in self._drivers.values() if not t.done())

    async def start(self, workflow_id: str) -> None:
        """Drive the workflow here (no-op when it already is)."""
        driver = self._drivers.get(workflow_id)
        if self._closed or (driver is not None and not driver.done()):
            return
        task = asyncio.create_task(self._guarded(workflow_id), name=f"workflow {workflow_id}")
        self._drivers[workflow_id] = task
        task.add_done_callback(lambda t: self._forget(workflow_id, t))

    def _forget(self, workflow_id: str, task: asyncio.Task[None]) -> None:
        if self._drivers.get(workflow_id) is task:
            del self._drivers[workflow_id]

    async def resume_unfinished(self, shard_index: int = 0, shards: int = 1) -> int:
        ids = await self._store.unfinished(shard_index, shards)
        for workflow_id in ids:
            await self.start(workflow_id)
        return len(ids)

    async def cancel(self, workflow_id: str) -> str:
        """Cancel a pending or running workflow; its status once compensation ended (or
        `running` while compensation still runs after CANCEL_WAIT_S)."""
        record = await self._store.load(workflow_id)
        if record is None:
            raise NotFound(f"workflow {workflow_id} not found")
        if record.finished:
            raise Conflict(
                f"workflow {workflow_id} is {record.status}: only a pending or running"
                " workflow can be cancelled",
                extra={"status": str(record.status)},
            )
        driver = self._drivers.get(workflow_id)
        if driver is not None and not driver.done() and record.ending is None:
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver
        await self._store.begin_ending(workflow_id, "cancelled", "cancelled by request")
        try:
            # Children at once; one that cannot be reached (its shard down, slow to
            # compensate) is not a reason to leave this workflow undriven.
            children = [c.id for c in await self._store.children(workflow_id) if not c.finished]
            outcomes = await asyncio.gather(
                *(self._canceller(child) for child in children), return_exceptions=True
            )
            for child, outcome in zip(children, outcomes, strict=True):
                if isinstance(outcome, BaseException) and not isinstance(
                    outcome, Conflict | NotFound
                ):
                    log.warning("cancelling child %s of %s: %r", child, workflow_id, outcome)
        finally:
            await self.start(workflow_id)
        driver = self._drivers.get(workflow_id)
        if driver is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(driver), CANCEL_WAIT_S)
        final = await self._store.load(workflow_id)
        return str(final.status) if final is not None else "cancelled"

    async def wait(self, workflow_id: str, within: float = 60.0) -> WorkflowRecord:
        """Until the workflow has finished (tests, benchmarks)."""
        deadline = time.monotonic() + within
        while True:
            record = await self._store.load(workflow_id)
            if record is None:
                raise NotFound(f"workflow {workflow_id} not found")
            if record.finished:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"workflow {workflow_id} still {record.status}")
            await asyncio.sleep(0.05)

    async def shutdown(self) -> None:
        """Stop driving (state stays as it is: whoever starts next resumes)."""
        self._closed = True
        drivers = list(self._drivers.values())
        for task in drivers:
            task.cancel()
        for task in drivers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        await self.shutdown()

    # --- driving ----------------------------------------------------------------------------

    async def _guarded(self, workflow_id: str) -> None:
        try:
            await self._drive(workflow_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("workflow %s: driving failed; retrying", workflow_id)
            await asyncio.sleep(1.0)
            if not self._closed:
                asyncio.get_running_loop().call_soon(
                    lambda: asyncio.ensure_future(self._restart(workflow_id))
                )

    async def _restart(self, workflow_id: str) -> None:
        self._drivers.pop(workflow_id, None)
        await self.start(workflow_id)

    async def _drive(self, workflow_id: str) -> None:
        record = await self._store.load(workflow_id)
        if record is None or record.finished:
            return
        if record.status == WorkflowState.PENDING and record.ending is None:
            record = await self._store.mark_started(workflow_id)
        while record.ending is None:
            if record.cursor >= len(record.steps):
                await self._store.finish(workflow_id, WorkflowState.COMPLETED)
                return
            if record.executed >= self._settings.workflow_max_steps:
                await self._store.begin_ending(
                    workflow_id,
                    "failed",
                    f"step budget spent: {self._settings.workflow_max_steps} steps executed"
                    " (workflow_max_steps); a branch loop?",
                )
            else:
                await self._step(record, record.cursor)
            loaded = await self._store.load(workflow_id)
            assert loaded is not None
            record = loaded
        await self._compensate(record)

    async def _step(self, record: WorkflowRecord, idx: int) -> None:
        spec, step = record.spec.steps[idx], record.steps[idx]
        if step.status in (StepState.COMPLETED, StepState.SKIPPED):
            await self._store.skip_steps(record.id, (), idx + 1)
            return
        if step.status == StepState.FAILED:
            await self._store.begin_ending(record.id, "failed", step.error or "step failed")
            return
        if step.status == StepState.PENDING and spec.condition is not None:
            if not Condition(spec.condition).evaluate(record.lookup):
                await self._store.skip_steps(record.id, (idx,), idx + 1)
                return
        if spec.type == "branch":
            await self._branch(record, idx, spec)
        elif spec.type == "spawn":
            await self._spawn(record, idx, spec)
        else:
            await self._task(record, idx, spec)

    def _task_for(
        self, record: WorkflowRecord, spec: StepSpec, task_id: str, prompt: str
    ) -> AgentTask:
        context: list[tuple[str, str]] = []
        first = record.spec.steps[0]
        if spec is not first and first.prompt:
            context.append(("Original prompt", fill_refs(first.prompt, record.lookup)))
        for s in record.steps:
            if s.status == StepState.COMPLETED and s.result is not None and s.name != spec.name:
                context.append((f"Result of step {s.name}", s.result))
        return AgentTask(
            task_id=task_id,
            user_uuid=record.user_uuid,
            prompt=fill_refs(prompt, record.lookup),
            context=tuple(context),
            mode=spec.mode,
            tools=spec.tools,
            timeout_s=spec.timeout,
            model=spec.model or record.spec.model,
            workflow_id=record.id,
            step=spec.name,
            idempotency_key=task_id,
        )

    async def _task(self, record: WorkflowRecord, idx: int, spec: StepSpec) -> None:
        assert spec.prompt is not None
        prompt = spec.prompt
        tasks: list[AgentTask] = []

        def created(key: str) -> list[NewEvent]:
            task = replace(self._task_for(record, spec, key, prompt), announced=True)
            tasks.append(task)
            return [created_event(task, self._settings)]

        # The task's task.created commits with the step's start: one transaction, not two.
        _, key = await self._store.start_step(record.id, idx, created)
        result = await self._dispatcher.run(tasks[-1])
        error = result.error or result.status
        if result.status == "timeout":
            error = f"timeout: {result.error}"
        recorded = await self._store.finish_step(
            record.id,
            idx,
            key,
            ok=result.ok,
            result=result.result or "",
            error=error,
            duration_ms=result.duration_ms,
            next_cursor=idx + 1,
        )
        if recorded and not result.ok:
            await self._store.begin_ending(
                record.id, "failed", f"step {spec.name} failed: {error}", step=spec.name
            )

    async def _branch(self, record: WorkflowRecord, idx: int, spec: StepSpec) -> None:
        _, key = await self._store.start_step(record.id, idx)
        rule = choose_branch(spec, record.lookup)
        if rule is None:
            error = "no branch condition matched and there is no fallback"
            if await self._store.finish_step(
                record.id,
                idx,
                key,
                ok=False,
                result=None,
                error=error,
                duration_ms=0,
                next_cursor=idx,
            ):
                await self._store.begin_ending(
                    record.id, "failed", f"step {spec.name}: {error}", step=spec.name
                )
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
        )

    async def _spawn(self, record: WorkflowRecord, idx: int, spec: StepSpec) -> None:
        started = time.monotonic()
        _, key = await self._store.start_step(record.id, idx)
        children = await self._store.children_of_step(record.id, spec.name)
        if not children:
            specs = [
                await resolve_child(self._store, child, record.user_uuid, f"{spec.name}[{i}]")
                for i, child in enumerate(spec.workflows)
            ]
            async with self._store.pool.acquire() as conn, conn.transaction():
                children = [
                    await self._store.create(
                        s,
                        record.user_uuid,
                        parent_id=record.id,
                        parent_step=spec.name,
                        conn=conn,
                    )
                    for s in specs
                ]
        for child_id in children:
            await self._starter(child_id)
        while True:
            statuses = await self._store.statuses(children)
            if all(s in ("completed", "failed", "cancelled") for s in statuses.values()):
                break
            await asyncio.sleep(CHILD_POLL_S)
        summary = []
        for child_id in children:
            loaded = await self._store.load(child_id)
            if loaded is not None:
                summary.append(
                    {
                        "id": loaded.id,
                        "name": loaded.name,
                        "status": str(loaded.status),
                        "result": loaded.last_result(),
                    }
                )
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
        )
        if recorded and failed:
            await self._store.begin_ending(
                record.id, "failed", f"step {spec.name} failed: {error}", step=spec.name
            )

    async def _compensate(self, record: WorkflowRecord) -> None:
        for step in reversed(record.steps):
            if step.status != StepState.COMPLETED or step.compensated:
                continue
            action = record.spec.steps[step.idx].compensate
            ok, detail = True, "compensated (no action)"
            if isinstance(action, dict):
                detail = f"notify: {action['notify']}"
            elif isinstance(action, str):
                spec = record.spec.steps[step.idx]
                task = self._task_for(record, spec, f"{step.key or record.id}:compensate", action)
                result = await self._dispatcher.run(task)
                ok = result.ok
                detail = (
                    f"compensated: {(result.result or '')[:500]}"
                    if ok
                    else f"compensation failed: {result.error}"
                )
            await self._store.mark_compensated(record.id, step.idx, ok=ok, detail=detail)
        failed_step = next((s.name for s in record.steps if s.status == StepState.FAILED), None)
        final = WorkflowState.FAILED if record.ending == "failed" else WorkflowState.CANCELLED
        await self._store.finish(record.id, final, error=record.error, step=failed_step)
