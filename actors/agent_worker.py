"""The AgentWorker pool: `<generation>-AgentWorker-<i>` actors (worker ids `agent-worker-<i>`),
each running many agent tasks at once (async), with fractional CPU. The caller's side,
`RayDispatcher`, is in actors/dispatch.py (it loads without the agent loop and the providers).

Admission (issue 29): a worker runs at most `agent_worker_max_running` tasks at once, at most
`agent_worker_tenant_share` of them one tenant's (the task's user_uuid); the others wait in
per-tenant FIFO queues served fairly (orchestrator/runtime/fair_queue.py), so one tenant's
backlog does not delay another tenant's task behind it. Ray's own queue (past
`agent_worker_concurrency` calls) is first come, first served: it is set far above the running
bound so that calls reach the fair queue.

Its life is in the events (issue 33): worker.spawned and worker.ready when it has started;
worker.spawn_failed for each try to start that failed (a crash on start: the database or a
service it builds refusing), with the reason, tried again by the process's supervisor after
the house's backoff (RESTART_BACKOFF: 0.25-0.5 s, doubling up to 15-30 s); worker.crashed
once Ray restarted it after its process died; worker.killed when it is stopped on purpose
(its generation drained: a redeploy, a change of the pool's size, a shutdown). A failure
that cannot be written (the database is what failed) is kept and written at the next start
that can, before worker.spawned."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

import ray

from actors import Generation
from actors.dispatch import KIND, AttemptLost, RayDispatcher, WorkerDraining, worker_name
from actors.host import ActorHost
from orchestrator.agents import AgentTask, TaskResult
from orchestrator.config import Settings
from orchestrator.events import EventStore, NewEvent
from orchestrator.services import AgentWorkerServices, build_services

if TYPE_CHECKING:
    from orchestrator.agents import AgentRunner
    from orchestrator.events import EventStore
    from orchestrator.memory import MemoryStore
    from orchestrator.runtime.fair_queue import FairAdmission

# The agent loop, the providers, memory, the workspace and the Redis client are imported in
# `_start` (by the composition root, orchestrator/services/), in the worker's own process.
# Not here: every dispatcher (the scheduler, the workflow shards, the channel hubs) imports
# this module when it first looks a worker up (`ray.get_actor` loads the actor's class), and
# an import of them there held the dispatcher's event loop for 0.2-0.4 s (the scheduler's
# dispatches all late by that much).

log = logging.getLogger(__name__)

__all__ = [
    "KIND",
    "AgentWorker",
    "AttemptLost",
    "RayDispatcher",
    "WorkerDraining",
    "worker_name",
]


@ray.remote(max_restarts=-1, max_task_retries=0)
class AgentWorker(ActorHost):
    def __init__(self, settings: Settings, index: int, generation: Generation) -> None:
        self._id = worker_name(index)
        super().__init__(self._id, settings, generation)
        # Agent tasks are the work; dispatching it on time (the scheduler) and the API are
        # the control: when the CPUs are short, the workers wait (a burst of scheduled runs
        # no longer delays the next dispatches: docs/benchmarks.md). Imported here, in the
        # worker, as the agent loop is (see above).
        from orchestrator.runtime.fair_queue import FairAdmission, tenant_ceiling
        from orchestrator.runtime.priority import lower_process_priority

        lower_process_priority(settings.agent_worker_niceness)
        slots = settings.agent_worker_max_running
        self._admission: FairAdmission = FairAdmission(
            slots, tenant_ceiling(slots, settings.agent_worker_tenant_share)
        )
        self._generation = generation
        self._draining = False
        self._completed = 0
        # Ray restarted this worker: its previous process died (killed, out of memory,
        # crashed), busy or idle. Recorded once, at the first start that can write it.
        self._crash_to_record = ray.get_runtime_context().was_current_actor_reconstructed
        self._memory: MemoryStore | None = None  # the booted services' (settled on drain)
        self._events: EventStore | None = None  # the booted services' store
        # Team members (issue 33) go to the pool from here, as step tasks do from a shard.
        self._members: RayDispatcher | None = None
        self._start_failures = 0  # in a row
        self._unrecorded: list[NewEvent] = []  # failures to start not written yet
        self._booted = self._boot(self._start)

    def __repr__(self) -> str:
        a = self._admission
        return (
            f"AgentWorker(id={self._id}, running={a.running}, queued={a.queued}, "
            f"completed={self._completed})"
        )

    async def _start(self, opened: contextlib.AsyncExitStack) -> AgentRunner:
        """One try to start (the supervisor retries a failed one after its backoff); a
        failure is recorded as worker.spawn_failed."""
        try:
            return await self._start_services(opened)
        except Exception as exc:
            from actors.records import error_text  # in the worker (see the imports above)

            self._start_failures += 1
            bound = dataclasses.replace(self._supervisor.backoff, jitter=0)
            failed = NewEvent(
                "worker.spawn_failed",
                {
                    "worker_id": self._id,
                    "error": error_text(exc),
                    "attempt": self._start_failures,
                    "retry_within_ms": int(bound.delay(self._start_failures) * 1000),
                },
            )
            if not await self._record([*self._unrecorded, failed]):
                self._unrecorded.append(failed)
            else:
                self._unrecorded.clear()
            raise

    async def _start_services(self, opened: contextlib.AsyncExitStack) -> AgentRunner:
        """Everything a try opens goes on `opened`: a failed try closes it (the gateway's
        HTTP pools once leaked here)."""
        services = await build_services(
            self._settings,
            AgentWorkerServices,
            opened,
            recorder=self._recorder,
            supervisor=self._supervisor,
            dispatch=self._dispatch_member,
        )
        events = self._events = services.events
        started = [NewEvent("worker.spawned", {"worker_id": self._id, "pid": os.getpid()})]
        if self._crash_to_record:
            # Once per death, by the one who knows; a task it was running is recorded by
            # its dispatcher (worker.task_failed).
            started.insert(
                0,
                NewEvent(
                    "worker.crashed",
                    {"worker_id": self._id, "error": "its process died; Ray restarted it"},
                ),
            )
        await events.append([*self._unrecorded, *started])
        self._unrecorded.clear()
        self._crash_to_record = False
        self._start_failures = 0
        await events.append([NewEvent("worker.ready", {"worker_id": self._id})])
        self._memory, self._events = services.memory, events
        return services.runner

    async def _dispatch_member(self, task: AgentTask) -> TaskResult:
        """A team member's task (issue 33), sent to the pool the way step tasks are."""
        if self._members is None:
            assert self._events is not None, "dispatched before the services were built"
            self._members = RayDispatcher(self._settings, self._events, self._generation)
        return await self._members.run(task)

    async def _record(self, events: list[NewEvent]) -> bool:
        """Append `events` now: through the started services' store, else (the start
        failed) a connection of their own (actors/records.py)."""
        from actors.records import append_now

        return await append_now(self._settings.database_url, events, self._events)

    def _before_flush(self) -> None:
        self._recorder.active_workers(1 if self._admission.running else 0)

    async def ready(self) -> str:
        await self._booted
        return repr(self)

    async def describe(self) -> dict[str, Any]:
        """What this worker runs with: its generation and its settings (secrets masked)."""
        return {
            "id": self._id,
            "generation": self._generation.version,
            "settings": self._settings.model_dump(mode="json"),
            "resources": ray.get_runtime_context().get_assigned_resources(),  # type: ignore[no-untyped-call]
        }

    async def load(self) -> dict[str, int]:
        """Tasks running here and waiting for a slot, and the bounds."""
        a = self._admission
        return {
            "running": a.running,
            "queued": a.queued,
            "slots": a.slots,
            "per_tenant": a.per_tenant,
        }

    async def drain(self, reason: str = "its generation is being replaced") -> int:
        """Take no new task; return once the running ones have ended (the caller bounds the
        wait): the generation is being replaced. Tasks still waiting for a slot are refused
        (WorkerDraining: nothing of them ran). Returns how many ran to their end here.
        worker.killed says so first (with `reason`): the kill follows the drain."""
        self._draining = True
        a = self._admission
        killed = {"worker_id": self._id, "reason": reason, "running": a.running, "queued": a.queued}
        self._admission.close(self._refusal)
        await self._record([NewEvent("worker.killed", killed)])
        # Admission's own signal: a slot given back by a waiter cancelled before it resumed
        # (no `run` of ours sees that) is the last one as surely as a finished task's.
        await self._admission.wait_idle()
        # The generation's end kills this process (ray.kill, no stack closed): the memory
        # writes still running and the cache DELs still owed go out now, or replicas could
        # serve copies older than an acknowledged write for up to 300 s.
        if self._memory is not None:
            await self._memory.settle()
        return self._completed

    def _refusal(self) -> WorkerDraining:
        # A RayTaskError at the caller: it sends the task to another worker.
        return WorkerDraining(f"{self._id} is draining (its generation is being replaced)")

    async def run(self, task: AgentTask) -> TaskResult:
        if self._draining:
            raise self._refusal()
        runner = await self._booted
        # Waits here while the slots are full or this tenant holds its share; a caller
        # cancelled meanwhile (ray.cancel) leaves the queue at once. Refused on drain.
        await self._admission.acquire(task.user_uuid)
        self._recorder.active_workers(1)
        try:
            return await runner.run(task, self._id)
        finally:
            self._admission.release(task.user_uuid)
            self._completed += 1
