"""The AgentWorker pool: `<generation>-AgentWorker-<i>` actors (worker ids `agent-worker-<i>`),
each running many agent tasks at once (async), with fractional CPU. The caller's side,
`RayDispatcher`, is in actors/dispatch.py (it loads without the agent loop and the providers).

Admission (issue 29): a worker runs at most `agent_worker_max_running` tasks at once, at most
`agent_worker_tenant_share` of them one tenant's (the task's user_uuid); the others wait in
per-tenant FIFO queues served fairly (orchestrator/runtime/fair_queue.py), so one tenant's
backlog does not delay another tenant's task behind it. Ray's own queue (past
`agent_worker_concurrency` calls) is first come, first served: it is set far above the running
bound so that calls reach the fair queue."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import ray

from actors import Generation
from actors.dispatch import KIND, AttemptLost, RayDispatcher, WorkerDraining, worker_name
from actors.host import ActorHost
from orchestrator.agents import AgentTask, TaskResult
from orchestrator.config import Settings
from orchestrator.db import Database, connect
from orchestrator.events import EventStore, NewEvent

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from orchestrator.agents import AgentRunner
    from orchestrator.providers import Gateway
    from orchestrator.runtime.fair_queue import FairAdmission
    from orchestrator.toolset import AgentToolClients

# The agent loop, the providers, memory, the workspace and the Redis client are imported in
# `_start_once`, in the worker's own process. Not here: every dispatcher (the scheduler, the
# workflow shards, the channel hubs) imports this module when it first looks a worker up
# (`ray.get_actor` loads the actor's class), and an import of them there held the
# dispatcher's event loop for 0.2-0.4 s (the scheduler's dispatches all late by that much).

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
        self._redis: aioredis.Redis | None = None
        self._completed = 0
        self._db: Database | None = None
        self._runner: AgentRunner | None = None
        self._gateway: Gateway | None = None
        self._tool_clients: AgentToolClients | None = None
        # Ray restarted this worker: its previous process died (killed, out of memory,
        # crashed), busy or idle. Recorded once, at the first start that can write it.
        self._crash_to_record = ray.get_runtime_context().was_current_actor_reconstructed
        self._booted = self._boot(self._start_once, self._undo_start)

    def __repr__(self) -> str:
        a = self._admission
        return (
            f"AgentWorker(id={self._id}, running={a.running}, queued={a.queued}, "
            f"completed={self._completed})"
        )

    async def _undo_start(self) -> None:
        # Everything a failed try opened: the gateway's HTTP pools leaked here before.
        if self._tool_clients is not None:
            clients, self._tool_clients = self._tool_clients, None
            await clients.aclose()
        if self._gateway is not None:
            gateway, self._gateway = self._gateway, None
            await gateway.aclose()
        if self._redis is not None:
            redis, self._redis = self._redis, None
            await redis.aclose()
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def _start_once(self) -> AgentRunner:
        import redis.asyncio as aioredis

        from orchestrator.agents import AgentRunner
        from orchestrator.inference import ready_endpoints
        from orchestrator.marketplace import Marketplace
        from orchestrator.memory import MemoryStore
        from orchestrator.providers import Gateway
        from orchestrator.toolset import AgentToolClients
        from orchestrator.workspace import Workspace

        assert self._settings.database_url
        self._db = await connect(self._settings.database_url, min_size=1, max_size=8)
        events = EventStore(self._db.pool)
        pool = self._db.pool
        gateway = Gateway(self._settings, self._recorder, local=lambda: ready_endpoints(pool))
        self._gateway = gateway
        # Entries stored by agents here are embedded by the replicas' fillers; writes drop
        # the replicas' cached copies in the shared Redis.
        self._redis = (
            aioredis.from_url(
                self._settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0
            )
            if self._settings.redis_url
            else None
        )
        memory = MemoryStore(
            pool,
            events,
            self._redis,
            self._settings.memory_embedding_dim,
            pgvector=self._db.pgvector,
            auto_embed=self._settings.embedder != "none",
        )
        # Users' MCP servers and HTTP tools are called from here: one MCP connection pool
        # (and stdio children) per worker process.
        self._tool_clients = AgentToolClients(self._settings)
        runner = AgentRunner(
            self._settings,
            gateway,
            events,
            self._tool_clients.catalog(pool),
            {
                "pool": pool,
                "events": events,
                "memory": memory,
                "workspace": Workspace(self._settings),
                "marketplace": Marketplace.of(pool, self._settings),
            },
        )
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
        await events.append(started)
        self._crash_to_record = False
        await events.append([NewEvent("worker.ready", {"worker_id": self._id})])
        self._runner = runner
        return runner

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

    async def drain(self) -> int:
        """Take no new task; return once the running ones have ended (the caller bounds the
        wait): the generation is being replaced. Tasks still waiting for a slot are refused
        (WorkerDraining: nothing of them ran). Returns how many ran to their end here."""
        self._draining = True
        self._admission.close(self._refusal)
        # Admission's own signal: a slot given back by a waiter cancelled before it resumed
        # (no `run` of ours sees that) is the last one as surely as a finished task's.
        await self._admission.wait_idle()
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
