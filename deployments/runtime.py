"""The `Runtime` deployment: one replica per application version that owns its actor
generation (actors/generation.py).

Why a deployment of our own rather than actors made by `build_app` or Serve's deployment
actors: `build_app` runs in the driver or in Serve's build task, so what it creates is either
tied to that process or detached and owned by nobody. Serve's `deployment_actors` are killed
without a drain and never restarted by Ray (handles go stale until the controller's health
checks recreate them). A replica that creates them is stopped by Serve gracefully on a
redeploy and on `serve delete` (its `__del__` drains and kills the generation), and its
actors are not detached, so Ray kills them even when the replica dies some other way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import Any

from ray import serve
from ray.serve._private.common import ReplicaState
from ray.serve.schema import ApplicationStatus

from actors import Generation
from actors.generation import (
    Member,
    create,
    drain,
    members,
    replace_missing,
    stop_instances,
    sweep,
)
from actors.metrics import ActorMetricsHub
from deployments.logs import log_like_serve, serve_logging_config
from orchestrator.config import Settings
from orchestrator.observability import MetricsPusher, MetricsRecorder, flush_buffered_logs
from orchestrator.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

# How often the replica makes sure every member of its generation exists.
KEEP_S = 2.0
# What an application's deletion gives its inference instances to stop.
INSTANCE_STOP_S = 10.0
# What Serve grants `__del__` beyond the drain itself (killing, inference instances).
SHUTDOWN_MARGIN_S = INSTANCE_STOP_S + 10.0
# How long a starting generation waits for the ingress to serve before it starts anyway.
INGRESS_FIRST_S = 20.0
INGRESS_POLL_S = 0.2
# How long the replica waits for its actors' start calls (the application is RUNNING after).
GENERATION_START_S = 60.0


def _ingress_running(app: str, ingress: str) -> bool:
    """Whether a replica of the application's ingress deployment serves (any version)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:  # noqa: BLE001 - unknown: do not hold the generation back
        log.warning("cannot read the status of %s (%r)", app, exc)
        return True
    deployment = status.deployments.get(ingress) if status is not None else None
    return deployment is not None and deployment.replica_states.get(ReplicaState.RUNNING, 0) > 0


async def _after_ingress(app: str, ingress: str, timeout_s: float = INGRESS_FIRST_S) -> None:
    """Until the ingress serves (or `timeout_s`). A start is CPU-bound: the generation's
    actors are nine processes importing Python, and started beside the ingress replicas
    they took the CPU those needed (a restart to /ready: 11 s with them, 8 s after them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_ingress_running, app, ingress):
            return
        await asyncio.sleep(INGRESS_POLL_S)
    log.warning("the ingress %s did not serve in %.0fs: starting the actors", ingress, timeout_s)


def _app_deleting(app: str) -> bool:
    """Whether Serve is deleting `app` (rather than replacing this version of it)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:  # noqa: BLE001 - unknown: keep what outlives generations
        log.warning("cannot read the status of %s (%r)", app, exc)
        return False
    return status is None or status.status == ApplicationStatus.DELETING


@serve.deployment(name="Runtime", num_replicas=1, max_ongoing_requests=16)
class Runtime:
    """Creates the generation when it starts, once the ingress serves; drains and kills it
    when Serve stops it."""

    # Serve awaits an async constructor: the generation runs before the replica is ready
    # (so the application is RUNNING once its actors run), and it starts once the ingress
    # deployment `ingress` serves: the API answers first, the actors come up a second or two
    # later (a workflow created meanwhile waits in Postgres for its shard; docs/runtime.md).
    async def __init__(  # type: ignore[misc]
        self, settings: Settings, generation: Generation, ingress: str
    ) -> None:
        log_like_serve(settings)
        self._settings = settings
        self._generation = generation
        self._members: list[Member] = members(settings, generation)
        log.info("generation %s: starting once %s serves", generation.prefix, ingress)
        flush_buffered_logs()  # Serve buffers a replica's lines until its constructor ends
        await _after_ingress(generation.app, ingress)
        self._handles: dict[str, Any] = await create(
            self._members, started_within_s=GENERATION_START_S
        )
        self._recorder = MetricsRecorder(f"runtime:{socket.gethostname()}:{os.getpid()}")
        self._pusher = MetricsPusher(self._recorder, ActorMetricsHub(generation))
        self._supervisor = Supervisor(
            f"runtime {generation.prefix}", on_restart=self._recorder.background_restart
        )
        self._supervisor.spawn("keep-generation", self._keep)
        log.info("generation %s: %d actors", generation.prefix, len(self._handles))

    def __repr__(self) -> str:
        return f"Runtime({self._generation.prefix}, actors={len(self._handles)})"

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(KEEP_S)
            await replace_missing(self._generation, self._members, self._handles)
            flush_buffered_logs()  # Serve buffers this replica's log lines
            with contextlib.suppress(Exception):  # the Metrics actor may be restarting
                await self._pusher.flush()

    async def describe(self) -> dict[str, Any]:
        return {
            "app": self._generation.app,
            "version": self._generation.version,
            "actors": sorted(self._handles),
        }

    async def __del__(self) -> None:
        """Serve stops this replica: drain and kill the generation; when the application is
        being deleted, also stop its inference instances (they outlive redeploys)."""
        await self._supervisor.aclose()
        deleting = await asyncio.to_thread(_app_deleting, self._generation.app)
        await drain(self._members, self._handles, self._settings.generation_drain_s)
        if deleting:
            app = self._generation.app
            await stop_instances(app, "application deleted", INSTANCE_STOP_S)
            killed = await asyncio.to_thread(sweep, app)
            log.info("application %s deleted: killed %s", self._generation.app, killed)
        log.info("generation %s drained and killed", self._generation.prefix)


def runtime_deployment(settings: Settings) -> Any:
    """The Runtime deployment with Serve's stop budget covering the drain."""
    return Runtime.options(  # type: ignore[attr-defined]
        ray_actor_options={"num_cpus": 0},
        logging_config=serve_logging_config(settings),
        graceful_shutdown_timeout_s=settings.generation_drain_s + SHUTDOWN_MARGIN_S,
        # Stopped before its successor starts (Serve's default, said here because the
        # successor of the same version must find the names free).
        max_surge_percent=0,
    )
