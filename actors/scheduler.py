"""The `Scheduler` actor (one per generation, restarted by Ray): hosts the
SchedulerService, whose Postgres lease keeps exactly one scheduler active even if a second
actor is started (it waits for the lease). Runs go to the AgentWorker pool."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import ray

from actors import Generation
from actors.dispatch import RayDispatcher
from actors.host import ActorHost
from orchestrator.config import Settings
from orchestrator.runtime.supervisor import cancel_and_wait
from orchestrator.scheduler import SchedulerService
from orchestrator.services import SchedulerServices, build_services

log = logging.getLogger(__name__)

KIND = "Scheduler"


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=100
)
class Scheduler(ActorHost):
    def __init__(self, settings: Settings, generation: Generation, name: str = "") -> None:
        name = name or generation.name(KIND)
        super().__init__(name, settings, generation)
        self._generation = generation
        self._service: SchedulerService | None = None
        # Connect, then run the scheduler loop: the one restart layer is the supervisor's.
        self._booted = self._boot(self._start)

    def __repr__(self) -> str:
        if self._service is None:
            return f"Scheduler({self._name}, starting)"
        s = self._service
        return f"Scheduler({self._name}, active={s.active}, dispatched={s.dispatched})"

    async def _start(self, opened: contextlib.AsyncExitStack) -> SchedulerService:
        services = await build_services(
            self._settings, SchedulerServices, opened, recorder=self._recorder
        )
        service = SchedulerService(
            services.jobs,
            RayDispatcher(self._settings, services.events, self._generation),
            self._settings,
            self._settings.database_url or "",
            self._supervisor,
            name=self._name,
            # Runs' ends on their own connections: ticks never queue behind them.
            run_store=services.run_jobs,
        )
        service.start()
        self._service = service
        return service

    async def settings(self) -> Settings:
        return self._settings

    async def drain(self) -> None:
        """Schedule nothing more (the generation is being replaced): stop the loop, end the
        runs in flight and give the lease up for the next generation's scheduler."""
        await cancel_and_wait([self._booted])
        if self._service is not None:
            await self._service.shutdown()

    async def status(self) -> dict[str, Any]:
        s = self._service
        return {
            "name": self._name,
            "active": bool(s and s.active),
            "dispatched": s.dispatched if s else 0,
        }
