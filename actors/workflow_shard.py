"""`WorkflowShard` actors (k per generation): each drives the workflows it holds the claim
of (orchestrator/runtime/claims.py), many at once as asyncio tasks: new ones are sent to
shard `number % k`; any shard sweeps up unfinished workflows whose claim is free (a dead
shard's, an old generation's or an old `workflow_shards` layout's), its own first.
`RayWorkflows` is how the HTTP replicas reach them: creation and reads go straight to
Postgres; starting and cancelling go to shard `number % k` (a cancel reaches the driver,
wherever it is, by NOTIFY)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors import Generation, Shards
from actors.dispatch import RayDispatcher
from actors.host import ActorHost
from orchestrator.config import Settings
from orchestrator.runtime.backoff import Backoff
from orchestrator.services import WorkflowShardServices, build_services
from orchestrator.workflows import WorkflowEngine, shard_of

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
# A shard restarting (or not yet running) is looked up again: three tries, waits from 0.5 s.
CALL_TRIES = 3
CALL_BACKOFF = Backoff(base=0.5, cap=2.0, jitter=0)
KIND = "WorkflowShard"


def shard_name(index: int) -> str:
    return f"workflow-shard-{index}"


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000
)
class WorkflowShard(ActorHost):
    """Ray restarts a killed shard; the new incarnation's __init__ resumes its workflows
    (nobody needs to call it: a step that was running is dispatched again)."""

    def __init__(self, settings: Settings, index: int, shards: int, generation: Generation) -> None:
        super().__init__(shard_name(index), settings, generation)
        self._generation = generation
        self._index = index
        self._shards = shards
        self._engine: WorkflowEngine | None = None
        self._booted = self._boot(self._start)

    def __repr__(self) -> str:
        engine = self._engine
        if engine is None:
            return f"WorkflowShard(index={self._index}/{self._shards}, booting)"
        return (
            f"WorkflowShard(index={self._index}/{self._shards}, running={engine.running_count()},"
            f" db={engine.admission!r})"
        )

    async def _start(self, opened: contextlib.AsyncExitStack) -> WorkflowEngine:
        services = await build_services(
            self._settings, WorkflowShardServices, opened, recorder=self._recorder
        )
        events, store = services.events, services.workflows
        router = RayWorkflows(self._settings, self._generation)
        engine = WorkflowEngine(
            store,
            RayDispatcher(self._settings, events, self._generation),
            self._settings,
            starter=router.start,
            canceller=router.cancel,
            # By name: a restarted shard takes its claims back at once, with new epochs (its
            # predecessor, were it alive, is fenced off); another generation's shard waits
            # for the claims to be released (drain) or to expire.
            owner=self._generation.name(KIND, self._index),
            supervisor=self._supervisor,
            interventions=services.interventions,
        )
        opened.push_async_callback(engine.shutdown)  # its drivers and loops, if this fails
        resumed = await engine.resume_unfinished(self._index, self._shards)
        log.info("%s: resumed %d unfinished workflows", shard_name(self._index), resumed)
        self._engine = engine
        return engine

    async def ready(self) -> str:
        await self._booted
        return repr(self)

    async def drain(self) -> None:
        """Stop driving (the generation is being replaced): every workflow stays as it is in
        Postgres, for the next generation's shards to resume."""
        engine = await self._booted
        # Steps in flight end and are recorded (not run again by the next generation);
        # the rest of the drain budget is the agent workers'.
        await engine.shutdown(drain_s=self._settings.generation_drain_s * 0.75)

    async def start(self, workflow_id: str) -> None:
        """Drive a workflow just created (idempotent)."""
        engine = await self._booted
        await engine.start(workflow_id)

    async def cancel(self, workflow_id: str) -> str:
        engine = await self._booted
        return await engine.cancel(workflow_id)


class RayWorkflows:
    """Caller side: routes a workflow to its shard (of the caller's generation) by id."""

    def __init__(self, settings: Settings, generation: Generation) -> None:
        self._settings = settings
        self._shards = max(1, settings.workflow_shards)
        self._pool = Shards(generation, KIND, self._shards)

    async def _call(self, workflow_id: str, method: str) -> Any:
        index = shard_of(workflow_id, self._shards)
        for failures in range(1, CALL_TRIES + 1):
            try:
                actor = self._pool.actor(index)
                return await asyncio.wait_for(
                    getattr(actor, method).remote(workflow_id), CALL_TIMEOUT_S
                )
            except RayActorError:
                # Restarting, or not running: look it up again.
                self._pool.forget(index)
                if failures == CALL_TRIES:
                    raise
                await asyncio.sleep(CALL_BACKOFF.delay(failures))
        raise AssertionError("unreachable")

    async def start(self, workflow_id: str) -> None:
        # The workflow is already in Postgres: a shard that is down resumes it when it
        # comes back, so a failure to reach it now loses nothing.
        with contextlib.suppress(RayActorError, TimeoutError):
            await self._call(workflow_id, "start")

    async def cancel(self, workflow_id: str) -> str:
        try:
            result: str = await self._call(workflow_id, "cancel")
        except TimeoutError:
            # The shard took the cancel (it is durable from its first step) and is still
            # compensating: the workflow reads `running` until that ends.
            return "running"
        return result

    async def close(self) -> None:
        """Shards belong to the generation (actors/generation.py), not to this caller."""
