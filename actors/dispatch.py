"""The caller's side of the AgentWorker pool: `RayDispatcher` sends a task to the
least-loaded worker and, when that worker dies mid-task, records `worker.task_failed` and runs
the task again on another one (at-least-once: same task id and idempotency key), except a
workflow step attempt, which is never sent twice (`AttemptLost`). It imports only what a task
is, so the actors that dispatch (workflow shards, the scheduler, channel hubs) start without
loading the agent loop and the provider clients."""

from __future__ import annotations

import asyncio
import logging
import time

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors import Generation, Shards
from orchestrator.agents import AgentTask, TaskResult, created_event
from orchestrator.config import Settings
from orchestrator.events import EventStore, NewEvent
from orchestrator.runtime.backoff import Backoff

log = logging.getLogger(__name__)

MAX_REDISPATCH = 3
# A worker not running (its generation starting, or restarting on another node after its
# node was lost): looked up again after a wait, for up to NO_WORKER_WAIT_S. A task not sent
# yet is safe to hold; failing it would fail a workflow step for want of a process (a pool
# restarting on the head after its node went away took longer than four quick lookups).
LOOKUP_BACKOFF = Backoff(base=0.5, cap=2.0)
NO_WORKER_WAIT_S = 60.0
KIND = "AgentWorker"


class AttemptLost(RuntimeError):
    """A workflow step attempt's worker died mid-task: its tool calls may have run, so the
    attempt is not sent again; the engine retries the step as a new attempt."""


class WorkerDraining(RuntimeError):
    """The worker refused the task before starting it (its generation is being replaced):
    nothing of it ran, so it may be sent to another worker under the same attempt."""


def worker_name(index: int) -> str:
    return f"agent-worker-{index}"


class RayDispatcher:
    """TaskDispatcher over the AgentWorker pool (least loaded first, by this caller's own
    in-flight counts: a caller that sends most of the work balances it well enough)."""

    def __init__(self, settings: Settings, events: EventStore, generation: Generation) -> None:
        self._settings = settings
        self._events = events
        self._size = settings.agent_workers
        self._pool = Shards(generation, KIND, self._size)
        self._inflight = [0] * self._size

    async def run(self, task: AgentTask) -> TaskResult:
        if not task.announced:
            await self._events.append([created_event(task, self._settings)])
        tried: set[int] = set()
        deadline = time.monotonic() + NO_WORKER_WAIT_S
        sends = 0
        missing = 0
        last_error = "every worker it was sent to died"
        while sends <= MAX_REDISPATCH:
            candidates = [i for i in range(self._size) if i not in tried] or list(range(self._size))
            index = min(candidates, key=lambda i: self._inflight[i])
            tried.add(index)
            try:
                actor = self._pool.actor(index)
            except RayActorError as exc:  # not running: its generation is starting or gone
                last_error = str(exc)
                missing += 1
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(LOOKUP_BACKOFF.delay(missing))
                continue
            sends += 1
            self._inflight[index] += 1
            ref = actor.run.remote(task)
            try:
                result: TaskResult = await ref
                return result
            except asyncio.CancelledError:
                ray.cancel(ref)
                raise
            except RayActorError as exc:
                # The worker died mid-task: Ray restarts it; this task runs again elsewhere.
                self._pool.forget(index)
                log.warning("%s died running %s: %s", worker_name(index), task.task_id, exc)
                # The task's loss; the death itself is recorded by the restarted worker
                # (worker.crashed), once, whether it was running tasks or not.
                await self._events.append(
                    [
                        NewEvent(
                            "worker.task_failed",
                            {
                                "worker_id": worker_name(index),
                                "task_id": task.task_id,
                                "error": f"{worker_name(index)} died while running it",
                            },
                            task.user_uuid,
                        )
                    ]
                )
                if task.workflow_id is not None and task.idempotency_key is not None:
                    # At most once per attempt (issue 16): not re-sent under the same key.
                    raise AttemptLost(f"{worker_name(index)} died running {task.task_id}") from exc
            except RayTaskError as exc:
                # The runner returns the task's own failures as results: this is the
                # worker's (its database went away mid-task...). Refused before it started
                # (draining): run it elsewhere. Failed mid-task: its tool calls may have
                # run, so a workflow step attempt is not sent again (a new attempt is).
                last_error = f"{worker_name(index)} failed running it: {exc}"[:2000]
                log.warning("%s", last_error)
                refused = isinstance(exc.cause, WorkerDraining)
                if not refused and task.workflow_id is not None and task.idempotency_key:
                    raise AttemptLost(last_error) from exc
            finally:
                self._inflight[index] -= 1
        return TaskResult(
            task.task_id,
            "failed",
            None,
            f"no worker could run it ({sends} sent, {missing} found none running): {last_error}",
            0,
            "?",
        )
