"""The `Scheduler` actor (one per generation, restarted by Ray): hosts the
SchedulerService, whose Postgres lease keeps exactly one scheduler active even if a second
actor is started (it waits for the lease). Runs go to the AgentWorker pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

import ray

from actors import Generation
from actors.dispatch import RayDispatcher
from actors.metrics import ActorMetricsHub
from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.observability import MetricsPusher, MetricsRecorder, configure_actor_logs
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.scheduler import JobStore, SchedulerService

log = logging.getLogger(__name__)

METRICS_FLUSH_S = 1.0
KIND = "Scheduler"


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=100
)
class Scheduler:
    def __init__(self, settings: Settings, generation: Generation, name: str = "") -> None:
        configure_actor_logs(settings.log_format, settings.log_level)
        self._settings = settings
        self._generation = generation
        self._name = name or generation.name(KIND)
        self._service: SchedulerService | None = None
        self._recorder = MetricsRecorder(f"{self._name}:{socket.gethostname()}:{os.getpid()}")
        # The scheduler loop's restarts (its service's own supervisor calls back here) reach
        # svc_background_restarts_total through this supervised flush.
        self._supervisor = Supervisor(self._name, on_restart=self._recorder.background_restart)
        pusher = MetricsPusher(self._recorder, ActorMetricsHub(generation))
        self._supervisor.spawn("metrics-flush", lambda: self._flush_metrics(pusher))
        self._main = asyncio.get_running_loop().create_task(self._run())

    def __repr__(self) -> str:
        if self._service is None:
            return f"Scheduler({self._name}, starting)"
        s = self._service
        return f"Scheduler({self._name}, active={s.active}, dispatched={s.dispatched})"

    async def _run(self) -> None:
        assert self._settings.database_url
        while True:
            try:
                db = await connect(self._settings.database_url, min_size=1, max_size=6)
                try:
                    # Runs' ends on their own connections: ticks never queue behind them.
                    runs_db = await connect(
                        self._settings.database_url, min_size=1, max_size=4, migrate=False
                    )
                except BaseException:
                    await db.close()
                    raise
                break
            except Exception as exc:  # noqa: BLE001 - Postgres restarting: keep trying
                log.warning("%s: database not reachable (%r)", self._name, exc)
                await asyncio.sleep(1.0)
        events = EventStore(db.pool)
        self._service = SchedulerService(
            JobStore(db.pool, events),
            RayDispatcher(self._settings, events, self._generation),
            self._settings,
            self._settings.database_url,
            name=self._name,
            on_restart=self._recorder.background_restart,
            run_store=JobStore(runs_db.pool, EventStore(runs_db.pool)),
        )
        await self._service.run_forever()

    @staticmethod
    async def _flush_metrics(pusher: MetricsPusher) -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            with contextlib.suppress(Exception):  # the Metrics actor may be restarting
                await pusher.flush()

    async def settings(self) -> Settings:
        return self._settings

    async def drain(self) -> None:
        """Schedule nothing more (the generation is being replaced): stop the loop, end the
        runs in flight and give the lease up for the next generation's scheduler."""
        self._main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._main
        if self._service is not None:
            await self._service.shutdown()

    async def status(self) -> dict[str, Any]:
        s = self._service
        return {
            "name": self._name,
            "active": bool(s and s.active),
            "dispatched": s.dispatched if s else 0,
        }
